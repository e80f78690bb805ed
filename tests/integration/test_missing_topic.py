"""A write to a topic that does not exist behaves as Spark's format("kafka") on the same brokers: created with the
brokers' defaults where they auto-create topics, in both delivery modes and for a topic column; refused on the driver,
naming the topic, where they do not, or where topic.mustExist=true asks for the strict check."""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka.admin import AdminClient
from pyspark.sql import functions as F

from recoverable_sink import RecoverableKafkaDataSource
from testing.chaos.checker import ids_in_topic, verdict
from testing.spark import sink_writer

ROWS = 3000


@pytest.fixture(scope="module", autouse=True)
def registered(spark):
    spark.dataSource.register(RecoverableKafkaDataSource)


def _frame(spark, topic_column: str | None = None):
    df = spark.range(ROWS, numPartitions=3).select(F.col("id").cast("string").alias("key"),
                                                   F.lit("v").alias("value"))
    return df.withColumn("topic", F.lit(topic_column)) if topic_column else df


def _partitions(cluster, topic) -> int:
    return len(AdminClient({"bootstrap.servers": cluster.bootstrap_servers}).list_topics(topic, timeout=10)
               .topics[topic].partitions)


@pytest.mark.parametrize("mode", ["at_least_once", "exactly_once"])
def test_a_missing_topic_is_created_as_the_brokers_would_auto_create_it(spark, kafka_defaults, tmp_path, mode):
    topic = f"created-{uuid.uuid4().hex[:8]}"
    sink_writer(_frame(spark), kafka_defaults.bootstrap_servers, topic, tmp_path / "wal",
                **{"delivery.guarantee": mode}).save()
    assert _partitions(kafka_defaults, topic) == 1  # the broker's num.partitions, as its auto-creation would give
    found = ids_in_topic(kafka_defaults.bootstrap_servers, topic, expected=ROWS)
    assert verdict((str(i) for i in range(ROWS)), found) == (0, 0, 0)


def test_a_topic_columns_missing_topic_is_created_too(spark, kafka_defaults, tmp_path):
    topic = f"column-{uuid.uuid4().hex[:8]}"
    sink_writer(_frame(spark, topic), kafka_defaults.bootstrap_servers, None, tmp_path / "wal").save()
    found = ids_in_topic(kafka_defaults.bootstrap_servers, topic, expected=ROWS)
    assert verdict((str(i) for i in range(ROWS)), found) == (0, 0, 0)


def test_topic_must_exist_refuses_a_missing_topic_on_the_driver_even_where_brokers_auto_create(
        spark, kafka_defaults, tmp_path):
    topic = f"typo-{uuid.uuid4().hex[:8]}"
    with pytest.raises(Exception, match=f"option topic={topic}: the topic does not exist .* topic.mustExist=true"):
        sink_writer(_frame(spark), kafka_defaults.bootstrap_servers, topic, tmp_path / "wal",
                    **{"topic.mustExist": "true"}).save()
    assert topic not in AdminClient({"bootstrap.servers": kafka_defaults.bootstrap_servers}).list_topics(
        timeout=10).topics


def test_brokers_that_do_not_auto_create_topics_get_the_clear_error(spark, kafka, tmp_path):
    topic = f"absent-{uuid.uuid4().hex[:8]}"
    with pytest.raises(Exception, match=r"the brokers do not auto-create topics \(auto.create.topics.enable=false\)"):
        sink_writer(_frame(spark), kafka.bootstrap_servers, topic, tmp_path / "wal").save()
