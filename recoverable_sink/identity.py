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
import threading
from collections import Counter
from collections.abc import Iterable, Iterator
from types import ModuleType
from typing import NamedTuple, TypeAlias

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

_native: ModuleType | None
try:  # the C extension built by `pip install` (make setup); not in the spark-submit --py-files zip
    import recoverable_sink._digests as _native
except ImportError:
    _native = None

# A field of _digests.records (the stub's Field): the same bytes for every record, or (kind, column name, array).
_Field: TypeAlias = "bytes | tuple[int, str, pa.Array]"

DIGEST_SIZE = 16
# What Kafka acknowledged of an attempt's records, by WAL segment (its first position): one byte per record, 1 once
# acknowledged. The producer wing's ledger fills them; the WAL persists them beside the segments' digests.
AckBitmaps = dict[int, bytearray]
_NULL_LENGTH = 0xFFFFFFFF  # the length frame of a null field; no real field is 4 GiB long


def _cluster_prefix(cluster_id: str) -> bytes:
    return b"rk1\0" + cluster_id.encode() + b"\0"


def _prefix(cluster_id: str, topic: str) -> bytes:
    return _cluster_prefix(cluster_id) + topic.encode() + b"\0"


def _binary(column: pa.Array) -> pa.Array:
    return column if column.type == pa.binary() else column.cast(pa.binary())


def _frames(column: pa.Array) -> pa.Array:
    """Each value's length frame (4 bytes little-endian, ``_NULL_LENGTH`` for a null) as a binary array,
    built by Arrow and numpy at once."""
    lengths = pc.binary_length(column).to_numpy(zero_copy_only=False)
    if column.null_count:
        lengths = np.where(column.is_null().to_numpy(zero_copy_only=False), _NULL_LENGTH, lengths)
    frames = np.ascontiguousarray(lengths, dtype="<u4")
    return pa.FixedSizeBinaryArray.from_buffers(pa.binary(4), len(column), [None, pa.py_buffer(frames)]) \
        .cast(pa.binary())


def _framed(column: pa.Array) -> list[pa.Array]:
    return [_frames(column), pc.fill_null(column, b"")]


def _as_text(column: pa.Array) -> pa.Array:
    """An integer column as the decimal text of each value, "-" for a null."""
    return pc.fill_null(column.cast(pa.string()), "-").cast(pa.binary())


def _headers_bytes(headers: pa.ListArray) -> pa.Array:
    """Each record's headers as "h" + framed key + framed value per header, joined (empty for none)."""
    items = headers.values  # the whole child array; the offsets index into it
    keys, values = _binary(items.field("key")), _binary(items.field("value"))
    framed = pc.binary_join_element_wise(b"h", _frames(keys), keys, *_framed(values), b"")
    joined = pc.binary_join(pa.ListArray.from_arrays(headers.offsets, framed), b"")
    return pc.fill_null(joined, b"")


def _bodies(batch: pa.RecordBatch, cluster_id: str) -> pa.Array:
    """What each record's digest covers after the batch's common prefix (``_prefix``; with a topic column,
    the prefix is part of each record's body), built by Arrow a column at a time: the per-record work left
    is the hash alone."""
    names = batch.schema.names
    value = _binary(batch.column("value"))
    key = _binary(batch.column("key")) if "key" in names else pa.nulls(len(value), pa.binary())
    if names == ["key", "value"] or names == ["value"]:  # the common shape: one topic, key and value only
        return pc.binary_join_element_wise(_frames(key), _frames(value), pc.fill_null(key, b""),
                                           pc.fill_null(value, b""), b"")
    parts: list[pa.Array | bytes] = [*_framed(key), *_framed(value)]
    parts += [b"p", _as_text(batch.column("partition")) if "partition" in names else b"-"]
    parts += [b"t", _as_text(batch.column("timestamp")) if "timestamp" in names else b"-"]
    if "headers" in names:
        parts.append(_headers_bytes(batch.column("headers")))
    if "topic" in names:  # a prefix per record
        topic = _binary(batch.column("topic"))
        parts = [_cluster_prefix(cluster_id), topic, b"\0", *parts]
    return pc.binary_join_element_wise(*parts, b"")


_VALUE, _FRAME, _HEADERS = 0, 1, 2  # the kinds of ``_digests.records``'s fields: a value, its length frame, headers
_HEADER_ITEMS = pa.struct([("key", pa.binary()), ("value", pa.binary())])


def _native_headers(headers: pa.Array) -> pa.Array:
    """The headers column as ``_digests.records`` takes it: a list of structs of binary or string, 32-bit offsets
    (the bytes of a string are those of its binary cast)."""
    kind = headers.type
    if pa.types.is_list(kind) and all(f.type in (pa.binary(), pa.string()) for f in kind.value_type):
        return headers
    return headers.cast(pa.list_(_HEADER_ITEMS))


def _native_fields(batch: pa.RecordBatch, cluster_id: str) -> tuple[_Field, ...] | None:
    """What ``_bodies`` joins, as fields for the extension to gather record by record (no joined copy): bytes,
    or (kind, column name, Arrow array) taken through the Arrow C Data Interface. None where a null would make
    Arrow's join null a whole body (a null topic or header key, which the sink refuses before it hashes
    anything): the Arrow path keeps those bytes."""
    names = batch.schema.names
    value = _binary(batch.column("value"))
    key = _binary(batch.column("key")) if "key" in names else pa.nulls(len(value), pa.binary())
    if names == ["key", "value"] or names == ["value"]:
        return (_FRAME, "key", key), (_FRAME, "value", value), (_VALUE, "key", key), (_VALUE, "value", value)
    fields: list[_Field] = [(_FRAME, "key", key), (_VALUE, "key", key), (_FRAME, "value", value),
                            (_VALUE, "value", value)]
    for tag, name in ((b"p", "partition"), (b"t", "timestamp")):
        fields += [tag, (_VALUE, name, _as_text(batch.column(name)))] if name in names else [tag + b"-"]
    if "headers" in names:
        headers = batch.column("headers")
        items = headers.values
        if items.null_count or items.field("key").null_count:
            return None
        fields.append((_HEADERS, "headers", _native_headers(headers)))
    if "topic" in names:
        topic = _binary(batch.column("topic"))
        if topic.null_count:
            return None
        fields = [_cluster_prefix(cluster_id), (_VALUE, "topic", topic), b"\0", *fields]
    return tuple(fields)


def record_digests(batch: pa.RecordBatch, topic_option: str | None, cluster_id: str) -> bytes:
    """The digests of a normalised batch's records, concatenated (``DIGEST_SIZE`` bytes each, in order).

    >>> b = pa.RecordBatch.from_pydict({"key": [b"k", b"k"], "value": [b"v", b"w"]})
    >>> d = record_digests(b, "t", "c")
    >>> len(d), d[:16] == record_digests(b.slice(0, 1), "t", "c"), d[:16] == record_digests(b.slice(0, 1), "u", "c")
    (32, True, False)
    """
    if "topic" in batch.schema.names:
        prefix = b""
    else:
        assert topic_option is not None
        prefix = _prefix(cluster_id, topic_option)
    if _native is not None and batch.num_rows:
        # The C Data Interface carries no buffer sizes: Arrow's shallow validation (buffer sizes, first and last
        # offsets) is what lets the extension trust them; it checks the offsets in between itself.
        batch.validate()
        fields = _native_fields(batch, cluster_id)
        if fields is not None:
            digests: bytes = _native.records(prefix, batch.num_rows, fields)
            return digests
    return digest_all(prefix, _bodies(batch, cluster_id))


def digest_all(prefix: bytes, bodies: pa.Array) -> bytes:
    """BLAKE2b-128 of ``prefix`` + each element of a binary array, concatenated: in one native call (no
    GIL) where the ``_digests`` extension was built, else with hashlib (the same bytes)."""
    if _native is not None and len(bodies):
        if bodies.type not in (pa.binary(), pa.large_binary(), pa.string(), pa.large_string()):
            bodies = bodies.cast(pa.binary())
        bodies.validate()  # as in record_digests
        digests: bytes = _native.batch(prefix, bodies)
        return digests
    return python_digests(prefix, bodies)


def python_digests(prefix: bytes, bodies: pa.Array) -> bytes:
    """``digest_all`` with hashlib: one copy of the prefix's state, update and digest per record."""
    copy = hashlib.blake2b(prefix, digest_size=DIGEST_SIZE).copy

    def digest(body: bytes) -> bytes:
        h = copy()
        h.update(body)
        return h.digest()

    # A null body (a record with a null topic, which the sink refuses or dead-letters) is hashed as empty, as the
    # extension hashes its empty slot.
    return b"".join(map(digest, pc.fill_null(_binary(bodies), b"").to_pylist()))


def slices(batch: pa.RecordBatch, digests: bytes | None,
           rows: int) -> Iterator[tuple[pa.RecordBatch, bytes | None]]:
    """The batch in slices of at most ``rows`` records (no copy), each with its records' digests when known."""
    n = batch.num_rows
    for first in range(0, n, rows):
        count = min(rows, n - first)
        yield (batch.slice(first, count),
               digests[first * DIGEST_SIZE:(first + count) * DIGEST_SIZE] if digests is not None else None)


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


class Fingerprint:
    """An order-independent summary of a multiset of records: how many, and the sum of their digests modulo
    2**128 (a sum, not an XOR, so a record present twice does not cancel out). Two partitions with equal
    fingerprints hold the same records, whatever order a shuffle delivered them in; a re-run uses it to tell
    a partition that an earlier run committed from one that now holds other rows. Adds may come from the task's
    thread and the WAL's hashing thread: a lock keeps the sum whole."""

    def __init__(self, count: int = 0, total: int = 0) -> None:
        self.count = count
        self.total = total
        self._lock = threading.Lock()

    def add(self, digests: bytes) -> None:
        n = len(digests) // DIGEST_SIZE
        if not n:
            return
        # Four 32-bit limbs summed in 64 bits cannot overflow below 2**32 records per call.
        limbs = np.frombuffer(digests, dtype="<u4").reshape(n, 4).sum(axis=0, dtype=np.uint64)
        added = sum(int(limb) << (32 * i) for i, limb in enumerate(limbs))
        with self._lock:
            self.count += n
            self.total = (self.total + added) & _SUM_MASK

    def encode(self) -> str:
        """``<count>:<sum as 32 hex digits>``, as attempt metadata and commit markers carry it."""
        return f"{self.count}:{self.total:032x}"

    @classmethod
    def decode(cls, text: object) -> Fingerprint | None:
        """The fingerprint in ``text``, or None where there is none (a marker or an attempt written before)."""
        if not isinstance(text, str) or ":" not in text:
            return None
        count, total = text.split(":", 1)
        try:
            return cls(int(count), int(total, 16))
        except ValueError:
            return None

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Fingerprint) and (self.count, self.total) == (other.count, other.total)

    def __hash__(self) -> int:
        return hash((self.count, self.total))

    def __repr__(self) -> str:
        return f"Fingerprint({self.encode()})"


_SUM_MASK = (1 << 128) - 1
