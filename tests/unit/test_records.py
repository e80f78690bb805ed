"""Executor-side record checks and conversion, on plain Arrow batches."""

import pyarrow as pa
import pytest

from recoverable_sink.errors import RecordError
from recoverable_sink.records import SchemaPlan, check_batch, normalise, to_records


def counts(topic: str) -> int:
    if topic == "missing":
        raise RecordError(f"topic {topic} does not exist")
    return 3


def headers(*rows):
    return pa.array(rows, pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())])))


def test_null_header_key_names_the_record():
    b = pa.RecordBatch.from_pydict({"value": [b"a", b"b"],
                                    "headers": headers([{"key": "k", "value": b"1"}], [{"key": None, "value": b"2"}])})
    with pytest.raises(RecordError, match="p0, record 11: a header has a null key"):
        check_batch(b, "t", "p0", 10, 1000, counts)


def test_partition_out_of_range_names_record_and_topic():
    b = pa.RecordBatch.from_pydict({"value": [b"a", b"b"], "topic": ["t", "u"],
                                    "partition": pa.array([2, 3], pa.int32())})
    with pytest.raises(RecordError, match="record 1: partition 3 is out of range for topic u, which has 3 partitions"):
        check_batch(b, None, "p0", 0, 1000, counts)


def test_topic_column_naming_a_missing_topic_fails_before_the_wal():
    b = pa.RecordBatch.from_pydict({"value": [b"a"], "topic": ["missing"]})
    with pytest.raises(RecordError, match="topic missing does not exist"):
        check_batch(b, None, "p0", 0, 1000, counts)


def test_key_plus_value_over_the_limit_names_the_record():
    b = pa.RecordBatch.from_pydict({"key": [b"k", b"k" * 10], "value": [b"v", b"v" * 995]})
    with pytest.raises(RecordError, match=r"record 1: key\+value is 1005 bytes"):
        check_batch(b, "t", "p0", 0, 1000, counts)


def test_normalise_drops_the_topic_column_under_the_option_and_keeps_milliseconds():
    plan = SchemaPlan(columns=("value", "topic", "timestamp"), topic_option="t")
    raw = pa.RecordBatch.from_pydict({"value": ["a"], "topic": ["ignored"],
                                      "timestamp": pa.array([1_700_000_000_123_456], pa.timestamp("us"))})
    records = to_records(normalise(raw, plan))
    assert records.topics is None and records.values == ["a"] and records.timestamps == [1_700_000_000_123]
