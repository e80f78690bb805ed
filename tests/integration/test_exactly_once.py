"""delivery.guarantee=exactly_once on real Spark and a real broker: what a read_committed consumer sees, the
commit markers' life, and the driver-side refusals. The faults are in test_chaos (both modes)."""

import json

import pytest
from confluent_kafka import ConsumerGroupTopicPartitions
from confluent_kafka.admin import AdminClient
from pyspark.sql import functions as F

from recoverable_sink import RecoverableKafkaDataSource
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
