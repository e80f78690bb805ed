"""Bad input gets a clear error naming the column, option or record, raised on the driver (before any task
runs) where the schema or options allow, and nothing accepted is lost."""

import os

import pytest
from pyspark.sql import functions as F

from recoverable_sink import RecoverableKafkaDataSource
from recoverable_sink.wal import open_wal
from testing.kafka_check import read_topic
from testing.spark import sink_writer


@pytest.fixture(scope="module", autouse=True)
def registered(spark):
    spark.dataSource.register(RecoverableKafkaDataSource)


def write(df, bootstrap, wal, topic=None, mode="append", **options):
    sink_writer(df, bootstrap, topic or None, wal, **options).mode(mode).save()


def assert_driver_side(wal):
    """No task ran: tasks create the WAL directory before anything else."""
    assert not os.path.exists(wal)


@pytest.mark.parametrize(
    ("select", "match"),
    [
        (["CAST(id AS STRING) AS key"], "needs a value column"),
        (["id AS value"], "column value has type bigint"),
        (["id AS key", "CAST(id AS STRING) AS value"], "column key has type bigint"),
        (["CAST(id AS STRING) AS value", "array(named_struct('key', 'k', 'value', 'v')) AS headers"],
         "column headers has type array<struct<key:string,value:string>>"),
        (["CAST(id AS STRING) AS value", "CAST(id AS BIGINT) AS partition"], "column partition has type bigint"),
    ],
)
def test_schema_problems_fail_on_the_driver(spark, kafka, new_topic, tmp_path, select, match):
    wal = tmp_path / "wal"
    with pytest.raises(Exception, match=match):
        write(spark.range(3).selectExpr(*select), kafka.bootstrap_servers, wal, new_topic())
    assert_driver_side(wal)


def test_an_extra_column_is_ignored_as_format_kafka_does(spark, kafka, new_topic, tmp_path):
    topic = new_topic()
    write(spark.range(3).selectExpr("CAST(id AS STRING) AS value", "id AS extra"), kafka.bootstrap_servers,
          tmp_path / "wal", topic)
    assert sorted(r["value"] for r in read_topic(kafka.bootstrap_servers, topic, 30, expected=3)) == [b"0", b"1", b"2"]


def test_missing_topic_fails_on_the_driver(spark, kafka, tmp_path):
    with pytest.raises(Exception, match="no topic: set the topic option or add a topic column"):
        write(spark.range(3).selectExpr("CAST(id AS STRING) AS value"), kafka.bootstrap_servers, tmp_path / "wal")
    assert_driver_side(tmp_path / "wal")


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"kafka.acks": "1"}, r"kafka\.acks=1 would let Kafka acknowledge"),
        ({"kafka.linger.ms": "soon"}, r"kafka\.linger\.ms is not valid"),
        ({"kafka.no.such.setting": "1"}, r"kafka\.no\.such\.setting is not valid"),
        ({"kafka.value.serializer": "x"}, r"kafka\.value\.serializer is not supported"),
        ({"wal.maxBytes": "-5"}, r"wal\.maxBytes"),
    ],
)
def test_bad_options_fail_on_the_driver(spark, kafka, new_topic, tmp_path, options, match):
    with pytest.raises(Exception, match=match):
        write(spark.range(3).selectExpr("CAST(id AS STRING) AS value"), kafka.bootstrap_servers,
              tmp_path / "wal", new_topic(), **options)
    assert_driver_side(tmp_path / "wal")


def test_unknown_topic_fails_on_the_driver(spark, kafka, tmp_path):
    with pytest.raises(Exception, match="option topic=no-such-topic: the topic does not exist"):
        write(spark.range(3).selectExpr("CAST(id AS STRING) AS value"), kafka.bootstrap_servers,
              tmp_path / "wal", "no-such-topic")
    assert_driver_side(tmp_path / "wal")


def test_unreachable_bootstrap_servers_fail_on_the_driver(spark, tmp_path):
    with pytest.raises(Exception, match=r"kafka\.bootstrap\.servers=127\.0\.0\.1:1: every address refused"):
        write(spark.range(3).selectExpr("CAST(id AS STRING) AS value"), "127.0.0.1:1", tmp_path / "wal", "t",
              **{"preflight.timeoutMs": "2000"})
    assert_driver_side(tmp_path / "wal")


@pytest.mark.parametrize(("mode", "match"), [("overwrite", "save mode Overwrite is not supported"),
                                             ("ignore", "Ignore"), ("errorifexists", "ErrorIfExists")])
def test_save_modes_other_than_append_are_refused(spark, kafka, new_topic, tmp_path, mode, match):
    with pytest.raises(Exception, match=match):
        write(spark.range(3).selectExpr("CAST(id AS STRING) AS value"), kafka.bootstrap_servers,
              tmp_path / "wal", new_topic(), mode=mode)
    assert_driver_side(tmp_path / "wal")


# ---- problems only the data shows: raised in the task, before the offending batch enters the WAL ----------

def test_null_topic_in_a_row_names_the_record(spark, kafka, new_topic, tmp_path):
    df = spark.range(10, numPartitions=1).select(
        F.col("id").cast("string").alias("value"),
        F.when(F.col("id") == 7, F.lit(None)).otherwise(F.lit(new_topic())).alias("topic"))
    with pytest.raises(Exception, match="record 7: topic is null"):
        write(df, kafka.bootstrap_servers, tmp_path / "wal")


def test_partition_out_of_range_names_record_and_topic(spark, kafka, new_topic, tmp_path):
    topic = new_topic(partitions=2)
    df = spark.range(5, numPartitions=1).selectExpr("CAST(id AS STRING) AS value", "CAST(id AS INT) AS partition")
    with pytest.raises(Exception, match=f"record 2: partition 2 is out of range for topic {topic}, which has 2"):
        write(df, kafka.bootstrap_servers, tmp_path / "wal", topic)


def test_topic_column_naming_a_missing_topic_names_it(spark, kafka, tmp_path):
    df = spark.range(3, numPartitions=1).selectExpr("CAST(id AS STRING) AS value", "'missing-topic-x' AS topic")
    with pytest.raises(Exception, match="topic missing-topic-x does not exist"):
        write(df, kafka.bootstrap_servers, tmp_path / "wal")


def test_record_larger_than_message_max_bytes_names_the_record(spark, kafka, new_topic, tmp_path):
    df = spark.range(4, numPartitions=1).selectExpr(
        "CASE WHEN id = 3 THEN repeat('x', 20000) ELSE 'small' END AS value")
    too_large = r"record 3: key\+value with the record framing is 20036 bytes.*message\.max\.bytes=10000"
    with pytest.raises(Exception, match=too_large):
        write(df, kafka.bootstrap_servers, tmp_path / "wal", new_topic(), **{"kafka.message.max.bytes": "10000"})


def test_a_record_over_the_topics_max_message_bytes_is_refused_before_the_wal(spark, kafka, new_topic, tmp_path):
    """The topic's own max.message.bytes (read on the driver) is checked with the producer's limit, before the
    batch enters the WAL: nothing of the batch is logged or sent."""
    topic = new_topic(1, **{"max.message.bytes": "20000"})
    df = spark.range(4, numPartitions=1).selectExpr(
        "CASE WHEN id = 3 THEN repeat('x', 19990) ELSE 'small' END AS value")
    too_large = rf"record 3: key\+value with the record framing is 20026 bytes, more than 19968 bytes \(topic {topic}'s"
    with pytest.raises(Exception, match=too_large):
        write(df, kafka.bootstrap_servers, tmp_path / "wal", topic)
    wal = open_wal(str(tmp_path / "wal"))
    assert wal.attempts() and wal.used_bytes() == 0
    assert read_topic(kafka.bootstrap_servers, topic, 5) == []


def test_a_topic_whose_max_message_bytes_is_below_the_default_batch_size_gets_every_record(spark, kafka, new_topic,
                                                                                           tmp_path):
    """The sink batches up to 384 KiB by default (librdkafka 1 MB, the Java client 16 KB): without fitting
    batch.size to the topic's limit the broker refuses every batch as too large."""
    topic = new_topic(1, **{"max.message.bytes": "20000"})
    write(spark.range(5000, numPartitions=2).selectExpr("CAST(id AS STRING) AS key", "repeat('v', 100) AS value"),
          kafka.bootstrap_servers, tmp_path / "wal", topic)
    assert len(read_topic(kafka.bootstrap_servers, topic, 60, expected=5000)) == 5000


def test_a_batch_size_of_the_users_above_the_topics_max_message_bytes_is_refused_on_the_driver(spark, kafka,
                                                                                               new_topic, tmp_path):
    topic = new_topic(1, **{"max.message.bytes": "20000"})
    with pytest.raises(Exception, match=r"kafka\.batch\.size=100000 exceeds topic .*max\.message\.bytes=20000"):
        write(spark.range(10).selectExpr("CAST(id AS STRING) AS value"), kafka.bootstrap_servers, tmp_path / "wal",
              topic, **{"kafka.batch.size": "100000"})
    assert_driver_side(tmp_path / "wal")
    assert read_topic(kafka.bootstrap_servers, topic, 5) == []


def test_wal_path_that_cannot_be_created_is_named(spark, kafka, new_topic, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    with pytest.raises(Exception, match=r"wal\.path=.*a-file/wal cannot be created"):
        write(spark.range(3).selectExpr("CAST(id AS STRING) AS value"), kafka.bootstrap_servers,
              blocker / "wal", new_topic())


def test_wal_bound_refuses_before_anything_is_sent_and_a_rerun_with_the_write_id_finishes(spark, kafka, new_topic,
                                                                                           tmp_path):
    """wal.maxBytes bounds payload Kafka has not acknowledged: a batch bigger than the bound is refused before
    the producer sees it; the re-run under the same wal.writeId with room delivers every record once."""
    topic = new_topic()
    df = spark.range(30_000, numPartitions=1).selectExpr("CAST(id AS STRING) AS value", "repeat('p', 100) AS key")
    options = {"wal.writeId": "bounded-write", "wal.maxBytes": "100000"}
    with pytest.raises(Exception, match=r"would pass wal\.maxBytes=100000; nothing was dropped"):
        write(df, kafka.bootstrap_servers, tmp_path / "wal", topic, **options)
    assert read_topic(kafka.bootstrap_servers, topic, 5) == []
    wal = open_wal(str(tmp_path / "wal"))
    assert wal.attempts("bounded-write/") and wal.used_bytes() == 0
    write(df, kafka.bootstrap_servers, tmp_path / "wal", topic, **{**options, "wal.maxBytes": "64m"})
    values = [r["value"] for r in read_topic(kafka.bootstrap_servers, topic, 60, expected=30_000)]
    assert len(values) == len(set(values)) == 30_000
