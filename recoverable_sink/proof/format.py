"""The proof topic's records (pure): keys, values and which partition a write's proof goes to.

Every record of one *scope* (a batch write's id, or a streaming query's id for all its micro-batches) goes to one
partition of the proof topic, so that a re-run reads one partition and the claims of a run have one order. Partition 0
holds the directory (where each scope's live proof starts), the others the proof itself (a topic of one partition holds
both). Keys are text, ``/``-separated (ids hold only letters, digits, ``.``, ``_`` and ``-``), so that kcat shows
them as they are:

- ``rkp1/c/<scope>/<write>/<run>/<partition>/<attempt>/<a|t>/<n>``: the ``n``-th proof chunk of one attempt, ``a`` for
  at_least_once (what a drain learnt Kafka acknowledged; written outside any transaction) or ``t`` for exactly_once
  (what a segment sent; written inside the attempt's transaction, so visible with its records or not at all);
- ``rkp1/m/<scope>/<partition>``: the partition's commit marker (exactly_once, inside the transaction; the latest per
  partition survives compaction, as with the marker group);
- ``rkp1/k/<scope>/<write>/<run>/<partition>/<nonce>``: a claim of delivered copies by one partition of a re-run;
- ``rkp1/d/<scope>``: the scope's directory entry (partition 0).

A chunk's value lists segments: each a first position, a record count, an acknowledgement bitmap and the digests of the
acknowledged records in order. A chunk holds at most :data:`MAX_CHUNK_RECORDS` records, well under Kafka's default
``max.message.bytes``.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass

import numpy as np

from recoverable_sink.identity import DIGEST_SIZE

PREFIX = "rkp1"
VERSION = 1
MAX_CHUNK_RECORDS = 32_768  # 512 KiB of digests and 4 KiB of bitmap: half of Kafka's default 1 MB record limit
LAST = 1  # a chunk's flag: the attempt's last checkpoint, after everything it logged was acknowledged

_HEAD = struct.Struct(">BBqqI")  # version, flags, task attempt id (-1: none), micro-batch (-1: none), segments
_SEGMENT = struct.Struct(">QII")  # first position, records, acknowledged records (digests that follow the bitmap)
_CLAIM = struct.Struct(">BI")  # version, claims
_COPY = struct.Struct(">I")


def partition_of(scope: str, partitions: int) -> int:
    """The proof partition of a scope: a stable hash over the partitions after the directory's (0)."""
    if partitions <= 1:
        return 0
    h = int.from_bytes(hashlib.blake2b(scope.encode(), digest_size=8).digest(), "big")
    return 1 + h % (partitions - 1)


# ---- keys ---------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ChunkKey:
    scope: str
    write_id: str
    run: str
    partition: int
    attempt: str
    exactly_once: bool
    seq: int

    def encode(self) -> bytes:
        mode = "t" if self.exactly_once else "a"
        return (f"{PREFIX}/c/{self.scope}/{self.write_id}/{self.run}/{self.partition}/{self.attempt}/{mode}/"
                f"{self.seq}").encode()


@dataclass(frozen=True)
class MarkerKey:
    scope: str
    partition: int

    def encode(self) -> bytes:
        return f"{PREFIX}/m/{self.scope}/{self.partition}".encode()


@dataclass(frozen=True)
class ClaimKey:
    scope: str
    write_id: str
    run: str
    partition: int
    nonce: str

    def encode(self) -> bytes:
        return f"{PREFIX}/k/{self.scope}/{self.write_id}/{self.run}/{self.partition}/{self.nonce}".encode()


@dataclass(frozen=True)
class DirectoryKey:
    scope: str

    def encode(self) -> bytes:
        return f"{PREFIX}/d/{self.scope}".encode()


Key = ChunkKey | MarkerKey | ClaimKey | DirectoryKey


def parse_key(raw: bytes | None) -> Key | None:
    """A proof record's key, or None for a record that is not one (another writer's, or a newer format's)."""
    if not raw:
        return None
    try:
        parts = raw.decode().split("/")
    except UnicodeDecodeError:
        return None
    if len(parts) < 3 or parts[0] != PREFIX:
        return None
    kind, rest = parts[1], parts[2:]
    try:
        if kind == "c" and len(rest) == 7 and rest[5] in ("a", "t"):
            return ChunkKey(rest[0], rest[1], rest[2], int(rest[3]), rest[4], rest[5] == "t", int(rest[6]))
        if kind == "m" and len(rest) == 2:
            return MarkerKey(rest[0], int(rest[1]))
        if kind == "k" and len(rest) == 5:
            return ClaimKey(rest[0], rest[1], rest[2], int(rest[3]), rest[4])
        if kind == "d" and len(rest) == 1:
            return DirectoryKey(rest[0])
    except ValueError:
        return None
    return None


# ---- values -------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ChunkSegment:
    """One segment in a chunk: positions ``first`` .. ``first + count``, ``acked`` one byte per record (1:
    acknowledged), ``digests`` those of the acknowledged records in order."""

    first: int
    count: int
    acked: bytes
    digests: bytes


@dataclass(frozen=True)
class Chunk:
    segments: tuple[ChunkSegment, ...]
    last: bool = False
    task_attempt_id: int | None = None
    micro_batch: int | None = None

    @property
    def records(self) -> int:
        return sum(len(s.digests) // DIGEST_SIZE for s in self.segments)


def encode_chunk(chunk: Chunk) -> bytes:
    out = [_HEAD.pack(VERSION, LAST if chunk.last else 0,
                      -1 if chunk.task_attempt_id is None else chunk.task_attempt_id,
                      -1 if chunk.micro_batch is None else chunk.micro_batch, len(chunk.segments))]
    for s in chunk.segments:
        acked = len(s.digests) // DIGEST_SIZE
        out.append(_SEGMENT.pack(s.first, s.count, acked))
        out.append(_pack_bits(s.acked))
        out.append(s.digests)
    return b"".join(out)


def chunk_task_attempt_id(value: bytes) -> tuple[bool, int | None]:
    """From a chunk's header alone: whether this version reads it, and the task attempt id it names (None: none)."""
    try:
        version, _flags, tid, _batch, _n = _HEAD.unpack_from(value, 0)
    except struct.error:
        return False, None
    return version == VERSION, None if tid < 0 else tid


def decode_chunk(value: bytes) -> Chunk | None:
    """A chunk's value, or None where it is not one this version reads (a newer version's is skipped, never
    misread)."""
    try:
        version, flags, tid, batch, n = _HEAD.unpack_from(value, 0)
        if version != VERSION:
            return None
        at = _HEAD.size
        segments = []
        for _ in range(n):
            first, count, acked = _SEGMENT.unpack_from(value, at)
            at += _SEGMENT.size
            width = (count + 7) // 8
            bits = _unpack_bits(value[at:at + width], count)
            at += width
            digests = value[at:at + acked * DIGEST_SIZE]
            at += acked * DIGEST_SIZE
            if len(digests) != acked * DIGEST_SIZE or len(bits) - bits.count(0) != acked:
                return None
            segments.append(ChunkSegment(first, count, bits, digests))
        if at != len(value):
            return None
    except struct.error:
        return None
    return Chunk(tuple(segments), last=bool(flags & LAST), task_attempt_id=None if tid < 0 else tid,
                 micro_batch=None if batch < 0 else batch)


def acked_digests(digests: bytes, acked: bytes) -> bytes:
    """The digests of the records a segment's bitmap (one byte per record) says Kafka acknowledged, in order."""
    if 0 not in acked:
        return digests
    rows = np.frombuffer(digests, dtype=np.uint8).reshape(-1, DIGEST_SIZE)
    kept: bytes = rows[np.frombuffer(acked, dtype=np.uint8) != 0].tobytes()
    return kept


def _pack_bits(acked: bytes) -> bytes:
    """One byte per record -> one bit per record, the first record in the lowest bit."""
    return np.packbits(np.frombuffer(acked, dtype=np.uint8) != 0, bitorder="little").tobytes()


def _unpack_bits(raw: bytes, count: int) -> bytes:
    bits = np.unpackbits(np.frombuffer(raw, dtype=np.uint8), count=count, bitorder="little")
    if len(bits) != count:
        raise struct.error("bitmap too short")
    return bits.tobytes()


def encode_claims(copies: list[tuple[bytes, int]]) -> bytes:
    """A claim's value: (record digest, copy number) pairs, the copy numbers counted per digest from 1."""
    return _CLAIM.pack(VERSION, len(copies)) + b"".join(d + _COPY.pack(c) for d, c in copies)


def decode_claims(value: bytes) -> list[tuple[bytes, int]] | None:
    try:
        version, n = _CLAIM.unpack_from(value, 0)
        if version != VERSION or len(value) != _CLAIM.size + n * (DIGEST_SIZE + _COPY.size):
            return None
        at, out = _CLAIM.size, []
        for _ in range(n):
            d = value[at:at + DIGEST_SIZE]
            (c,) = _COPY.unpack_from(value, at + DIGEST_SIZE)
            out.append((d, c))
            at += DIGEST_SIZE + _COPY.size
        return out
    except struct.error:
        return None


def encode_directory(starts: dict[int, int]) -> bytes:
    """A directory entry: per proof partition, the lowest offset at which the scope's live proof may start."""
    return json.dumps({"v": VERSION, "partitions": {str(p): o for p, o in sorted(starts.items())}}).encode()


def decode_directory(value: bytes | None) -> dict[int, int] | None:
    """A directory entry's starts (None for a tombstone or an unreadable entry)."""
    if not value:
        return None
    try:
        raw = json.loads(value)
        return {int(p): int(o) for p, o in raw["partitions"].items()}
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
