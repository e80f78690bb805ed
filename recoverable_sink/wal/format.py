"""The WAL's bytes: its key layout, the segment and acknowledgement encodings with their CRC32s, the Arrow IPC
payload. Nothing here opens LMDB; the attempt record under ``m/`` is :mod:`.attempt`'s.

Layout (one key space, prefix-scanned; ``A`` is an attempt's path ``<write id>/<partition>/<attempt key>``):

    m/A            the attempt record (versioned JSON, ``"v": 1``; see :mod:`.attempt`): write id, partition,
                   attempt, host, created, owner process, destination, run, and its state: ``open`` -> ``logged``
                   (the whole partition is in the log) -> ``done``
    s/A/<seq>      a segment: the digests of a batch's records, then (until Kafka acknowledged all of them)
                   their Arrow IPC bytes; a CRC32 covers both
    a/A/<seq>      that segment's acknowledgement bitmap (one byte per record), with a CRC32
    u              bytes of payload held by all segments: the quantity ``wal.maxBytes`` bounds
    k/W/R/<digest> a re-run's claims on an earlier run's proof of delivery: for run ``R`` of write ``W``, how many
                   acknowledged copies of one record each partition counted as already delivered (pairs of
                   little-endian u32 partition, u32 count), so that two partitions never both skip one copy

Every append is one transaction committed with fsync (``sync=True``) and carries the acknowledgement
bitmaps that changed since the previous one. A segment whose records are all acknowledged is rewritten as
its digests alone: the WAL holds payload only for what Kafka has not acknowledged, and keeps the digests as
proof of delivery until the write is certainly committed (see :func:`.retention.sweep`).

>>> segment_key(b"w/000003/k", 42)
b's/w/000003/k/000000000042'
>>> ack_key_of(segment_key(b"w/000003/k", 42))
b'a/w/000003/k/000000000042'
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import pyarrow as pa

try:  # the same CRC32 as zlib's, faster (carry-less multiplication)
    from zlib_ng.zlib_ng import crc32
except ImportError:  # a spark-submit --py-files deployment without the wheel
    from zlib import crc32

from recoverable_sink.errors import WalCorruptionError, WalError
from recoverable_sink.identity import DIGEST_SIZE

META, SEGMENTS, ACKS, CLAIMS = b"m/", b"s/", b"a/", b"k/"
USAGE_KEY = b"u"
SEQUENCE_KEY = b"q"  # the last attempt sequence number given on this host (8 bytes, big-endian)
_SEG_MAGIC = b"RKW2"
_ACK_MAGIC = b"RKA1"
# magic, crc32 of the rest, record count, first position, payload length, flags
SEG_HEADER = struct.Struct("<4sIIQQI")
_ACK_HEADER = struct.Struct("<4sII")  # magic, crc32 of the bitmap, record count
ALL_ACKED = 1  # segment flag: digests only; every record in it was acknowledged


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


# ---- keys -----------------------------------------------------------------------------------------------
def meta_key(attempt_key: str) -> bytes:
    return META + attempt_key.encode()


def segments_start(attempt_key: str) -> bytes:
    """The prefix every segment key of an attempt starts with."""
    return SEGMENTS + attempt_key.encode() + b"/"


def segment_key(prefix: bytes, first: int) -> bytes:
    """The key of the segment at position ``first`` of the attempt whose path is ``prefix``."""
    return b"s/%s/%012d" % (prefix, first)


def ack_key(prefix: bytes, first: int) -> bytes:
    return b"a/%s/%012d" % (prefix, first)


def ack_key_of(seg_key: bytes) -> bytes:
    """The key of a segment's acknowledgement bitmap."""
    return ACKS + seg_key[2:]


def claims_prefix(write_id: str, run: str | None = None) -> bytes:
    """Where the claims of a write (and of one of its runs) start."""
    return CLAIMS + write_id.encode() + b"/" + (run.encode() + b"/" if run is not None else b"")


def encode_claims(counts: dict[int, int]) -> bytes:
    return b"".join(_CLAIM.pack(p, n) for p, n in sorted(counts.items()) if n)


def decode_claims(value: bytes | None) -> dict[int, int]:
    if not value:
        return {}
    return dict(_CLAIM.iter_unpack(value))


_CLAIM = struct.Struct("<II")


# ---- segments -------------------------------------------------------------------------------------------
def encode_segment(first: int, digests: bytes, payload: bytes, flags: int) -> bytes:
    count = len(digests) // DIGEST_SIZE
    crc = crc32(struct.pack("<IQQI", count, first, len(payload), flags))
    crc = crc32(payload, crc32(digests, crc))
    return b"".join((SEG_HEADER.pack(_SEG_MAGIC, crc, count, first, len(payload), flags), digests, payload))


def _write_ipc(out: pa.NativeFile, batch: pa.RecordBatch) -> None:
    with pa.ipc.new_stream(out, batch.schema) as writer:
        writer.write_batch(batch)


def segment_value(first: int, digests: bytes, batch: pa.RecordBatch) -> tuple[pa.Buffer, int]:
    """The bytes ``encode_segment(first, digests, <batch's Arrow IPC stream>, 0)`` would give, and the IPC
    stream's length, built in one buffer: the batch is serialised straight into place (its length measured
    first by a counting stream, which copies nothing) and checksummed there. Building the stream, then the
    segment around it, then Python bytes of each, copied every payload byte three more times
    (docs/performance.md, "WAL segment built in place")."""
    counter = pa.MockOutputStream()
    _write_ipc(counter, batch)
    payload_len = counter.size()
    head = SEG_HEADER.size + len(digests)  # a multiple of 8, so Arrow pads the stream as it did when counted
    value = pa.allocate_buffer(head + payload_len)
    out = pa.FixedSizeBufferWriter(value)
    out.write(bytes(SEG_HEADER.size))  # filled in below, once the checksum is known
    out.write(digests)
    _write_ipc(out, batch)
    if out.tell() != head + payload_len:
        raise WalError(f"Arrow wrote {out.tell() - head} bytes of IPC stream after counting {payload_len}")
    view = memoryview(value)
    count = len(digests) // DIGEST_SIZE
    crc = crc32(view[SEG_HEADER.size:], crc32(struct.pack("<IQQI", count, first, payload_len, 0)))
    SEG_HEADER.pack_into(view, 0, _SEG_MAGIC, crc, count, first, payload_len, 0)
    return value, payload_len


def encode_acks(acked: bytes | bytearray) -> bytes:
    return _ACK_HEADER.pack(_ACK_MAGIC, crc32(acked), len(acked)) + bytes(acked)


def payload_len(value: bytes) -> int:
    """The payload bytes a stored segment holds, from its header."""
    return SEG_HEADER.unpack_from(value)[4] if len(value) >= SEG_HEADER.size else 0


def record_count(value: bytes) -> int:
    """The records a stored segment holds, from its header (no checksum)."""
    return SEG_HEADER.unpack_from(value)[2] if len(value) >= SEG_HEADER.size else 0


def all_acked(value: bytes) -> bool:
    """Whether a stored segment was rewritten as digests alone (every record acknowledged)."""
    return bool(SEG_HEADER.unpack_from(value)[5] & ALL_ACKED)


def decode_segment(where: str, value: bytes, ack_value: bytes | None, payload: bool) -> Segment:
    """Decode a segment and its bitmap, checking every checksum; ``where`` names the entry in errors and
    ``payload=False`` skips decoding the records (digests and bitmaps only)."""
    if len(value) < SEG_HEADER.size:
        raise WalCorruptionError(f"{where}: truncated segment ({len(value)} bytes); it will not be replayed. "
                                 "Recover its records from the source and purge the attempt")
    magic, crc, count, first, length, flags = SEG_HEADER.unpack_from(value)
    body = memoryview(value)[SEG_HEADER.size:]
    digests_len = count * DIGEST_SIZE
    if magic != _SEG_MAGIC or len(body) != digests_len + length or crc32(
            body, crc32(struct.pack("<IQQI", count, first, length, flags))) != crc:
        raise WalCorruptionError(
            f"{where}: records {first}..{first + count - 1} fail their CRC32 checksum; they will not be "
            "replayed or skipped blindly. Re-run the write from its source after purging this attempt "
            "(`recoverable-kafka-wal purge`)"
        )
    digests = bytes(body[:digests_len])
    if flags & ALL_ACKED:
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
