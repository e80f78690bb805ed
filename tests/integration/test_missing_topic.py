"""A write to a topic that does not exist behaves as Spark's format("kafka") on the same brokers: created with the
brokers' defaults where they auto-create topics, in both delivery modes and for a topic column; refused on the driver,
naming the topic, where they do not, or where topic.mustExist=true asks for the strict check; a stream's writers
reuse the driver's answers for a while; the topic.creation.default.* options make the topics the sink creates."""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka.admin import AdminClient
from pyspark.sql import functions as F

from recoverable_sink import RecoverableKafkaDataSource
from recoverable_sink.errors import OptionError
from testing.chaos.checker import ids_in_topic, verdict
from testing.spark import sink_writer
from testing.waiting import wait_until

ROWS = 3000


@pytest.fixture(scope="module", autouse=True)
def registered(spark):
    spark.dataSource.register(RecoverableKafkaDataSource)


def _frame(spark, topic_column: str | None = None):
    df = spark.range(ROWS, numPartitions=3).select(F.col("id").cast("string").alias("key"),
                                                   F.lit("v").alias("value"))
    return df.withColumn("topic", F.lit(topic_column)) if topic_column else df


def _topics(cluster) -> set[str]:
    return set(AdminClient({"bootstrap.servers": cluster.bootstrap_servers}).list_topics(timeout=10).topics)


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


def test_a_streams_writers_reuse_the_drivers_checks_within_their_window_and_a_batch_write_always_checks(
        kafka, new_topic, monkeypatch):
    from pyspark.sql.types import BinaryType, StructField, StructType

    from recoverable_sink.driver import source

    monkeypatch.setattr(source, "_RECENT", source.RecentChecks())  # no answer left by another test
    schema = StructType([StructField("value", BinaryType())])
    topic = new_topic()
    options = {"kafka.bootstrap.servers": kafka.bootstrap_servers, "topic": topic}
    ds = source.RecoverableKafkaDataSource(options)
    ds.streamWriter(schema, False)
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})  # held until its answer came
    admin.delete_topics([topic])[topic].result(timeout=30)
    wait_until(lambda: topic not in _topics(kafka), 30, f"topic {topic} deleted")
    # Within the window a stream's next writer (the next micro-batch, or its commit) is made from the answers above.
    assert ds.streamWriter(schema, False).options.topic == topic
    # A batch write, other options, or the window past: checked again, and the missing topic said on the driver.
    with pytest.raises(OptionError, match=topic):
        ds.writer(schema, False)
    with pytest.raises(OptionError, match=topic):
        source.RecoverableKafkaDataSource({**options, "kafka.linger.ms": "7"}).streamWriter(schema, False)
    monkeypatch.setattr(source.RecentChecks, "REUSE_S", 0.0)
    with pytest.raises(OptionError, match=topic):
        ds.streamWriter(schema, False)


def _configs(cluster, topic) -> dict[str, str]:
    from confluent_kafka.admin import ConfigResource, ResourceType

    resource = ConfigResource(ResourceType.TOPIC, topic)
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
    return {k: v.value for k, v in admin.describe_configs([resource])[resource].result(timeout=30).items()}


CREATION = {"topic.creation.default.partitions": "3", "topic.creation.default.replication.factor": "1",
            "topic.creation.default.retention.ms": "3600000", "topic.creation.default.max.message.bytes": "2000000"}


def test_the_topic_creation_options_make_the_topic_option_s_topic_a_topic_column_s_and_the_dead_letter_topic(
        spark, kafka_defaults, tmp_path):
    """Kafka Connect's topic.creation.default.* options: partitions, replication factor and any topic config, for
    every topic the sink creates (on the driver for the topic option and the dead-letter topic, in the tasks for a
    topic column's)."""
    named, column, dead = (f"{kind}-{uuid.uuid4().hex[:8]}" for kind in ("named", "column", "dead"))
    sink_writer(_frame(spark), kafka_defaults.bootstrap_servers, named, tmp_path / "wal1",
                **{**CREATION, "errors.tolerance": "all", "errors.deadletterqueue.topic.name": dead}).save()
    sink_writer(_frame(spark, column), kafka_defaults.bootstrap_servers, None, tmp_path / "wal2", **CREATION).save()
    for topic in (named, column, dead):
        assert _partitions(kafka_defaults, topic) == 3, topic
        configs = _configs(kafka_defaults, topic)
        assert (configs["retention.ms"], configs["max.message.bytes"]) == ("3600000", "2000000"), topic
    for topic in (named, column):
        assert verdict((str(i) for i in range(ROWS)), ids_in_topic(kafka_defaults.bootstrap_servers, topic,
                                                                   expected=ROWS)) == (0, 0, 0)


@pytest.mark.parametrize(("option", "value"), [("topic.creation.default.retention.msec", "1000"),
                                               ("topic.creation.default.replication.factor", "3")])
def test_topic_creation_options_the_brokers_refuse_fail_on_the_driver_naming_the_option(
        spark, kafka_defaults, tmp_path, option, value):
    """A misspelt topic config, or a replication factor the one broker cannot give, fails before any task runs and
    before any topic is made, even for a topic column's topics (which only the tasks would create)."""
    column = f"never-{uuid.uuid4().hex[:8]}"
    with pytest.raises(Exception, match=f"option {option}: the brokers would refuse to create a topic"):
        sink_writer(_frame(spark, column), kafka_defaults.bootstrap_servers, None, tmp_path / "wal",
                    **{option: value}).save()
    assert column not in _topics(kafka_defaults)
