"""Executor-side record checks and conversion, on plain Arrow batches."""

import pyarrow as pa
import pytest
from confluent_kafka import KafkaException, Producer

from recoverable_sink.columns import HEADERS_TYPE, SchemaPlan
from recoverable_sink.errors import RecordError, UnknownTopicError
from recoverable_sink.executor.normalise import normalise
from recoverable_sink.executor.record_checks import check_batch
from recoverable_sink.identity import record_digests
from recoverable_sink.producer.arguments import to_records


class Counts:
    """Destinations whose partition counts a test gives, every topic taking records of up to 1000 bytes."""

    def __init__(self, counts):
        self.counts = counts

    def partitions(self, topic):
        return self.counts(topic)

    def limit(self, topic):
        return 1000, "the producer's message.max.bytes=1000"


def counts(topic: str) -> int:
    if topic == "missing":
        raise UnknownTopicError(f"topic {topic} does not exist")
    return 3


def headers(*rows):
    return pa.array(rows, pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())])))


def test_null_header_key_names_the_record():
    b = pa.RecordBatch.from_pydict({"value": [b"a", b"b"],
                                    "headers": headers([{"key": "k", "value": b"1"}], [{"key": None, "value": b"2"}])})
    with pytest.raises(RecordError, match="p0, record 11: a header has a null key"):
        check_batch(b, "t", "p0", 10, Counts(counts))


def test_partition_out_of_range_names_record_and_topic():
    b = pa.RecordBatch.from_pydict({"value": [b"a", b"b"], "topic": ["t", "u"],
                                    "partition": pa.array([2, 3], pa.int32())})
    with pytest.raises(RecordError, match="record 1: partition 3 is out of range for topic u, which has 3 partitions"):
        check_batch(b, None, "p0", 0, Counts(counts))


def test_topic_column_naming_a_missing_topic_fails_before_the_wal():
    b = pa.RecordBatch.from_pydict({"value": [b"a"], "topic": ["missing"]})
    with pytest.raises(RecordError, match="topic missing does not exist"):
        check_batch(b, None, "p0", 0, Counts(counts))


def test_key_plus_value_over_the_limit_names_the_record():
    b = pa.RecordBatch.from_pydict({"key": [b"k", b"k" * 10], "value": [b"v", b"v" * 995]})
    with pytest.raises(RecordError, match=r"record 1: key\+value with the record framing is 1041 bytes"):
        check_batch(b, "t", "p0", 0, Counts(counts))


@pytest.mark.parametrize("hdrs", [[], [{"key": "a", "value": b"x" * 10}],
                                  [{"key": "k" * 200, "value": None}, {"key": "h", "value": b"y" * 130}]])
@pytest.mark.parametrize("key", [None, b"kkk"])
def test_the_size_check_refuses_exactly_what_librdkafka_refuses(hdrs, key):
    # librdkafka checks the size in produce(), before any broker is involved: no broker needed here.
    producer = Producer({"bootstrap.servers": "127.0.0.1:1", "message.max.bytes": 1000, "log_level": 0})
    disagree = []
    for n in range(500, 1000):
        value = b"v" * n
        batch = pa.RecordBatch.from_pydict({"key": pa.array([key], pa.binary()), "value": [value],
                                            "headers": headers(hdrs)})
        try:
            check_batch(batch, "t", "p0", 0, Counts(counts))
            ours = True
        except RecordError:
            ours = False
        try:
            producer.produce("t", value, key, headers=[(h["key"], h["value"]) for h in hdrs] or None)
            theirs = True
        except KafkaException:
            theirs = False
        if ours != theirs:
            disagree.append(n)
    producer.purge()
    assert not disagree


@pytest.mark.parametrize("stamp", [0, -1_000_000])
def test_a_timestamp_librdkafka_would_send_as_now_or_kafka_refuses_names_the_record(stamp):
    plan = SchemaPlan(columns=("value", "timestamp"), topic_option="t")
    raw = pa.RecordBatch.from_pydict({"value": ["a", "b"],
                                      "timestamp": pa.array([1_000_000, stamp], pa.timestamp("us"))})
    refused = r"p0, record 6: timestamp -?\d+ ms is not after 1970-01-01T00:00:00Z.*use null"
    with pytest.raises(RecordError, match=refused):
        check_batch(normalise(raw, plan), "t", "p0", 5, Counts(counts))


def test_normalise_drops_the_topic_column_under_the_option_and_keeps_milliseconds():
    plan = SchemaPlan(columns=("value", "topic", "timestamp"), topic_option="t")
    raw = pa.RecordBatch.from_pydict({"value": ["a"], "topic": ["ignored"],
                                      "timestamp": pa.array([1_700_000_000_123_456], pa.timestamp("us"))})
    records = to_records(normalise(raw, plan))
    assert records.topics is None and records.values == ["a"] and records.timestamps == [1_700_000_000_123]


def test_header_lists_give_none_for_a_record_without_headers_and_keep_the_pairs_of_the_others():
    from recoverable_sink.producer.arguments import _header_lists

    header_type = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
    headers = pa.array([[], None, [{"key": "a", "value": b"1"}, {"key": "a", "value": None}], []], header_type)
    assert _header_lists(headers.slice(1)) == [None, [("a", b"1"), ("a", None)], None]
    assert _header_lists(headers) == [None, None, [("a", b"1"), ("a", None)], None]


def test_the_quick_size_bound_is_never_below_a_records_exact_size():
    # check_batch sizes records one by one only when this bound passes the limit: a bound below some record's
    # size would let that record into the WAL and have librdkafka refuse it after.
    import random

    import pyarrow.compute as pc

    from recoverable_sink.executor.record_checks import _largest_record_bound, _record_sizes

    rng = random.Random(7)

    def blob(most: int) -> bytes | None:
        return None if rng.random() < 0.1 else bytes(rng.randrange(256) for _ in range(rng.randrange(most)))

    for _ in range(200):
        rows = rng.randrange(1, 40)
        hdrs = [None if rng.random() < 0.1 else
                [{"key": "é" * rng.randrange(20), "value": blob(300)} for _ in range(rng.randrange(4))]
                for _ in range(rows)]
        batch = pa.RecordBatch.from_pydict({
            "key": pa.array([blob(50) for _ in range(rows)], pa.binary()),
            "value": pa.array([None if rng.random() < 0.1 else "v" * rng.randrange(2000) for _ in range(rows)]),
            "headers": headers(*hdrs)})
        start = rng.randrange(rows)
        for part in (batch, batch.slice(start), batch.drop_columns(["headers"])):
            assert _largest_record_bound(part) >= (pc.max(_record_sizes(part)).as_py() or 0)


def test_a_record_whose_headers_pass_the_limit_is_named_among_small_ones():
    small = [{"key": "a", "value": b"1"}]
    b = pa.RecordBatch.from_pydict({"value": [b"v"] * 3,
                                    "headers": headers(small, [{"key": "big", "value": b"x" * 990}], small)})
    with pytest.raises(RecordError, match=r"p0, record 8: key\+value\+headers with the record framing is 1033 bytes"):
        check_batch(b, "t", "p0", 7, Counts(counts))


def test_extra_columns_are_left_out_of_the_plan_with_one_warning(caplog):
    import logging

    from pyspark.sql.types import LongType, StringType, StructField, StructType

    from recoverable_sink.driver.schema import plan_schema

    schema = StructType([StructField("value", StringType()), StructField("extra", LongType()),
                         StructField("other", StringType())])
    with caplog.at_level(logging.WARNING, logger="recoverable_sink.schema"):
        plan = plan_schema(schema, "t")
    assert plan.columns == ("value",)
    assert [r.getMessage().split(" are not")[0] for r in caplog.records] == ["column(s) extra, other"]


@pytest.mark.parametrize("value_type", [pa.string(), pa.binary()])
def test_headers_given_as_a_map_become_spark_s_list_of_key_value_with_the_same_digest(value_type):
    entries = [[("trace", "t-1"), ("empty", None)], None, [], [("only", "x")]]
    as_map = pa.array([[(k, v if v is None or value_type == pa.string() else v.encode()) for k, v in row]
                       if row is not None else None for row in entries], pa.map_(pa.string(), value_type))
    as_list = pa.array([[{"key": k, "value": v.encode() if v is not None else None} for k, v in row]
                        if row is not None else None for row in entries], HEADERS_TYPE)
    plan = SchemaPlan(columns=("value", "headers"), topic_option="t")
    values = pa.array([b"a", b"b", b"c", b"d"], pa.binary())
    for first in (0, 1):  # a batch Spark sliced: the map's offsets do not start at 0
        from_map = normalise(pa.RecordBatch.from_arrays([values, as_map], ["value", "headers"]).slice(first), plan)
        from_list = normalise(pa.RecordBatch.from_arrays([values, as_list], ["value", "headers"]).slice(first), plan)
        assert from_map.column("headers").type == HEADERS_TYPE
        assert from_map.column("headers").to_pylist() == from_list.column("headers").to_pylist()
        assert record_digests(from_map, "t", "c") == record_digests(from_list, "t", "c")


def test_the_driver_takes_headers_as_a_map_of_string_or_binary_values_and_names_any_other_map():
    from pyspark.sql.types import BinaryType, IntegerType, MapType, StringType, StructField, StructType

    from recoverable_sink.driver.schema import plan_schema
    from recoverable_sink.errors import SchemaError

    def schema(value_type):
        return StructType([StructField("value", StringType()),
                           StructField("headers", MapType(StringType(), value_type))])

    for value_type in (StringType(), BinaryType()):
        assert plan_schema(schema(value_type), "t").columns == ("value", "headers")
    with pytest.raises(SchemaError, match=r"column headers has type map<string,int>; .*map<string, string> or "
                                          r"map<string, binary>.*create_map"):
        plan_schema(schema(IntegerType()), "t")
