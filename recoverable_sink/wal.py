"""The executor-local write-ahead log: one LMDB environment per ``wal.path``, shared by the Python workers
of the executors on a host (LMDB serialises their write transactions across processes).

Layout (one key space, prefix-scanned; ``A`` is an attempt's path ``<write id>/<partition>/<attempt key>``):

    m/A            attempt metadata (JSON): write id, partition, attempt, host, created, cluster id, topic,
                   and its state: ``open`` -> ``logged`` (the whole partition is in the log) -> ``done``
    s/A/<seq>      a segment: the digests of a batch's records, then (until Kafka acknowledged all of them)
                   their Arrow IPC bytes; a CRC32 covers both
    a/A/<seq>      that segment's acknowledgement bitmap (one byte per record), with a CRC32
    u              bytes of payload held by all segments: the quantity ``wal.maxBytes`` bounds

Every append is one transaction committed with fsync (``sync=True``) and carries the acknowledgement
bitmaps that changed since the previous one. A segment whose records are all acknowledged is rewritten as
its digests alone: the WAL holds payload only for what Kafka has not acknowledged, and keeps the digests as
proof of delivery until the write is certainly committed (see :meth:`Wal.sweep`).
"""

from __future__ import annotations

import errno
import functools
import json
import os
import resource
import socket
import struct
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import NamedTuple

import lmdb
import pyarrow as pa

try:  # the same CRC32 as zlib's, three times as fast (carry-less multiplication): 8 against 26 ms per 100 MB
    from zlib_ng.zlib_ng import crc32
except ImportError:  # a spark-submit --py-files deployment without the wheel
    from zlib import crc32

from recoverable_sink._logging import get_logger
from recoverable_sink.errors import WalCorruptionError, WalError, WalFullError
from recoverable_sink.identity import DIGEST_SIZE, DeliveredSet

log = get_logger("wal")

_MAX_MAP_SIZE = 1 << 40  # virtual address space only: LMDB grows the file as data is written
_MIN_MAP_SIZE = 64 << 20
_SEG_MAGIC = b"RKW2"
_ACK_MAGIC = b"RKA1"
# magic, crc32 of the rest, record count, first position, payload length, flags
_SEG_HEADER = struct.Struct("<4sIIQQI")
_ACK_HEADER = struct.Struct("<4sII")  # magic, crc32 of the bitmap, record count
_ALL_ACKED = 1  # segment flag: digests only; every record in it was acknowledged
_USAGE_KEY = b"u"
_MAX_ENVS = 16

OPEN, LOGGED, DONE = "open", "logged", "done"

_envs: dict[str, lmdb.Environment] = {}
_env_files: dict[str, tuple[int, int] | None] = {}  # (device, inode) of each open environment's data.mdb
_gates: dict[str, _Gate] = {}
_envs_lock = threading.Lock()


class _Gate:
    """This process's transactions on one environment, and the rare change of its map size, which LMDB allows
    only with no transaction open in the process (it remaps in place: another thread's reader would be left
    holding pointers into the old map). Transactions are short and never nested in one thread."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._active = 0
        self._resizing = False

    @contextmanager
    def txn(self) -> Iterator[None]:
        with self._cond:
            while self._resizing:
                self._cond.wait()
            self._active += 1
        try:
            yield
        finally:
            with self._cond:
                self._active -= 1
                self._cond.notify_all()

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._cond:
            while self._resizing:
                self._cond.wait()
            self._resizing = True
            while self._active:
                self._cond.wait()
        try:
            yield
        finally:
            with self._cond:
                self._resizing = False
                self._cond.notify_all()


@dataclass(frozen=True)
class Segment:
    """A decoded WAL segment: ``count`` records logged at positions [first, first + count) of an attempt."""

    first: int
    count: int
    digests: bytes
    acked: bytearray  # one byte per record
    batch: pa.RecordBatch | None  # None once every record was acknowledged (payload dropped)

    @property
    def end(self) -> int:
        return self.first + self.count


@dataclass
class AttemptInfo:
    """An attempt's metadata as stored under ``m/``."""

    key: str
    write_id: str
    partition: int
    attempt: int
    host: str
    created: float
    state: str = OPEN
    extra: dict[str, object] = field(default_factory=dict)


class SweepResult(NamedTuple):
    removed: int  # attempts that held only proof of delivery
    kept: int  # old attempts kept: not finished, or holding records Kafka never acknowledged


@dataclass(frozen=True)
class WalStats:
    """What ``Wal.stats`` finds: payload bytes by the usage counter and by a scan, and orphaned entries."""

    used_bytes: int
    payload_bytes: int
    attempts: int
    orphaned_entries: int


def _encode_segment(first: int, digests: bytes, payload: bytes, flags: int) -> bytes:
    count = len(digests) // DIGEST_SIZE
    crc = crc32(struct.pack("<IQQI", count, first, len(payload), flags))
    crc = crc32(payload, crc32(digests, crc))
    return b"".join((_SEG_HEADER.pack(_SEG_MAGIC, crc, count, first, len(payload), flags), digests, payload))


def _write_ipc(out: pa.NativeFile, batch: pa.RecordBatch) -> None:
    with pa.ipc.new_stream(out, batch.schema) as writer:
        writer.write_batch(batch)


def _segment_value(first: int, digests: bytes, batch: pa.RecordBatch) -> tuple[pa.Buffer, int]:
    """The bytes ``_encode_segment(first, digests, <batch's Arrow IPC stream>, 0)`` would give, and the IPC
    stream's length, built in one buffer: the batch is serialised straight into place (its length measured
    first by a counting stream, which copies nothing) and checksummed there. Building the stream, then the
    segment around it, then Python bytes of each, copied every payload byte three more times (with 1 KB
    values, those copies and a second checksum at compaction were over half of an append)."""
    counter = pa.MockOutputStream()
    _write_ipc(counter, batch)
    payload_len = counter.size()
    head = _SEG_HEADER.size + len(digests)  # a multiple of 8, so Arrow pads the stream as it did when counted
    value = pa.allocate_buffer(head + payload_len)
    out = pa.FixedSizeBufferWriter(value)
    out.write(bytes(_SEG_HEADER.size))  # filled in below, once the checksum is known
    out.write(digests)
    _write_ipc(out, batch)
    if out.tell() != head + payload_len:
        raise WalError(f"Arrow wrote {out.tell() - head} bytes of IPC stream after counting {payload_len}")
    view = memoryview(value)
    count = len(digests) // DIGEST_SIZE
    crc = crc32(view[_SEG_HEADER.size:], crc32(struct.pack("<IQQI", count, first, payload_len, 0)))
    _SEG_HEADER.pack_into(view, 0, _SEG_MAGIC, crc, count, first, payload_len, 0)
    return value, payload_len


def _encode_acks(acked: bytes | bytearray) -> bytes:
    return _ACK_HEADER.pack(_ACK_MAGIC, crc32(acked), len(acked)) + bytes(acked)


def _payload_len(value: bytes) -> int:
    return _SEG_HEADER.unpack_from(value)[4] if len(value) >= _SEG_HEADER.size else 0


class Wal:
    """The write-ahead log in one directory. Obtain it with :func:`open_wal`."""

    def __init__(self, path: str, env: lmdb.Environment, gate: _Gate | None = None) -> None:
        self.path = path
        self.env = env
        self._gate = gate if gate is not None else _Gate()
        # Segments this handle appended whose payload is still stored: segment key -> (digests, payload
        # length). Compacting one of them needs neither to read back its payload nor to checksum it again.
        self._appended: dict[bytes, tuple[bytes, int]] = {}

    # ---- attempts -------------------------------------------------------------------------------------
    def begin_attempt(self, write_id: str, partition: int, attempt: int, extra: dict[str, object]) -> str:
        """Register a new attempt and return its path ``<write id>/<partition>/<attempt key>``.

        The attempt key starts with the creation time so a prefix scan lists attempts oldest first, and
        ends with a random part so a restarted application cannot collide with an old log."""
        created = time.time()
        key = f"{write_id}/{partition:06d}/{time.time_ns():020d}-{attempt:03d}-{uuid.uuid4().hex[:8]}"
        meta = {**extra, "write_id": write_id, "partition": partition, "attempt": attempt,
                "host": socket.gethostname(), "created": created, "state": OPEN, "owner": _this_process()}
        self._write(lambda txn: txn.put(b"m/" + key.encode(), json.dumps(meta).encode()))
        return key

    def attempts(self, prefix: str = "") -> list[AttemptInfo]:
        """Attempts whose path starts with ``prefix`` (``"<write id>/"``, ``"<write id>/<partition>/"``)."""
        found: list[AttemptInfo] = []
        start = b"m/" + prefix.encode()
        with self._read() as txn:
            cursor = txn.cursor()
            if not cursor.set_range(start):
                return found
            for k, v in cursor:
                if not k.startswith(start):
                    break
                found.append(self._attempt(k, v))
        return found

    def _attempt(self, k: bytes, v: bytes) -> AttemptInfo:
        try:
            meta = json.loads(v)
            return AttemptInfo(key=k[2:].decode(), write_id=meta.pop("write_id"), partition=meta.pop("partition"),
                               attempt=meta.pop("attempt"), host=meta.pop("host"), created=meta.pop("created"),
                               state=meta.pop("state", OPEN), extra=meta)
        except (ValueError, KeyError):
            raise WalCorruptionError(
                f"WAL {self.path}: metadata entry {k.decode(errors='replace')} is not valid; inspect it with "
                "`recoverable-kafka-wal list`, then purge that attempt"
            ) from None

    def delivered(self, attempts: list[AttemptInfo], all_acknowledged: bool = False) -> DeliveredSet:
        """What these attempts logged, and which of it Kafka acknowledged, as a multiset of record digests.
        Digests include the cluster id and topic, so attempts towards another destination never match.
        ``all_acknowledged``: every logged record counts (attempts whose Kafka transaction committed)."""
        delivered = DeliveredSet()
        for attempt in attempts:
            for seg in self.segments(attempt.key, payload=False):
                delivered.add(seg.digests, None if all_acknowledged else seg.acked)
        return delivered

    def prior_attempts(self, write_id: str, partition: int) -> list[AttemptInfo]:
        """Every attempt of this write's partition logged here, oldest first (asked before a new one begins)."""
        return self.attempts(f"{write_id}/{partition:06d}/")

    def set_state(self, attempt_key: str, state: str, acks: dict[int, bytearray] | None = None) -> None:
        """Move an attempt to ``logged`` or ``done``, with the acknowledgement bitmaps that changed."""
        def body(txn: lmdb.Transaction) -> None:
            self._put_acks(txn, attempt_key, acks or {})
            self._set_state(txn, attempt_key, state)

        self._write(body)
        self._forget_compacted(attempt_key, acks or {})

    def _require_attempt(self, txn: lmdb.Transaction, attempt_key: str) -> bytes:
        raw = txn.get(b"m/" + attempt_key.encode())
        if raw is None:
            raise WalError(f"WAL {self.path}: attempt {attempt_key} is no longer in the log (purged while it ran?); "
                           "this attempt stops before sending anything more, and its retry starts afresh")
        return raw

    def _set_state(self, txn: lmdb.Transaction, attempt_key: str, state: str) -> None:
        meta = json.loads(self._require_attempt(txn, attempt_key))
        meta["state"] = state
        txn.put(b"m/" + attempt_key.encode(), json.dumps(meta).encode())

    # ---- writing --------------------------------------------------------------------------------------
    def append(self, attempt_key: str, first: int, batch: pa.RecordBatch, digests: bytes, max_bytes: int,
               acks: dict[int, bytearray]) -> int:
        """Durably store one batch at positions [first, first + n), its records' digests, and the
        acknowledgement bitmaps in ``acks`` (segment first position -> bitmap). Returns the payload's size.

        Raises WalFullError, leaving the WAL as it was, when the payload would take the WAL past
        ``max_bytes`` (payload of records Kafka has not acknowledged)."""
        value, payload_len = _segment_value(first, digests, batch)
        prefix = attempt_key.encode()
        seg_key = b"s/%s/%012d" % (prefix, first)
        _check_room(self.path, value.size)

        def body(txn: lmdb.Transaction) -> None:
            self._require_attempt(txn, attempt_key)  # nothing of an attempt that is gone may enter the log
            self._put_acks(txn, attempt_key, acks)  # may free bytes: fully acknowledged segments drop payload
            used = int(txn.get(_USAGE_KEY) or b"0")
            if used + payload_len > max_bytes:
                raise WalFullError(
                    f"WAL {self.path} holds {used} bytes not yet acknowledged by Kafka and the next batch of "
                    f"{batch.num_rows} records ({payload_len} bytes) would pass wal.maxBytes={max_bytes}; nothing "
                    "was dropped: the records accepted so far stay in the WAL until Kafka acknowledges them. Raise "
                    "wal.maxBytes, free the WAL of failed writes (`recoverable-kafka-wal list`), or use smaller "
                    "Arrow batches (spark.sql.execution.arrow.maxRecordsPerBatch)"
                )
            txn.put(seg_key, value)
            txn.put(b"a/%s/%012d" % (prefix, first), _encode_acks(bytearray(batch.num_rows)))
            txn.put(_USAGE_KEY, str(used + payload_len).encode())

        self._write(body)
        self._appended[seg_key] = (digests, payload_len)
        self._forget_compacted(attempt_key, acks)
        return payload_len

    def save_acks(self, attempt_key: str, acks: dict[int, bytearray]) -> None:
        """Durably store acknowledgement bitmaps (segment first position -> bitmap)."""
        if acks:
            def body(txn: lmdb.Transaction) -> None:
                self._require_attempt(txn, attempt_key)
                self._put_acks(txn, attempt_key, acks)

            self._write(body)
            self._forget_compacted(attempt_key, acks)

    def _put_acks(self, txn: lmdb.Transaction, attempt_key: str, acks: dict[int, bytearray]) -> None:
        prefix = attempt_key.encode()
        freed = 0
        for seg_first, bitmap in acks.items():
            ack_key = b"a/%s/%012d" % (prefix, seg_first)
            if 0 not in bitmap:
                freed += self._compact(txn, b"s/%s/%012d" % (prefix, seg_first), bitmap)
                txn.delete(ack_key)
            else:
                txn.put(ack_key, _encode_acks(bitmap))
        if freed:
            used = int(txn.get(_USAGE_KEY) or b"0")
            txn.put(_USAGE_KEY, str(max(0, used - freed)).encode())

    def _forget_compacted(self, attempt_key: str, acks: dict[int, bytearray]) -> None:
        """After the commit: segments just rewritten as digests are no longer this handle's to compact."""
        prefix = attempt_key.encode()
        for seg_first, bitmap in acks.items():
            if 0 not in bitmap:
                self._appended.pop(b"s/%s/%012d" % (prefix, seg_first), None)

    def _compact(self, txn: lmdb.Transaction, seg_key: bytes, acked: bytes | bytearray) -> int:
        """Rewrite a segment as the digests of its acknowledged records alone; returns the payload bytes freed."""
        known = self._appended.get(seg_key)
        if known is not None and 0 not in acked:
            # Appended by this handle, so its digests and size are known: only check that it is still there (a
            # cursor finds the key without copying the value out of the map).
            digests, payload_len = known
            if not txn.cursor().set_key(seg_key):
                return 0
            txn.put(seg_key, _encode_segment(int(seg_key.rsplit(b"/", 1)[1]), digests, b"", _ALL_ACKED))
            return payload_len
        value = txn.get(seg_key)
        if value is None:
            return 0
        seg = self._decode(seg_key.decode(), value, None, payload=False)
        if 0 not in acked:
            kept = seg.digests
        else:
            kept = b"".join(seg.digests[i * DIGEST_SIZE:(i + 1) * DIGEST_SIZE] for i in range(seg.count) if acked[i])
        txn.put(seg_key, _encode_segment(seg.first, kept, b"", _ALL_ACKED))
        return _payload_len(value)

    def finish(self, attempt_key: str, superseded: list[str], dropped: list[str] | None = None) -> None:
        """A successful attempt: mark it done; drop what the attempts it superseded still hold beyond the
        digests of records Kafka acknowledged to them (its own records were all acknowledged), and delete the
        ``dropped`` attempts altogether, in the same transaction."""
        def body(txn: lmdb.Transaction) -> None:
            freed = self._delete(txn, dropped or [])
            for key in superseded:
                for seg_key, ack_key, value in self._segment_entries(txn, key):
                    if _SEG_HEADER.unpack_from(value)[5] & _ALL_ACKED:
                        continue
                    ack_value = txn.get(ack_key)
                    seg = self._decode(seg_key.decode(), value, ack_value, payload=False)
                    freed += self._compact(txn, seg_key, seg.acked)
                    txn.delete(ack_key)
                if txn.get(b"m/" + key.encode()) is not None:
                    self._set_state(txn, key, DONE)
            self._set_state(txn, attempt_key, DONE)
            if freed:
                used = int(txn.get(_USAGE_KEY) or b"0")
                txn.put(_USAGE_KEY, str(max(0, used - freed)).encode())

        self._write(body)

    def purge(self, attempt_keys: list[str]) -> int:
        """Delete attempts (metadata, segments, bitmaps) in one transaction; returns the payload bytes freed."""
        if not attempt_keys:
            return 0
        freed = 0

        def body(txn: lmdb.Transaction) -> None:
            nonlocal freed
            freed = self._delete(txn, attempt_keys)
            used = int(txn.get(_USAGE_KEY) or b"0")
            txn.put(_USAGE_KEY, str(max(0, used - freed)).encode())

        self._write(body)
        return freed

    def _delete(self, txn: lmdb.Transaction, attempt_keys: list[str]) -> int:
        """Delete attempts' metadata, segments and bitmaps; returns the payload bytes freed (the caller
        updates the usage counter)."""
        freed = 0
        for key in attempt_keys:
            txn.delete(b"m/" + key.encode())
            for seg_key, ack_key, value in self._segment_entries(txn, key):
                freed += _payload_len(value)
                txn.delete(seg_key)
                txn.delete(ack_key)
        return freed

    def sweep(self, retention_s: float, now: float | None = None) -> SweepResult:
        """Remove attempts older than ``retention_s`` that hold no unacknowledged record (proof of delivery
        only) and are finished, or whose process is known to be gone. One that is not finished while its process
        may still run it is kept (a task can wait longer than the retention for its first batch), and so is one
        holding records Kafka never acknowledged; those are counted and logged."""
        now = time.time() if now is None else now
        old = [a for a in self.attempts() if now - a.created > retention_s]
        if not old:
            return SweepResult(0, 0)
        removable, kept = [], []
        with self._read() as txn:
            for a in old:
                # Not finished: kept while its process may still run it; once that process is gone it is a failed
                # attempt's proof of delivery, kept for the retention like a finished one's.
                unfinished = a.state != DONE and _alive(a.extra.get("owner"))
                holds = unfinished or any(not (_SEG_HEADER.unpack_from(v)[5] & _ALL_ACKED)
                                          for _, _, v in self._segment_entries(txn, a.key))
                (kept if holds else removable).append(a)
        self.purge([a.key for a in removable])
        if removable:
            log.info("WAL %s: removed %d finished attempt log(s) older than wal.retentionHours=%g that held only "
                     "proof of delivery", self.path, len(removable), retention_s / 3600)
        if kept:
            log.warning("WAL %s: %d attempt log(s) older than wal.retentionHours=%g are kept because they are not "
                        "finished (still running, or of a write that failed) or hold records Kafka never "
                        "acknowledged (writes %s): finish a failed write by re-running it with its wal.writeId or "
                        "with `recoverable-kafka-wal replay`, or purge it", self.path, len(kept), retention_s / 3600,
                        sorted({a.write_id for a in kept}))
        return SweepResult(removed=len(removable), kept=len(kept))

    def used_bytes(self) -> int:
        with self._read() as txn:
            return int(txn.get(_USAGE_KEY) or b"0")

    def stats(self) -> WalStats:
        """Recount what the WAL holds by scanning it: the payload bytes (against the usage counter) and the
        segment or bitmap entries whose attempt has no metadata (orphans: never replayed, safe to purge)."""
        attempts: set[bytes] = set()
        payload = orphans = 0
        with self._read() as txn:
            cursor = txn.cursor()
            if cursor.set_range(b"m/"):
                for k in cursor.iternext(keys=True, values=False):
                    if not k.startswith(b"m/"):
                        break
                    attempts.add(k[2:])
            for kind in (b"a/", b"s/"):
                if not cursor.set_range(kind):
                    continue
                for k, v in cursor:
                    if not k.startswith(kind):
                        break
                    if k[2:].rsplit(b"/", 1)[0] not in attempts:
                        orphans += 1
                    elif kind == b"s/":
                        payload += _payload_len(v)
            used = int(txn.get(_USAGE_KEY) or b"0")
        return WalStats(used_bytes=used, payload_bytes=payload, attempts=len(attempts), orphaned_entries=orphans)

    # ---- reading --------------------------------------------------------------------------------------
    def segments(self, attempt_key: str, payload: bool = True) -> Iterator[Segment]:
        """Decode an attempt's segments in position order, checking every checksum; ``payload=False`` skips
        decoding the records (digests and bitmaps only)."""
        start = b"s/" + attempt_key.encode() + b"/"
        with self._read() as txn:
            keys = []
            cursor = txn.cursor()
            if cursor.set_range(start):
                for k in cursor.iternext(keys=True, values=False):
                    if not k.startswith(start):
                        break
                    keys.append(k)
        for k in keys:
            with self._read() as txn:
                value = txn.get(k)
                ack_value = txn.get(b"a/" + k[2:])
                if value is None:
                    continue
                segment = self._decode(k.decode(), value, ack_value, payload)
            yield segment

    def record_count(self, attempt_key: str) -> int:
        """How many records an attempt logged, from the segment headers alone (no payload read, no checksum:
        for progress reports; :meth:`segments` checks every byte)."""
        start = b"s/" + attempt_key.encode() + b"/"
        total = 0
        with self._read() as txn:
            cursor = txn.cursor()
            if cursor.set_range(start):
                for k, v in cursor.iternext():
                    if not k.startswith(start):
                        break
                    if len(v) >= _SEG_HEADER.size:
                        total += _SEG_HEADER.unpack_from(v)[2]
        return total

    def _segment_entries(self, txn: lmdb.Transaction, attempt_key: str) -> list[tuple[bytes, bytes, bytes]]:
        start = b"s/" + attempt_key.encode() + b"/"
        cursor = txn.cursor()
        found = []
        if cursor.set_range(start):
            for k, v in cursor:
                if not k.startswith(start):
                    break
                found.append((k, b"a/" + k[2:], bytes(v)))
        return found

    def _decode(self, key: str, value: bytes, ack_value: bytes | None, payload: bool) -> Segment:
        where = f"WAL {self.path}, entry {key}"
        if len(value) < _SEG_HEADER.size:
            raise WalCorruptionError(f"{where}: truncated segment ({len(value)} bytes); it will not be replayed. "
                                     "Recover its records from the source and purge the attempt")
        magic, crc, count, first, payload_len, flags = _SEG_HEADER.unpack_from(value)
        body = memoryview(value)[_SEG_HEADER.size:]
        digests_len = count * DIGEST_SIZE
        if magic != _SEG_MAGIC or len(body) != digests_len + payload_len or crc32(
                body, crc32(struct.pack("<IQQI", count, first, payload_len, flags))) != crc:
            raise WalCorruptionError(
                f"{where}: records {first}..{first + count - 1} fail their CRC32 checksum; they will not be "
                "replayed or skipped blindly. Re-run the write from its source after purging this attempt "
                "(`recoverable-kafka-wal purge`)"
            )
        digests = bytes(body[:digests_len])
        if flags & _ALL_ACKED:
            return Segment(first=first, count=count, digests=digests, acked=bytearray(b"\x01" * count), batch=None)
        batch = None
        if payload:
            try:
                batch = pa.ipc.open_stream(pa.py_buffer(body[digests_len:])).read_next_batch()
            except (pa.ArrowInvalid, StopIteration) as exc:
                raise WalCorruptionError(f"{where}: records {first}..{first + count - 1} cannot be decoded: "
                                         f"{exc}") from None
        acked = bytearray(count)
        if ack_value is not None:
            amagic, acrc, acount = _ACK_HEADER.unpack_from(ack_value)
            bitmap = ack_value[_ACK_HEADER.size:]
            if amagic != _ACK_MAGIC or acount != count or crc32(bitmap) != acrc:
                raise WalCorruptionError(
                    f"{where}: the acknowledgement bitmap of records {first}..{first + count - 1} fails its "
                    "checksum; which of them Kafka acknowledged is unknown, so none is skipped or re-sent blindly"
                )
            acked = bytearray(bitmap)
        return Segment(first=first, count=count, digests=digests, acked=acked, batch=batch)

    # ---- plumbing -------------------------------------------------------------------------------------
    def _write(self, body: Callable[[lmdb.Transaction], None]) -> None:
        """Run ``body`` in one write transaction; a full map is grown (up to :func:`map_size`) and the body run
        again from scratch (the aborted transaction left nothing), so bodies must only touch the transaction."""
        while True:
            try:
                with self._gate.txn(), self.env.begin(write=True) as txn:
                    body(txn)
                return
            except lmdb.MapFullError as exc:
                if not self._grow():
                    raise _wal_error(self.path, exc) from None
            except lmdb.MapResizedError:
                self._adopt_size()
            except lmdb.Error as exc:
                raise _wal_error(self.path, exc) from None

    @contextmanager
    def _read(self) -> Iterator[lmdb.Transaction]:
        while True:
            with self._gate.txn():
                try:
                    txn = self.env.begin()
                except lmdb.MapResizedError:
                    txn = None
                except lmdb.Error as exc:
                    raise _wal_error(self.path, exc) from None
                if txn is not None:
                    with txn:
                        yield txn
                    return
            self._adopt_size()

    def _grow(self) -> bool:
        """Double this process's map, up to the limit; False when it is at the limit already."""
        with self._gate.exclusive():
            current = self.env.info()["map_size"]
            limit = map_size()
            if current >= limit:
                return False
            new = min(limit, current * 2)
            self.env.set_mapsize(new)
        log.info("WAL %s: memory map grown from %d to %d MiB", self.path, current >> 20, new >> 20)
        return True

    def _adopt_size(self) -> None:
        """Another process grew the map past ours (LMDB's MDB_MAP_RESIZED): take its size (set_mapsize(0))."""
        with self._gate.exclusive():
            self.env.set_mapsize(0)


_RESERVE_BYTES = 4 << 20  # left free for the acknowledgement checkpoints (and compactions) after a refusal


def _free_bytes(path: str) -> int | None:
    try:
        fs = os.statvfs(path)
    except OSError:
        return None
    return fs.f_bavail * fs.f_frsize


def _disk_nearly_full(path: str) -> bool:
    free = _free_bytes(path)
    return free is not None and free < _RESERVE_BYTES


def _check_room(path: str, size: int) -> None:
    """Refuse a segment that would leave less than a reserve free on the disk: once the disk is full LMDB can
    commit nothing, not even the acknowledgements Kafka already gave, and a retry would then re-send those."""
    free = _free_bytes(path)
    if free is not None and free < size + _RESERVE_BYTES:
        raise WalError(f"WAL {path}: the disk is full ({free} bytes free; the next batch needs {size} plus "
                       f"{_RESERVE_BYTES} kept free for acknowledgements); free space under wal.path or point "
                       "wal.path at a larger disk. Records accepted so far stay in the WAL")


def map_size() -> int:
    """The largest LMDB map this process grows to: 1 TiB of address space (it costs nothing until written),
    unless the address space is capped, as ``spark.executor.pyspark.memory`` caps each Python worker's
    (RLIMIT_AS, like YARN's virtual-memory check); then a quarter of the cap, leaving the rest to Python, Arrow
    and librdkafka. The map starts small (:func:`_initial_map_size`) and doubles when full."""
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return _MAX_MAP_SIZE
    page = resource.getpagesize()
    return max(_MIN_MAP_SIZE, min(_MAX_MAP_SIZE, soft // 4 // page * page))


def _initial_map_size(path: str) -> int:
    """Twice what the data file holds now, at least 64 MiB, at most :func:`map_size`: under an address-space
    cap the map reserves little until the WAL needs it."""
    try:
        used = os.path.getsize(os.path.join(path, "data.mdb"))
    except OSError:
        used = 0
    page = resource.getpagesize()
    return min(map_size(), max(_MIN_MAP_SIZE, (2 * used + page - 1) // page * page))


def _wal_error(path: str, exc: BaseException) -> WalError:
    text = str(exc)
    if isinstance(exc, lmdb.MapFullError):
        return WalFullError(
            f"WAL {path}: its memory map is full ({map_size() >> 20} MiB, a quarter of this worker's address-space "
            "limit, spark.executor.pyspark.memory); raise that limit, lower wal.maxBytes or wal.retentionHours. "
            "Nothing was dropped: records accepted so far stay in the WAL")
    if isinstance(exc, MemoryError) or "Cannot allocate memory" in text:
        return WalError(
            f"WAL {path}: the {map_size() >> 20} MiB memory map does not fit this process's address space "
            f"({text}); raise spark.executor.pyspark.memory or move older writes' logs aside (a log larger than "
            "the map cannot be opened under the limit)")
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
    """Open (once per process, at most 16 directories at a time) the WAL under ``path``, creating it with
    owner-only permissions."""
    path = os.path.abspath(path)
    with _envs_lock:
        env = _envs.get(path)
        if env is not None:
            if _same_file(path, _env_files[path]):
                return Wal(path, env, _gates[path])
            # The directory was deleted or replaced (by an operator, a cleanup job) while this process held it
            # open: logging on into the old, unlinked file would lose every record with the process. Start
            # over on what is there now; the old handle is left to the tasks that may still hold it.
            log.warning("WAL %s was removed or replaced while open; opening it anew", path)
            del _envs[path]
        try:
            if not os.path.isdir(path):
                os.makedirs(path, mode=0o700, exist_ok=True)  # only what the sink creates is made owner-only
            shared = os.stat(path).st_mode & 0o002
        except OSError as exc:
            raise WalError(
                f"wal.path={path} cannot be created or used by user {os.getuid()} on {socket.gethostname()}: "
                f"{exc.strerror}; point wal.path at a writable executor-local directory"
            ) from None
        if shared:
            # Never chmod a directory the sink did not create (pointed at /tmp, that would strip its sticky,
            # world-writable mode), and never keep a log where anyone may plant or swap files.
            raise WalError(f"wal.path={path} is writable by every user; point wal.path at a directory of its own, "
                           f"e.g. {os.path.join(path, 'recoverable_kafka_wal')} (the sink creates it owner-only)")
        if not os.access(path, os.W_OK | os.X_OK):
            raise WalError(f"wal.path={path} is not writable by user {os.getuid()} on {socket.gethostname()}; "
                           "point wal.path at a writable executor-local directory")
        try:
            env = lmdb.open(path, map_size=_initial_map_size(path), subdir=True, sync=True, metasync=True, lock=True,
                            mode=0o600, max_readers=512, readahead=False)
        except lmdb.Error as exc:
            raise _wal_error(path, exc) from None
        for name in ("data.mdb", "lock.mdb"):
            file = os.path.join(path, name)
            if os.path.exists(file):
                os.chmod(file, 0o600)
        _check_not_truncated(path, env)
        while len(_envs) >= _MAX_ENVS:  # the oldest opened goes first; a task holds its Wal for its duration
            _envs.pop(next(iter(_envs))).close()
        _envs[path] = env
        _env_files[path] = _file_id(path)
        _gates[path] = _Gate()
        return Wal(path, env, _gates[path])


def _file_id(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(os.path.join(path, "data.mdb"))
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _same_file(path: str, opened: tuple[int, int] | None) -> bool:
    return opened is not None and _file_id(path) == opened


def close_wal(path: str) -> None:
    """Close this process's handle on the WAL under ``path``, if open (the files stay)."""
    with _envs_lock:
        env = _envs.pop(os.path.abspath(path), None)
    if env is not None:
        env.close()


def close_wals() -> None:
    """Close every WAL this process has open (tests, a worker shutting down)."""
    with _envs_lock:
        envs = list(_envs.values())
        _envs.clear()
    for env in envs:
        env.close()


# ---- retention ----------------------------------------------------------------------------------------
_SWEEP_EVERY_S = 600.0
_last_sweep: dict[str, float] = {}


def release_committed_batches(wal: Wal, query_id: str, batch_id: int) -> int:
    """Remove the logs of micro-batches of ``query_id`` before ``batch_id``: Spark starts a batch only after
    every earlier one is in the query's commit log, so their proof of delivery is no longer needed (and any
    payload left by a failed attempt was delivered by the attempt that succeeded). Returns attempts removed."""
    stale = [a.key for a in wal.attempts(f"{query_id}-b")
             if a.extra.get("query_id") == query_id and int(str(a.extra.get("batch_id", batch_id))) < batch_id]
    if stale:
        freed = wal.purge(stale)
        log.debug("WAL %s: released %d attempt log(s) of committed micro-batches of query %s (%d payload bytes)",
                 wal.path, len(stale), query_id, freed)
    return len(stale)


@functools.cache
def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip()
    except OSError:
        return ""


def _started(pid: int) -> str | None:
    """A process's start time (clock ticks since boot), which tells it from a later process with its pid."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _this_process() -> dict[str, object]:
    return {"host": socket.gethostname(), "boot": _boot_id(), "pid": os.getpid(), "started": _started(os.getpid())}


def _alive(owner: object) -> bool:
    """Whether the process that began an attempt may still run: yes unless it is known to be gone (same host
    and boot, and no process with its pid and start time). An attempt written before owners were recorded
    counts as gone."""
    if not isinstance(owner, dict):
        return False
    if owner.get("host") != socket.gethostname() or owner.get("boot") != _boot_id() or not owner.get("started"):
        return True  # another host's or boot's process: not knowable from here, so kept
    return _started(int(str(owner.get("pid")))) == owner.get("started")


def sweep_now_and_then(wal: Wal, retention_s: float) -> None:
    """Run :meth:`Wal.sweep` at most every 10 minutes per WAL and process (tasks call this as they start)."""
    now = time.time()
    if now - _last_sweep.get(wal.path, 0.0) < _SWEEP_EVERY_S:
        return
    _last_sweep[wal.path] = now
    wal.sweep(retention_s, now)
