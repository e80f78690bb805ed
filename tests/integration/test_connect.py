"""Spark Connect: a Connect client writes through the sink, batch and streaming, with the package installed
on the server only (no register call: the server's Python workers find the format by themselves)."""

import json
from collections.abc import Iterator

import pytest

from testing.connect import ConnectServer
from testing.kafka_check import read_topic


@pytest.fixture(scope="module")
def connect(tmp_path_factory) -> Iterator:
    from pyspark.sql.connect.session import SparkSession

    with ConnectServer(tmp_path_factory.mktemp("connect")) as server:
        session = SparkSession.builder.remote(server.url).create()
        yield session
        session.stop()


def sink_options(kafka, topic, wal) -> dict[str, str]:
    return {"kafka.bootstrap.servers": kafka.bootstrap_servers, "topic": topic, "wal.path": str(wal)}


def test_a_connect_client_writes_a_dataframe_through_the_sink(connect, kafka, new_topic, tmp_path):
    topic = new_topic(2)
    (connect.range(5000, numPartitions=3).selectExpr("CAST(id AS STRING) AS key", "CAST(id AS STRING) AS value")
     .write.format("recoverable_kafka").options(**sink_options(kafka, topic, tmp_path / "wal"))
     .mode("append").save())
    values = [r["value"] for r in read_topic(kafka.bootstrap_servers, topic, 60, expected=5000)]
    assert sorted(values) == sorted(str(i).encode() for i in range(5000))


def test_a_connect_client_streams_through_the_sink(connect, kafka, new_topic, tmp_path):
    topic = new_topic(2)
    source = tmp_path / "in"
    source.mkdir()
    for f in range(3):
        (source / f"part-{f}.json").write_text("".join(json.dumps({"id": i}) + "\n"
                                                       for i in range(f * 1000, (f + 1) * 1000)))
    query = (connect.readStream.schema("id LONG").option("maxFilesPerTrigger", 1).json(str(source))
             .selectExpr("CAST(id AS STRING) AS value")
             .writeStream.format("recoverable_kafka").options(**sink_options(kafka, topic, tmp_path / "wal"))
             .option("checkpointLocation", str(tmp_path / "checkpoint")).trigger(availableNow=True).start())
    assert query.awaitTermination(180), "the availableNow query did not finish in 180 s"
    assert query.exception() is None
    values = [r["value"] for r in read_topic(kafka.bootstrap_servers, topic, 60, expected=3000)]
    assert sorted(values) == sorted(str(i).encode() for i in range(3000))
    assert sum(p.numInputRows for p in query.recentProgress) == 3000
