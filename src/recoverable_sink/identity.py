"""Record identity across attempts (executor): a record is known by a digest of its content and its
destination, never by its position, so a retry that reads its input in another order (a shuffle), a re-run
after a driver restart, or a query restarted towards another topic matches exactly what was delivered.

A digest is 16 bytes of BLAKE2b over the cluster id, the topic, the explicit partition (if any), the key,
the value, the headers and the timestamp, each length-framed. Equal records count as a multiset: a partition
holding the same record twice has it delivered twice, and a retry skips only as many copies as were
acknowledged.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

DIGEST_SIZE = 16
_NONE = b"\xff\xff\xff\xff"  # the length frame of a null field; no real field is 4 GiB long


def _frame(data: bytes | None) -> bytes:
    return _NONE if data is None else len(data).to_bytes(4, "little")


def _base(cluster_id: str, topic: str) -> hashlib.blake2b:
    return hashlib.blake2b(b"rk1\0" + cluster_id.encode() + b"\0" + topic.encode() + b"\0", digest_size=DIGEST_SIZE)


def _as_bytes(column: pa.Array) -> list[bytes | None]:
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        column = column.cast(pa.binary())
    return column.to_pylist()


def _frames(column: pa.Array) -> pa.Array:
    """Each value's length frame (``_frame``) as a 4-byte binary array, built by Arrow and numpy at once."""
    lengths = pc.binary_length(column).to_numpy(zero_copy_only=False)
    if column.null_count:
        lengths = np.where(column.is_null().to_numpy(zero_copy_only=False), 0xFFFFFFFF, lengths)
    frames = np.ascontiguousarray(lengths, dtype="<u4")
    return pa.FixedSizeBinaryArray.from_buffers(pa.binary(4), len(column), [None, pa.py_buffer(frames)]) \
        .cast(pa.binary())


def _key_value_digests(batch: pa.RecordBatch, base: hashlib.blake2b) -> bytes:
    """The key-and-value shape's digests: the framed bytes of each record are joined by Arrow in one pass, so
    the per-record Python work is one copy, update and digest of BLAKE2b (same bytes as the general path)."""
    value = batch.column("value").cast(pa.binary())
    key = batch.column("key").cast(pa.binary()) if "key" in batch.schema.names \
        else pa.nulls(len(value), pa.binary())
    joined = pc.binary_join_element_wise(_frames(key), _frames(value), pc.fill_null(key, b""),
                                         pc.fill_null(value, b""), b"")
    copy = base.copy

    def digest(framed: bytes) -> bytes:
        h = copy()
        h.update(framed)
        return h.digest()

    return b"".join(map(digest, joined.to_pylist()))


def record_digests(batch: pa.RecordBatch, topic_option: str | None, cluster_id: str) -> bytes:
    """The digests of a normalised batch's records, concatenated (``DIGEST_SIZE`` bytes each, in order).

    >>> b = pa.RecordBatch.from_pydict({"key": [b"k", b"k"], "value": [b"v", b"w"]})
    >>> d = record_digests(b, "t", "c")
    >>> len(d), d[:16] == record_digests(b.slice(0, 1), "t", "c"), d[:16] == record_digests(b.slice(0, 1), "u", "c")
    (32, True, False)
    """
    names = batch.schema.names
    if names == ["key", "value"] or names == ["value"]:  # the common shape: one topic, key and value only
        assert topic_option is not None
        return _key_value_digests(batch, _base(cluster_id, topic_option))
    values = _as_bytes(batch.column("value"))
    keys = _as_bytes(batch.column("key")) if "key" in names else [None] * len(values)
    out = bytearray()
    topics = batch.column("topic").to_pylist() if "topic" in names else [topic_option] * len(values)
    partitions = batch.column("partition").to_pylist() if "partition" in names else None
    headers = batch.column("headers").to_pylist() if "headers" in names else None
    timestamps = batch.column("timestamp").to_pylist() if "timestamp" in names else None
    bases: dict[str, hashlib.blake2b] = {}
    for i, (k, v, t) in enumerate(zip(keys, values, topics, strict=True)):
        base = bases.get(t)
        if base is None:
            base = bases[t] = _base(cluster_id, t)
        h = base.copy()
        h.update(_frame(k) + (k or b"") + _frame(v) + (v or b""))
        p = partitions[i] if partitions is not None else None
        h.update(b"p" + (b"-" if p is None else str(p).encode()))
        ts = timestamps[i] if timestamps is not None else None
        h.update(b"t" + (b"-" if ts is None else str(ts).encode()))
        hs = headers[i] if headers is not None else None
        if hs:
            for header in hs:
                hk = header["key"].encode()
                h.update(b"h" + _frame(hk) + hk + _frame(header["value"]) + (header["value"] or b""))
        out += h.digest()
    return bytes(out)


def split(digests: bytes) -> list[bytes]:
    """Concatenated digests -> one bytes object per record."""
    return [digests[i:i + DIGEST_SIZE] for i in range(0, len(digests), DIGEST_SIZE)]


class Match(NamedTuple):
    skip: list[bool]  # per recomputed record: an acknowledged copy was left, do not send it
    replayed: int  # of the others, how many an earlier attempt had logged but never got acknowledged


class DeliveredSet:
    """The multiset of records that earlier attempts of a partition got acknowledged, and of those they logged
    without an acknowledgement; a retry consumes it record by record as it recomputes its input."""

    def __init__(self) -> None:
        self.acked: Counter[bytes] = Counter()
        self.unacked: Counter[bytes] = Counter()

    def add(self, digests: bytes, acked: bytes | bytearray | None) -> None:
        """Add one logged segment: ``acked`` is its bitmap (one byte per record), None when all are acked."""
        for i, d in enumerate(split(digests)):
            if acked is None or acked[i]:
                self.acked[d] += 1
            else:
                self.unacked[d] += 1

    def __bool__(self) -> bool:
        return bool(self.acked) or bool(self.unacked)

    def take(self, digests: Iterable[bytes]) -> Match:
        """For recomputed records: which to skip (an acknowledged copy is left), consuming the copies they
        match; and how many of the others an earlier attempt had logged but never got acknowledged."""
        skip: list[bool] = []
        replayed = 0
        acked, unacked = self.acked, self.unacked
        for d in digests:
            if acked[d] > 0:
                acked[d] -= 1
                skip.append(True)
            else:
                skip.append(False)
                if unacked[d] > 0:
                    unacked[d] -= 1
                    replayed += 1
        return Match(skip, replayed)

    def left_over(self) -> int:
        """Acknowledged records no recomputed record matched: the input changed between attempts."""
        return sum(n for n in self.acked.values() if n > 0)
