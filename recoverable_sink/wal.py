"""The executor-local write-ahead log: one LMDB environment per ``wal.path``, shared by the Python workers
of the executors on a host (LMDB serialises their write transactions across processes).

Layout (one key space, prefix-scanned; ``A`` is an attempt's path ``<write id>/<partition>/<attempt key>``):

    m/A            attempt metadata (JSON): write id, partition, attempt number, host, created time
    s/A/<seq>      a segment: the Arrow IPC bytes of one batch of records, first position <seq>, with a CRC32
    a/A/<seq>      that segment's acknowledgement bitmap (one byte per record), with a CRC32
    u              bytes held by all segments, the quantity ``wal.maxBytes`` bounds

Every append is one transaction committed with fsync (``sync=True``) and carries the acknowledgement
bitmaps that changed since the previous one, so what Kafka acknowledged is durable with every batch.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import struct
import time
import uuid
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field

import lmdb
import pyarrow as pa

from recoverable_sink._logging import get_logger
from recoverable_sink.errors import WalCorruptionError, WalError, WalFullError

log = get_logger("wal")

_MAP_SIZE = 1 << 40  # virtual address space only: LMDB grows the file as data is written
_SEG_MAGIC = b"RKW1"
_ACK_MAGIC = b"RKA1"
_SEG_HEADER = struct.Struct("<4sIIQ")  # magic, crc32 of the rest, record count, first position
_ACK_HEADER = struct.Struct("<4sII")  # magic, crc32 of the bitmap, record count
_USAGE_KEY = b"u"

_envs: dict[str, lmdb.Environment] = {}


@dataclass(frozen=True)
class Segment:
    """A decoded WAL segment: records at positions [first, first + batch.num_rows)."""

    first: int
    batch: pa.RecordBatch
    acked: bytearray

    @property
    def end(self) -> int:
        return self.first + self.batch.num_rows


@dataclass
class AttemptInfo:
    """An attempt's metadata as stored under ``m/``."""

    key: str
    write_id: str
    partition: int
    attempt: int
    host: str
    created: float
    extra: dict[str, object] = field(default_factory=dict)


def _encode_segment(first: int, batch: pa.RecordBatch) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    payload = sink.getvalue()
    crc = zlib.crc32(struct.pack("<IQ", batch.num_rows, first))
    crc = zlib.crc32(payload, crc)
    return b"".join((_SEG_HEADER.pack(_SEG_MAGIC, crc, batch.num_rows, first), payload))


def _encode_acks(acked: bytearray) -> bytes:
    return _ACK_HEADER.pack(_ACK_MAGIC, zlib.crc32(acked), len(acked)) + bytes(acked)


class Wal:
    """The write-ahead log in one directory. Obtain it with :func:`open_wal`."""

    def __init__(self, path: str, env: lmdb.Environment) -> None:
        self.path = path
        self.env = env

    # ---- attempts -------------------------------------------------------------------------------------
    def begin_attempt(self, write_id: str, partition: int, attempt: int, extra: dict[str, object]) -> str:
        """Register a new attempt and return its path ``<write id>/<partition>/<attempt key>``.

        The attempt key starts with the creation time so a prefix scan lists attempts oldest first, and
        ends with a random part so a restarted application cannot collide with an old log."""
        created = time.time()
        key = f"{write_id}/{partition:06d}/{time.time_ns():020d}-{attempt:03d}-{uuid.uuid4().hex[:8]}"
        meta = {"write_id": write_id, "partition": partition, "attempt": attempt, "host": socket.gethostname(),
                "created": created, **extra}
        self._write(lambda txn: txn.put(b"m/" + key.encode(), json.dumps(meta).encode()))
        return key

    def attempts(self, prefix: str = "") -> list[AttemptInfo]:
        """Attempts whose path starts with ``prefix`` (``"<write id>/"``, ``"<write id>/<partition>/"``)."""
        found: list[AttemptInfo] = []
        start = b"m/" + prefix.encode()
        with self.env.begin() as txn:
            cursor = txn.cursor()
            if not cursor.set_range(start):
                return found
            for k, v in cursor:
                if not k.startswith(start):
                    break
                try:
                    meta = json.loads(v)
                except ValueError:
                    raise WalCorruptionError(
                        f"WAL {self.path}: metadata entry {k.decode(errors='replace')} is not valid JSON; "
                        "inspect it with `recoverable-kafka-wal list`, then purge that attempt"
                    ) from None
                found.append(AttemptInfo(
                    key=k[2:].decode(), write_id=meta.pop("write_id"), partition=meta.pop("partition"),
                    attempt=meta.pop("attempt"), host=meta.pop("host"), created=meta.pop("created"), extra=meta))
        return found

    def prior_attempts(self, write_id: str, partition: int) -> list[AttemptInfo]:
        """Every attempt of this write's partition logged here, oldest first (asked before a new one begins)."""
        return self.attempts(f"{write_id}/{partition:06d}/")

    # ---- writing --------------------------------------------------------------------------------------
    def append(self, attempt_key: str, first: int, batch: pa.RecordBatch, max_bytes: int,
               acks: dict[int, bytearray]) -> int:
        """Durably store one batch at positions [first, first + n) together with the acknowledgement bitmaps
        in ``acks`` (segment first position -> bitmap). Returns the segment's size in bytes.

        Raises WalFullError, leaving the WAL as it was, when the segment would take the WAL past
        ``max_bytes``."""
        value = _encode_segment(first, batch)
        prefix = attempt_key.encode()

        def txn_body(txn: lmdb.Transaction) -> None:
            used = int(txn.get(_USAGE_KEY) or b"0")
            if used + len(value) > max_bytes:
                raise WalFullError(
                    f"WAL {self.path} holds {used} bytes and the next batch of {batch.num_rows} records "
                    f"({len(value)} bytes) would pass wal.maxBytes={max_bytes}; nothing was dropped: the records "
                    "accepted so far stay in the WAL until Kafka acknowledges them. Raise wal.maxBytes, free the "
                    "WAL of failed writes (`recoverable-kafka-wal list`), or write fewer records per partition"
                )
            txn.put(b"s/%s/%012d" % (prefix, first), value)
            txn.put(b"a/%s/%012d" % (prefix, first), _encode_acks(bytearray(batch.num_rows)))
            for seg_first, bitmap in acks.items():
                txn.put(b"a/%s/%012d" % (prefix, seg_first), _encode_acks(bitmap))
            txn.put(_USAGE_KEY, str(used + len(value)).encode())

        self._write(txn_body)
        return len(value)

    def save_acks(self, attempt_key: str, acks: dict[int, bytearray]) -> None:
        """Durably store acknowledgement bitmaps (segment first position -> bitmap)."""
        if not acks:
            return
        prefix = attempt_key.encode()

        def txn_body(txn: lmdb.Transaction) -> None:
            for seg_first, bitmap in acks.items():
                txn.put(b"a/%s/%012d" % (prefix, seg_first), _encode_acks(bitmap))

        self._write(txn_body)

    def purge(self, attempt_keys: list[str]) -> int:
        """Delete attempts (metadata, segments, bitmaps) in one transaction; returns the bytes freed."""
        if not attempt_keys:
            return 0
        freed = 0

        def txn_body(txn: lmdb.Transaction) -> None:
            nonlocal freed
            freed = 0
            cursor = txn.cursor()
            for key in attempt_keys:
                txn.delete(b"m/" + key.encode())
                for kind in (b"s/", b"a/"):
                    start = kind + key.encode() + b"/"
                    if not cursor.set_range(start):
                        continue
                    while cursor.key().startswith(start):
                        if kind == b"s/":
                            freed += len(cursor.value())
                        if not cursor.delete():
                            break
            used = int(txn.get(_USAGE_KEY) or b"0")
            txn.put(_USAGE_KEY, str(max(0, used - freed)).encode())

        self._write(txn_body)
        return freed

    def used_bytes(self) -> int:
        with self.env.begin() as txn:
            return int(txn.get(_USAGE_KEY) or b"0")

    # ---- reading --------------------------------------------------------------------------------------
    def segments(self, attempt_key: str) -> Iterator[Segment]:
        """Decode an attempt's segments in position order, checking every checksum."""
        start = b"s/" + attempt_key.encode() + b"/"
        with self.env.begin() as txn:
            keys = []
            cursor = txn.cursor()
            if cursor.set_range(start):
                for k in cursor.iternext(keys=True, values=False):
                    if not k.startswith(start):
                        break
                    keys.append(k)
        for k in keys:
            with self.env.begin() as txn:
                value = txn.get(k)
                ack_value = txn.get(b"a/" + k[2:])
            if value is None:
                continue
            yield self._decode(k.decode(), value, ack_value)

    def _decode(self, key: str, value: bytes, ack_value: bytes | None) -> Segment:
        where = f"WAL {self.path}, entry {key}"
        if len(value) < _SEG_HEADER.size:
            raise WalCorruptionError(f"{where}: truncated segment ({len(value)} bytes); it will not be replayed. "
                                     "Recover its records from the source and purge the attempt")
        magic, crc, count, first = _SEG_HEADER.unpack_from(value)
        payload = memoryview(value)[_SEG_HEADER.size:]
        if magic != _SEG_MAGIC or zlib.crc32(payload, zlib.crc32(struct.pack("<IQ", count, first))) != crc:
            raise WalCorruptionError(
                f"{where}: records {first}..{first + count - 1} fail their CRC32 checksum; they will not be "
                "replayed or skipped blindly. Re-run the write from its source after purging this attempt "
                "(`recoverable-kafka-wal purge`)"
            )
        try:
            batch = pa.ipc.open_stream(pa.py_buffer(payload)).read_next_batch()
        except (pa.ArrowInvalid, StopIteration) as exc:
            raise WalCorruptionError(f"{where}: records {first}..{first + count - 1} cannot be decoded: {exc}") \
                from None
        acked = bytearray(count)
        if ack_value is not None:
            amagic, acrc, acount = _ACK_HEADER.unpack_from(ack_value)
            bitmap = ack_value[_ACK_HEADER.size:]
            if amagic != _ACK_MAGIC or acount != count or zlib.crc32(bitmap) != acrc:
                raise WalCorruptionError(
                    f"{where}: the acknowledgement bitmap of records {first}..{first + count - 1} fails its "
                    "checksum; which of them Kafka acknowledged is unknown, so none is skipped or re-sent blindly"
                )
            acked = bytearray(bitmap)
        return Segment(first=first, batch=batch, acked=acked)

    # ---- plumbing -------------------------------------------------------------------------------------
    def _write(self, body: object) -> None:
        try:
            with self.env.begin(write=True) as txn:
                body(txn)  # type: ignore[operator]
        except lmdb.Error as exc:
            raise _wal_error(self.path, exc) from None


def _disk_nearly_full(path: str) -> bool:
    try:
        fs = os.statvfs(path)
    except OSError:
        return False
    return fs.f_bavail * fs.f_frsize < 4 << 20


def _wal_error(path: str, exc: BaseException) -> WalError:
    text = str(exc)
    # A full disk reaches LMDB as ENOSPC or, on some filesystems (tmpfs), as EIO from the commit: ask the
    # filesystem rather than trust the error text.
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC or "No space left" in text or _disk_nearly_full(path):
        return WalError(f"WAL {path}: the disk is full ({text}); free space under wal.path or point wal.path "
                        "at a larger disk. Records accepted so far stay in the WAL")
    if isinstance(exc, lmdb.CorruptedError | lmdb.InvalidError | lmdb.PageNotFoundError | lmdb.BadValsizeError):
        return WalCorruptionError(f"WAL {path}: the LMDB files are damaged ({text}); nothing in them is replayed "
                                  "blindly. Move the directory aside and re-run the write from its source")
    return WalError(f"WAL {path}: {text}")


def _check_not_truncated(path: str, env: lmdb.Environment) -> None:
    """A data file shorter than the pages LMDB's meta page says are in use was truncated (a copy cut short, a
    full disk); reading it through the memory map would kill the process with SIGBUS, so refuse it here."""
    needed = (env.info()["last_pgno"] + 1) * env.stat()["psize"]
    size = os.path.getsize(os.path.join(path, "data.mdb"))
    if size < needed:
        env.close()
        raise WalCorruptionError(
            f"WAL {path}: data.mdb is truncated ({size} bytes, the log needs {needed}); nothing in it is "
            "replayed or skipped blindly. Move the directory aside and re-run the write from its source"
        )


def open_wal(path: str) -> Wal:
    """Open (once per process) the WAL under ``path``, creating it with owner-only permissions."""
    path = os.path.abspath(path)
    if path in _envs:
        return Wal(path, _envs[path])
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        os.chmod(path, 0o700)
    except OSError as exc:
        raise WalError(
            f"wal.path={path} cannot be created or used by user {os.getuid()} on {socket.gethostname()}: "
            f"{exc.strerror}; point wal.path at a writable executor-local directory"
        ) from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise WalError(f"wal.path={path} is not writable by user {os.getuid()} on {socket.gethostname()}; "
                       "point wal.path at a writable executor-local directory")
    try:
        env = lmdb.open(path, map_size=_MAP_SIZE, subdir=True, sync=True, metasync=True, lock=True,
                        mode=0o600, max_readers=512, readahead=False)
    except lmdb.Error as exc:
        raise _wal_error(path, exc) from None
    for name in ("data.mdb", "lock.mdb"):
        file = os.path.join(path, name)
        if os.path.exists(file):
            os.chmod(file, 0o600)
    _check_not_truncated(path, env)
    _envs[path] = env
    return Wal(path, env)
