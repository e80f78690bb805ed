"""Record digests: the C extension and the hashlib fallback (--py-files) give the same bytes, and the bytes
are those of earlier releases, so a retry under a new build still matches an earlier attempt's WAL."""

import hashlib
import os
import random

import pyarrow as pa
import pytest

from recoverable_sink import identity
from recoverable_sink.identity import _bodies, _native_fields, _prefix, digest_all, python_digests, record_digests

HEADERS = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))


def _random_batch(rng: random.Random) -> tuple[pa.RecordBatch, str | None]:
    n = rng.randint(1, 25)

    def some(null: float = 0.2) -> bytes | None:
        return None if rng.random() < null else os.urandom(rng.choice([0, 1, 94, 127, 128, 129, 300, 1100]))

    cols: dict[str, pa.Array] = {}
    if rng.random() < 0.7:
        cols["key"] = pa.array([some() for _ in range(n)], pa.binary())
    cols["value"] = pa.array([some(0.1) for _ in range(n)], pa.binary())
    topic: str | None = "t"
    if rng.random() < 0.6:
        if rng.random() < 0.5:
            cols["topic"] = pa.array([rng.choice(["a", "bb", "é"]) for _ in range(n)])
            topic = None
        cols["partition"] = pa.array([rng.choice([None, 0, 7]) for _ in range(n)], pa.int32())
        cols["timestamp"] = pa.array([rng.choice([None, 1, 1_700_000_000_000]) for _ in range(n)], pa.int64())
        cols["headers"] = pa.array([None if rng.random() < 0.2 else
                                    [{"key": rng.choice(["h", "é", "x" * 200, ""]), "value": some()}
                                     for _ in range(rng.randint(0, 3))] for _ in range(n)], HEADERS)
    batch = pa.RecordBatch.from_pydict(cols)
    if n > 3 and rng.random() < 0.5:  # a slice: the Arrow offsets no longer start at 0
        batch = batch.slice(1, n - 2)
    return batch, topic


def _reference(batch: pa.RecordBatch, topic: str | None, cluster: str) -> bytes:
    """The digest as identity's module docstring defines it, one record at a time with hashlib."""
    out = b""
    for row in batch.to_pylist():
        def framed(data: bytes | None) -> bytes:
            return b"\xff\xff\xff\xff" if data is None else len(data).to_bytes(4, "little") + data

        h = hashlib.blake2b(_prefix(cluster, row.get("topic") or topic or ""), digest_size=16)
        if list(row) in (["key", "value"], ["value"]):
            k, v = row.get("key"), row["value"]
            h.update(framed(k)[:4] + framed(v)[:4] + (k or b"") + (v or b""))
        else:
            h.update(framed(row.get("key")) + framed(row["value"]))
            for tag, name in ((b"p", "partition"), (b"t", "timestamp")):
                h.update(tag + (b"-" if row.get(name) is None else str(row[name]).encode()))
            for header in row.get("headers") or []:
                h.update(b"h" + framed(header["key"].encode()) + framed(header["value"]))
        out += h.digest()
    return out


def test_native_and_hashlib_digests_agree_with_the_definition_on_every_shape():
    rng = random.Random(20261123)
    for _ in range(300):
        batch, topic = _random_batch(rng)
        expected = _reference(batch, topic, "cluster-1")
        assert record_digests(batch, topic, "cluster-1") == expected
        prefix = b"" if topic is None else _prefix("cluster-1", topic)
        assert python_digests(prefix, _bodies(batch, "cluster-1")) == expected


def test_the_native_digests_are_built_by_make_setup():
    """pyproject marks the extension optional (an install without a C compiler falls back to hashlib):
    this catches a build that failed quietly."""
    assert identity._native is not None


def test_digests_are_those_of_earlier_releases():
    kv = pa.RecordBatch.from_pydict({"key": [b"k", None], "value": [b"v" * 200, b""]})
    general = pa.RecordBatch.from_pydict({
        "key": ["k", None], "value": [b"v", None], "topic": ["a", "b"],
        "partition": pa.array([3, None], pa.int32()), "timestamp": pa.array([1_700_000_000_000, None], pa.int64()),
        "headers": pa.array([[{"key": "h", "value": b"1"}, {"key": "g", "value": None}], None], HEADERS)})
    assert record_digests(kv, "t", "c").hex() == \
        "682ee647a29781e80d42a4bc0459cea6d31f7cd00e8dfc34c4ed3ea4eb13c1c6"
    assert record_digests(general, None, "c").hex() == \
        "d6a866ca4b8937abe25456569b69432a59a66b41327b76f340b96e7f1683b6d8"


@pytest.mark.skipif(identity._native is None, reason="the C extension is not built")
def test_native_digests_of_records_hashed_several_at_once_match_hashlib_whatever_their_lengths():
    """The extension hashes eight records per pass where the CPU has AVX-512, four where it has AVX2: records of
    different block counts share a pass, prefixes end inside a block or on its edge, and the batch's tail goes
    one at a time."""
    assert identity._native.LANES in (1, 4, 8)
    rng = random.Random(8)
    for _ in range(200):
        n = rng.randint(0, 70)
        values = [os.urandom(rng.choice([0, 1, 90, 127, 128, 129, 256, 257, 1100, rng.randint(0, 3000)]))
                  for _ in range(n)]
        array = pa.array(values, rng.choice([pa.binary(), pa.large_binary()]))
        if n > 3 and rng.random() < 0.5:
            array = array.slice(2, n - 3)
        prefix = os.urandom(rng.choice([0, 1, 38, 127, 128, 129, 300]))
        got = identity._native.batch(prefix, array)
        assert got == b"".join(hashlib.blake2b(prefix + v, digest_size=16).digest() for v in array.to_pylist())


def _out_of_order() -> pa.Array:
    """Three values whose middle offset goes back: Arrow's shallow validation (as after an IPC read) passes it."""
    offsets = pa.py_buffer(pa.array([0, 3, 1, 4], pa.int32()).buffers()[1])
    return pa.Array.from_buffers(pa.binary(), 3, [None, offsets, pa.py_buffer(b"abcd")])


@pytest.mark.skipif(identity._native is None, reason="the C extension is not built")
def test_the_native_call_refuses_offsets_out_of_order_and_what_is_not_binary():
    with pytest.raises(ValueError, match="bodies: offsets out of order or outside its data"):
        identity._native.batch(b"", _out_of_order())
    with pytest.raises(TypeError, match="bodies: Arrow format 'i' is not binary or string"):
        identity._native.batch(b"", pa.array([1, 2], pa.int32()))
    with pytest.raises(TypeError, match="bodies: not an Arrow array"):
        identity._native.batch(b"", b"ab")
    assert identity._native.batch(b"", pa.array([b"", b""])) == identity.python_digests(b"", pa.array([b"", b""]))


@pytest.mark.skipif(identity._native is None, reason="the C extension is not built")
def test_records_gathered_from_their_columns_hash_as_arrows_joined_bodies_do():
    """record_digests hands the extension each column's buffers (no joined copy of the records); the Arrow joins
    stay for the fallback and define the bytes. Batches long enough for several passes of lanes, sliced or not."""
    rng = random.Random(20261125)
    checked = 0
    while checked < 150:
        parts = [_random_batch(rng) for _ in range(rng.randint(1, 4))]
        if len({(tuple(b.schema.names), t) for b, t in parts}) > 1:  # batches of one shape only
            continue
        checked += 1
        batch = pa.Table.from_batches([b for b, _ in parts]).combine_chunks().to_batches()[0]
        topic = parts[0][1]
        prefix = b"" if topic is None else _prefix("c", topic)
        fields = _native_fields(batch, "c")
        assert fields is not None
        assert identity._native.records(prefix, batch.num_rows, fields) == digest_all(prefix, _bodies(batch, "c"))


def test_a_null_header_key_keeps_the_arrow_path():
    """A null header key makes Arrow's join drop the record's headers from its body; the sink refuses such a
    record before hashing it, and the gathered path leaves that case to Arrow rather than define it anew."""
    batch = pa.RecordBatch.from_pydict({"key": [b"k"], "value": [b"v"],
                                        "headers": pa.array([[{"key": None, "value": b"1"}]], HEADERS)})
    assert _native_fields(batch, "c") is None
    assert record_digests(batch, "t", "c") == python_digests(_prefix("c", "t"), _bodies(batch, "c"))


@pytest.mark.skipif(identity._native is None, reason="the C extension is not built")
def test_the_records_call_refuses_columns_that_do_not_hold_the_rows_asked_naming_them():
    ok = (0, "value", pa.array([b"ab"]))
    assert len(identity._native.records(b"", 1, (ok,))) == 16
    with pytest.raises(ValueError, match="value: 1 rows where the batch has 2"):
        identity._native.records(b"", 2, (ok,))
    with pytest.raises(ValueError, match="key: offsets out of order or outside its data"):
        identity._native.records(b"", 3, ((1, "key", _out_of_order()),))
    with pytest.raises(TypeError, match="value: Arrow format 'Z' is not binary or string with 32-bit offsets"):
        identity._native.records(b"", 1, ((0, "value", pa.array([b"ab"], pa.large_binary())),))
    items = pa.array([{"key": "h", "value": b"1"}] * 2, HEADERS.value_type)
    back = pa.ListArray.from_arrays(pa.array([0, 2, 1, 2], pa.int32()), items)  # shallow validation passes it
    with pytest.raises(ValueError, match="headers: offsets out of order or outside its items"):
        identity._native.records(b"", 3, ((2, "headers", back),))
    with pytest.raises(ValueError, match="a field is neither bytes nor"):
        identity._native.records(b"", 1, ((5, "value", pa.array([b"ab"])),))
    # Empty lists only: an IPC-read child of no items may come without an offsets buffer, and nothing is read.
    empty = [None, pa.py_buffer(b""), pa.py_buffer(b"")]
    none = pa.StructArray.from_arrays([pa.Array.from_buffers(pa.string(), 0, empty),
                                       pa.Array.from_buffers(pa.binary(), 0, empty)], names=["key", "value"])
    headers = pa.ListArray.from_arrays(pa.array([0, 0], pa.int32()), none)
    assert len(identity._native.records(b"", 1, ((2, "headers", headers),))) == 16


def test_headers_whose_items_are_a_slice_of_their_arrays_hash_as_arrow_shows_them():
    """A list's struct child may be a slice itself (a struct offset above its children's): the extension reads
    the headers Arrow shows, not those at the start of the children."""
    items = pa.array([{"key": "x", "value": b"0"}, {"key": "h", "value": b"1"}, {"key": "g", "value": None},
                      {"key": "k", "value": b"3"}], HEADERS.value_type)
    headers = pa.ListArray.from_arrays(pa.array([0, 1, 3], pa.int32()), items.slice(1))
    assert headers.values.offset == 1
    batch = pa.RecordBatch.from_arrays([pa.array([b"a", b"b"]), headers], names=["value", "headers"])
    assert record_digests(batch, "t", "c") == _reference(batch, "t", "c")


def test_the_python_digests_hash_a_null_body_as_the_extension_does():
    """Without the extension (an sdist built with no compiler, --py-files) a null body, from a record with a null
    topic, hashed to a TypeError: the writer's model failed every attempt of such a write."""
    from recoverable_sink.identity import digest_all, python_digests

    bodies = pa.array([b"a", None, b""], pa.binary())
    assert python_digests(b"p", bodies) == digest_all(b"p", bodies)
    assert python_digests(b"p", bodies)[16:32] == python_digests(b"p", pa.array([b""], pa.binary()))
