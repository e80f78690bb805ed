"""delivery.guarantee=exactly_once on real Spark and a real broker: what a read_committed consumer sees, the
commit markers' life, and the driver-side refusals. The faults are in test_chaos (both modes)."""

import json

import pyarrow as pa
import pytest
from confluent_kafka import ConsumerGroupTopicPartitions
from confluent_kafka.admin import AdminClient
from pyspark.sql import functions as F

from recoverable_sink import RecoverableKafkaDataSource
from recoverable_sink.contract import TaskIdentity
from recoverable_sink.errors import DeliveryError
from recoverable_sink.options import parse_options
from recoverable_sink.preflight import check_cluster
from recoverable_sink.records import SchemaPlan
from recoverable_sink.task import PartitionWriter
from testing.chaos.checker import ids_in_topic
from testing.spark import sink_writer

EO = {"delivery.guarantee": "exactly_once"}


@pytest.fixture(scope="module", autouse=True)
def registered(spark):
    spark.dataSource.register(RecoverableKafkaDataSource)


def _markers(kafka, groups):
    """The groups among ``groups`` that hold a committed offset (a commit marker)."""
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})
    held = []
    for group in groups:
        result = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group].result()
        if any(tp.offset >= 0 for tp in result.topic_partitions or []):
            held.append(group)
    return held


def _ids(spark, n, partitions=4):
    return spark.range(n, numPartitions=partitions).select(F.col("id").cast("string").alias("key"),
                                                           F.lit("v").alias("value"))


def test_every_record_once_for_read_committed_and_markers_gone_after_commit(spark, kafka, new_topic, tmp_path):
    topic = new_topic(4)
    sink_writer(_ids(spark, 5000), kafka.bootstrap_servers, topic, tmp_path / "wal",
                **{**EO, "transactional.id.prefix": "eo-a-", "summary.path": str(tmp_path / "s.jsonl")}).save()
    found = ids_in_topic(kafka.bootstrap_servers, topic, expected=5000)
    assert (len(found), sum(found.values())) == (5000, 5000)
    summary = json.loads((tmp_path / "s.jsonl").read_text().splitlines()[-1])
    assert summary["acknowledged"] == 5000
    # A generated-id write's markers are deleted at its commit.
    assert _markers(kafka, [f"eo-a-{summary['write_id']}-{p}" for p in range(4)]) == []


def test_rerun_of_a_committed_write_id_sends_nothing(spark, kafka, new_topic, tmp_path):
    topic = new_topic(2)
    options = {**EO, "transactional.id.prefix": "eo-b-", "wal.writeId": "eo-rerun-1",
               "summary.path": str(tmp_path / "s.jsonl")}
    for _ in range(2):
        sink_writer(_ids(spark, 3000, 3), kafka.bootstrap_servers, topic, tmp_path / "wal", **options).save()
    found = ids_in_topic(kafka.bootstrap_servers, topic, expected=3000)
    assert (len(found), sum(found.values())) == (3000, 3000)
    second = json.loads((tmp_path / "s.jsonl").read_text().splitlines()[-1])
    assert (second["published"], second["skipped"]) == (0, 3000)
    # Markers of a wal.writeId write stay (that is what made the re-run send nothing), one per partition.
    groups = [f"eo-b-eo-rerun-1-{p}" for p in range(3)]
    assert _markers(kafka, groups) == groups


def test_transaction_timeout_above_the_brokers_maximum_fails_on_the_driver(spark, kafka, new_topic, tmp_path):
    topic = new_topic(1)
    with pytest.raises(Exception, match=r"kafka\.transaction\.timeout\.ms=3600000 exceeds the brokers' "
                                         r"transaction\.max\.timeout\.ms=900000"):
        sink_writer(_ids(spark, 10, 1), kafka.bootstrap_servers, topic, tmp_path / "wal",
                    **{**EO, "kafka.transaction.timeout.ms": "3600000"}).save()
    assert ids_in_topic(kafka.bootstrap_servers, topic) == {}


def test_a_zombie_attempt_is_fenced_by_a_copy_on_another_host_and_nothing_repeats(kafka, new_topic, tmp_path):
    """Speculative copies and zombies, at the task level (Spark never places a speculative copy on the host of
    the attempt it doubles, so one machine cannot make Spark do it): attempt 0 is mid-transaction when attempt
    1 starts on another host (another WAL), sends the whole partition and commits; attempt 0 must then fail,
    and an attempt starting later must send nothing."""
    topic = new_topic(2)
    plan = SchemaPlan(columns=("key", "value"), topic_option=topic)

    def host(name):
        return parse_options({"kafka.bootstrap.servers": kafka.bootstrap_servers, "topic": topic, **EO,
                              "transactional.id.prefix": "zombie-", "wal.path": str(tmp_path / name)})

    cluster_id = check_cluster(host("a"))
    data = [pa.RecordBatch.from_pydict({"key": [b"%05d" % i for i in range(s, s + 500)],
                                        "value": [b"v"] * 500}) for s in range(0, 3000, 500)]
    zombie = PartitionWriter(host("a"), plan, TaskIdentity("wz", 0, 0), cluster_id)
    for batch in data[:3]:
        zombie.write(batch)  # two batches handed to the producer inside its transaction, one logged

    copy = PartitionWriter(host("b"), plan, TaskIdentity("wz", 0, 1), cluster_id)  # fences the zombie
    for batch in data:
        copy.write(batch)
    assert copy.commit().acknowledged == 3000

    with pytest.raises(DeliveryError, match="partition 0 \\(attempt 0\\) of write wz: .*fenced this one"):
        try:
            for batch in data[3:]:
                zombie.write(batch)
            zombie.commit()
        except BaseException:
            zombie.abort()
            raise

    late = PartitionWriter(host("c"), plan, TaskIdentity("wz", 0, 2), cluster_id)
    for batch in data:
        late.write(batch)
    message = late.commit()
    assert (message.committed_before, message.published, message.skipped) == (True, 0, 3000)

    found = ids_in_topic(kafka.bootstrap_servers, topic, expected=3000)
    assert (len(found), sum(found.values())) == (3000, 3000)


def test_a_committed_transaction_shorter_than_the_recomputed_partition_fails_instead_of_skipping(kafka, new_topic,
                                                                                                tmp_path):
    """Found by the fault campaign: a task reading a shuffle whose fetch failed saw its input end early and
    committed only part of its partition. A retry that finds the committed marker must not skip the whole
    partition when the marker's record count differs from what it recomputed: it fails, naming both counts."""
    topic = new_topic(1)
    plan = SchemaPlan(columns=("key", "value"), topic_option=topic)
    options = parse_options({"kafka.bootstrap.servers": kafka.bootstrap_servers, "topic": topic, **EO,
                             "transactional.id.prefix": "short-", "wal.path": str(tmp_path / "wal")})
    cluster_id = check_cluster(options)
    data = [pa.RecordBatch.from_pydict({"key": [b"%05d" % i for i in range(s, s + 500)], "value": [b"v"] * 500})
            for s in range(0, 2000, 500)]
    cut_short = PartitionWriter(options, plan, TaskIdentity("ws", 0, 0), cluster_id)
    for batch in data[:2]:
        cut_short.write(batch)
    assert cut_short.commit().acknowledged == 1000

    retry = PartitionWriter(options, plan, TaskIdentity("ws", 0, 1), cluster_id)
    for batch in data:
        retry.write(batch)
    with pytest.raises(DeliveryError, match="committed 1000 records of this partition .* now has 2000"):
        retry.commit()

    same = PartitionWriter(options, plan, TaskIdentity("ws", 0, 2), cluster_id)
    for batch in data[:2]:
        same.write(batch)
    assert same.commit().committed_before  # the same input as the committed attempt: skipped, as before
