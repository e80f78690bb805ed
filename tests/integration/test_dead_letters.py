"""Dead letters on a real broker and real Spark (errors.tolerance=all): in both modes, with the Python worker of
every task's first attempt SIGKILLed mid-write, every good record lands once in its topic and every refused one once
in the dead-letter topic, as a read_committed consumer counts them; each refusal class is routed; and a write
without the option fails on the first refused record as before."""

from __future__ import annotations

import json
import uuid

import pytest
from confluent_kafka import Consumer
from pyspark.sql import functions as F

from recoverable_sink import RecoverableKafkaDataSource
from recoverable_sink.executor import dead_letters as dl
from testing.chaos.checker import ids_in_topic, verdict
from testing.spark import sink_writer

ROWS = 20_000
MODES = pytest.mark.parametrize("mode", ["at_least_once", "exactly_once"])


@pytest.fixture(scope="module", autouse=True)
def registered(spark):
    spark.dataSource.register(RecoverableKafkaDataSource)


def _kind(i: int) -> str | None:
    """The refusal row i carries, if any (about 0.6% of rows, five classes)."""
    return {101: "RecordTooLarge", 233: "PartitionOutOfRange", 347: "NegativePartition",
            461: "TimestampBeforeEpoch", 577: "NullHeaderKey"}.get(i % 1000)


def _frame(spark):
    """Keyed by id; value 3 KB where too large for the topic (max.message.bytes 2000), partition 99 or -1, a
    timestamp in 1960, a header without a key: the rows of :func:`_kind`."""
    ids = F.col("id") % 1000
    return spark.range(ROWS, numPartitions=4).select(
        F.col("id").cast("string").alias("key"),
        F.when(ids == 101, F.repeat(F.lit("x"), 3000)).otherwise(F.col("id").cast("string")).cast("binary")
        .alias("value"),
        F.when(ids == 233, F.lit(99)).when(ids == 347, F.lit(-1)).otherwise(F.lit(None)).cast("int")
        .alias("partition"),
        F.when(ids == 461, F.lit("1960-01-01 00:00:00").cast("timestamp"))
        .otherwise(F.lit(None).cast("timestamp")).alias("timestamp"),
        F.array(F.struct(F.when(ids == 577, F.lit(None).cast("string")).otherwise(F.lit("h")).alias("key"),
                         F.lit(b"1").cast("binary").alias("value"))).alias("headers"),
    )


def _summary(path) -> dict:
    return json.loads(path.read_text().splitlines()[-1])


@MODES
def test_refused_records_land_once_in_the_dead_letter_topic_and_the_rest_once_in_theirs_under_a_worker_kill(
        spark, kafka, new_topic, tmp_path, mode):
    topic, dead = new_topic(partitions=4, **{"max.message.bytes": "2000"}), new_topic(partitions=2)
    sink_writer(_frame(spark), kafka.bootstrap_servers, topic, tmp_path / "wal",
                **{"delivery.guarantee": mode, "errors.tolerance": "all", "errors.deadletterqueue.topic.name": dead,
                   "summary.path": str(tmp_path / "s.jsonl"), "_test.killAfterRecords": "2000",
                   "transactional.id.prefix": f"dlq-{uuid.uuid4().hex[:8]}-"}).save()
    refused = [str(i) for i in range(ROWS) if _kind(i)]
    good = [str(i) for i in range(ROWS) if not _kind(i)]
    assert verdict(good, ids_in_topic(kafka.bootstrap_servers, topic, expected=len(good))) == (0, 0, 0)
    assert verdict(refused, ids_in_topic(kafka.bootstrap_servers, dead, expected=len(refused))) == (0, 0, 0)
    summary = _summary(tmp_path / "s.jsonl")
    assert summary["retried_partitions"] == 4 and summary["dead_letter_topic"] == dead
    assert summary["dead_lettered"] == {kind: ROWS // 1000 for kind in
                                        ("NegativePartition", "NullHeaderKey", "PartitionOutOfRange",
                                         "RecordTooLarge", "TimestampBeforeEpoch")}


def test_a_dead_letter_carries_its_record_as_it_was_and_connects_headers(spark, kafka, new_topic, tmp_path):
    topic, dead = new_topic(partitions=4, **{"max.message.bytes": "2000"}), new_topic()
    sink_writer(_frame(spark).where("id < 1000"), kafka.bootstrap_servers, topic, tmp_path / "wal",
                **{"errors.tolerance": "all", "errors.deadletterqueue.topic.name": dead}).save()
    consumer = Consumer({"bootstrap.servers": kafka.bootstrap_servers, "group.id": uuid.uuid4().hex,
                         "auto.offset.reset": "earliest", "isolation.level": "read_committed"})
    consumer.subscribe([dead])
    got = {}
    try:
        while len(got) < 5:
            msg = consumer.poll(30)
            assert msg is not None, f"only {len(got)} dead letters read"
            got[msg.key().decode()] = msg
    finally:
        consumer.close()
    too_large = got["101"]
    assert too_large.value() == b"x" * 3000
    headers = dict(too_large.headers())
    assert headers[dl.H_TOPIC] == topic.encode() and headers[dl.H_EXCEPTION] == b"RecordTooLarge"
    assert headers[dl.H_STAGE] == b"KAFKA_PRODUCE" and b"max.message.bytes=2000" in headers[dl.H_MESSAGE]
    assert dict(got["233"].headers())[dl.H_PARTITION] == b"99"
    assert got["461"].timestamp()[1] > 0  # the producer stamped it
    assert (b"", b"1") in [(k.encode(), v) for k, v in got["577"].headers()]  # the key-less header, kept


@MODES
def test_a_null_or_unknown_topic_in_a_topic_column_goes_to_the_dead_letter_topic(spark, kafka, new_topic, tmp_path,
                                                                                    mode):
    topic, dead = new_topic(partitions=2), new_topic()
    missing = f"missing-{uuid.uuid4().hex[:8]}"
    df = spark.range(3000, numPartitions=3).select(
        F.col("id").cast("string").alias("key"), F.col("id").cast("string").alias("value"),
        F.when(F.col("id") % 100 == 7, F.lit(None)).when(F.col("id") % 100 == 8, F.lit(missing))
        .otherwise(F.lit(topic)).alias("topic"))
    sink_writer(df, kafka.bootstrap_servers, None, tmp_path / "wal",
                **{"delivery.guarantee": mode, "topic.mustExist": "true", "errors.tolerance": "all",
                   "errors.deadletterqueue.topic.name": dead, "summary.path": str(tmp_path / "s.jsonl"),
                   "transactional.id.prefix": f"dlq-{uuid.uuid4().hex[:8]}-"}).save()
    refused = [str(i) for i in range(3000) if i % 100 in (7, 8)]
    good = [str(i) for i in range(3000) if i % 100 not in (7, 8)]
    assert verdict(good, ids_in_topic(kafka.bootstrap_servers, topic, expected=len(good))) == (0, 0, 0)
    assert verdict(refused, ids_in_topic(kafka.bootstrap_servers, dead, expected=len(refused))) == (0, 0, 0)
    assert _summary(tmp_path / "s.jsonl")["dead_lettered"] == {"NullTopic": 30, "UnknownTopic": 30}


def test_without_the_option_a_refused_record_fails_the_write_naming_it(spark, kafka, new_topic, tmp_path):
    topic = new_topic(partitions=4, **{"max.message.bytes": "2000"})
    with pytest.raises(Exception, match=r"record \d+: key\+value\+headers with the record framing is \d+ bytes, more "
                                        r"than 1968 bytes"):
        sink_writer(_frame(spark).where("id % 1000 = 101"), kafka.bootstrap_servers, topic, tmp_path / "wal").save()


def test_an_exactly_once_partition_whose_every_record_is_a_dead_letter_commits_them(spark, kafka, new_topic,
                                                                                      tmp_path):
    """With a topic column, a partition of dead letters alone still has a topic for its commit marker (the
    dead-letter topic's): its transaction commits instead of being aborted as empty."""
    dead = new_topic()
    df = spark.range(30, numPartitions=1).select(F.col("id").cast("string").alias("key"),
                                                 F.col("id").cast("string").alias("value"),
                                                 F.lit(None).cast("string").alias("topic"))
    sink_writer(df, kafka.bootstrap_servers, None, tmp_path / "wal",
                **{"delivery.guarantee": "exactly_once", "errors.tolerance": "all",
                   "errors.deadletterqueue.topic.name": dead,
                   "transactional.id.prefix": f"dlq-{uuid.uuid4().hex[:8]}-"}).save()
    assert verdict([str(i) for i in range(30)], ids_in_topic(kafka.bootstrap_servers, dead, expected=30)) == (0, 0, 0)


def test_a_missing_dead_letter_topic_is_created_where_brokers_auto_create_and_refused_where_not(
        spark, kafka, kafka_defaults, tmp_path):
    from confluent_kafka.admin import AdminClient

    df = spark.range(10, numPartitions=1).select(F.col("id").cast("string").alias("key"),
                                                 F.col("id").cast("string").alias("value"))
    for cluster in (kafka, kafka_defaults):
        cluster.create_topic(topic := f"main-{uuid.uuid4().hex[:8]}", 1, 1)
        dead = f"dead-{uuid.uuid4().hex[:8]}"
        write = sink_writer(df, cluster.bootstrap_servers, topic, tmp_path / "wal",
                            **{"errors.tolerance": "all", "errors.deadletterqueue.topic.name": dead})
        if cluster is kafka:
            with pytest.raises(Exception, match=f"errors.deadletterqueue.topic.name={dead}: the topic does not exist "
                                                r".*auto.create.topics.enable=false"):
                write.save()
        else:
            write.save()
            assert dead in AdminClient({"bootstrap.servers": cluster.bootstrap_servers}).list_topics(timeout=10).topics


@MODES
def test_a_topic_column_s_records_too_large_for_their_topic_and_null_topics_are_dead_letters_counted_in_the_summary(
        spark, kafka, new_topic, tmp_path, mode):
    """Issue 63, item 1: with a topic column, a record too large for the topic its row names (not the topic
    option's, there is none) is a dead letter as a null topic is, in both modes, and the summary counts both."""
    small, large, dead = new_topic(2, **{"max.message.bytes": "2000"}), new_topic(2), new_topic()
    df = spark.range(4000, numPartitions=4).select(
        F.col("id").cast("string").alias("key"),
        F.when(F.col("id") % 100 == 3, F.repeat(F.lit("x"), 3000)).otherwise(F.col("id").cast("string"))
        .alias("value"),
        F.when(F.col("id") % 100 == 7, F.lit(None)).when(F.col("id") % 2 == 0, F.lit(large))
        .otherwise(F.lit(small)).alias("topic"))
    sink_writer(df, kafka.bootstrap_servers, None, tmp_path / "wal",
                **{"delivery.guarantee": mode, "errors.tolerance": "all", "errors.deadletterqueue.topic.name": dead,
                   "summary.path": str(tmp_path / "s.jsonl"),
                   "transactional.id.prefix": f"dlq-{uuid.uuid4().hex[:8]}-"}).save()
    too_large = [str(i) for i in range(4000) if i % 100 == 3 and i % 2 == 1]  # 3 KB rows of the small topic
    null = [str(i) for i in range(4000) if i % 100 == 7]
    assert verdict(too_large + null, ids_in_topic(kafka.bootstrap_servers, dead, expected=80)) == (0, 0, 0)
    assert _summary(tmp_path / "s.jsonl")["dead_lettered"] == {"NullTopic": 40, "RecordTooLarge": 40}


@MODES
def test_a_failed_write_s_summary_counts_what_its_finished_partitions_delivered_and_dead_lettered(
        spark, kafka, new_topic, tmp_path, mode):
    """Issue 63, item 1, the driver's side: a write with a topic column whose last partition fails for good (a null
    topic's record too large for the dead-letter topic as well), after the other partitions finished with null-topic
    dead letters. The abort's summary counts what those delivered and dead-lettered, and says where the rest is."""
    import time

    topic, dead = new_topic(2), new_topic(1, **{"max.message.bytes": "2000"})
    bad = 3999  # the last row of partition 3, reached 3 s into each of its attempts: the others finish first

    def late(i: int) -> str:
        if i == bad:
            time.sleep(3)
        return str(i)

    df = spark.range(4000, numPartitions=4).select(
        F.col("id").cast("string").alias("key"),
        F.concat(F.udf(late, "string")("id"), F.when(F.col("id") == bad, F.repeat(F.lit("x"), 3000))
                 .otherwise(F.lit(""))).alias("value"),
        F.when((F.col("id") % 100 == 7) & (F.col("id") < 3000), F.lit(None)).when(F.col("id") == bad, F.lit(None))
        .otherwise(F.lit(topic)).alias("topic"))
    with pytest.raises(Exception, match="the dead-letter topic .* would refuse it too"):
        sink_writer(df, kafka.bootstrap_servers, None, tmp_path / "wal",
                    **{"delivery.guarantee": mode, "errors.tolerance": "all",
                       "errors.deadletterqueue.topic.name": dead, "summary.path": str(tmp_path / "s.jsonl"),
                       "transactional.id.prefix": f"dlq-{uuid.uuid4().hex[:8]}-"}).save()
    summary = _summary(tmp_path / "s.jsonl")
    assert (summary["event"], summary["finished"], summary["unfinished"]) == ("abort", [0, 1, 2], [3]), summary
    assert (summary["received"], summary["acknowledged"]) == (3000, 3000)
    assert (summary["dead_lettered"], summary["dead_letter_topic"]) == ({"NullTopic": 30}, dead)
    assert verdict([str(i) for i in range(3000) if i % 100 == 7],
                   ids_in_topic(kafka.bootstrap_servers, dead, expected=30)) == (0, 0, 0)
