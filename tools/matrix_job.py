"""One cell of ``make matrix``, run by the Python of a fresh virtualenv that holds only pyspark and the
installed package (no repository on its path): a real write in both delivery modes, and a streaming write (its
own writer class), whose first attempts' Python workers are SIGKILLed mid-partition, each read back by a plain
read_committed consumer. Then, with Spark's Kafka connector (RK_MATRIX_CONNECTOR_JARS, from tools/matrix.py), the
exactly_once topic read back through ``format("kafka")`` and the same DataFrame written by it; with
RK_MATRIX_CONNECT=1, a write from a Spark Connect client through a Connect server of this pyspark.

    <venv>/bin/python tools/matrix_job.py BOOTSTRAP PREFIX WORKDIR     # prints one JSON line; exit 0 if all held
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

ROWS, PARTITIONS = 20_000, 2


def read_back(bootstrap: str, topic: str, expected: int) -> list[str]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"matrix-{time.time_ns()}",
                         "isolation.level": "read_committed", "enable.auto.commit": False,
                         "auto.offset.reset": "earliest"})
    try:
        meta = consumer.list_topics(topic, timeout=30).topics[topic]
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in meta.partitions}
        consumer.assign([TopicPartition(topic, p, 0) for p in ends])
        keys: list[str] = []
        deadline = time.monotonic() + 120
        positions = dict.fromkeys(ends, 0)
        while any(positions[p] < ends[p] for p in ends) and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                for tp in consumer.position([TopicPartition(topic, p) for p in ends]):
                    positions[tp.partition] = max(positions[tp.partition], tp.offset)
                continue
            if msg.error() is None:
                keys.append(msg.key().decode())
                positions[msg.partition()] = msg.offset() + 1
        return keys
    finally:
        consumer.close()


def new_topic(bootstrap: str, topic: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(60)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # until both partitions have a leader
        meta = admin.list_topics(topic, timeout=10).topics.get(topic)
        if meta is not None and meta.error is None and len(meta.partitions) == 2 and \
                all(p.leader >= 0 for p in meta.partitions.values()):
            return
        time.sleep(0.1)


def outcome(bootstrap: str, topic: str, summary: str) -> dict[str, int]:
    retried = json.loads(open(summary).read().splitlines()[-1])["retried_partitions"]
    keys = read_back(bootstrap, topic, ROWS)
    return {"retried_partitions": retried, "lost": ROWS - len(set(keys)), "duplicated": len(keys) - len(set(keys))}


def held(result: dict[str, int]) -> bool:
    return result["retried_partitions"] > 0 and result["lost"] == 0 and result["duplicated"] == 0


def stream(spark: SparkSession, bootstrap: str, prefix: str, work: str) -> dict[str, int]:
    """One micro-batch of ROWS records from a JSON directory, through the streaming writer (a class of its own)."""
    source = os.path.join(work, "stream-in")
    os.makedirs(source, exist_ok=True)
    with open(os.path.join(source, "part-0.json"), "w") as out:
        out.writelines(f'{{"key": "{i}", "value": "v"}}\n' for i in range(ROWS))
    topic, summary = f"{prefix}-stream", os.path.join(work, "stream.jsonl")
    new_topic(bootstrap, topic)
    df = spark.readStream.schema("key STRING, value STRING").json(source).repartition(PARTITIONS)
    query = (df.writeStream.format("recoverable_kafka").trigger(availableNow=True)
             .option("checkpointLocation", os.path.join(work, "checkpoint"))
             .option("kafka.bootstrap.servers", bootstrap).option("topic", topic)
             .option("wal.path", os.path.join(work, "wal")).option("summary.path", summary)
             .option("_test.killAfterRecords", "3000").start())
    query.awaitTermination(600)
    return outcome(bootstrap, topic, summary)


def kafka_source(spark: SparkSession, df: DataFrame, bootstrap: str, prefix: str) -> dict[str, object]:
    """Spark's own Kafka connector beside the sink: the exactly_once topic (whose killed attempts' transactions
    were aborted) read through ``format("kafka")`` with read_committed, then with the connector's default
    (read_uncommitted, which also shows the aborted records), and the same DataFrame written by
    ``format("kafka")``, counted by the independent consumer."""
    version = os.environ["RK_MATRIX_CONNECTOR"]
    report: dict[str, object] = {"connector": version, "expected": ROWS}
    try:
        def read(**options: str) -> tuple[int, int]:
            rows = (spark.read.format("kafka").option("kafka.bootstrap.servers", bootstrap)
                    .option("subscribe", f"{prefix}-exactly_once").options(**options).load()
                    .selectExpr("CAST(key AS STRING) AS key").collect())
            return len(rows), len({r["key"] for r in rows})

        committed, distinct = read(**{"kafka.isolation.level": "read_committed"})
        report |= {"read_committed": committed, "read_committed_distinct": distinct}
        report["read_uncommitted"] = read()[0]
        topic = f"{prefix}-format-kafka"
        new_topic(bootstrap, topic)
        (df.write.format("kafka").option("kafka.bootstrap.servers", bootstrap).option("topic", topic).save())
        report["format_kafka"] = len(set(read_back(bootstrap, topic, ROWS)))
    except Exception as exc:  # a connector of another version that does not load on this Spark
        if version == spark.version:  # the connector of this very version: a failure, not a skip
            return {"connector": version, "error": str(exc).strip()[:500]}
        reason = f"connector {version} on pyspark {spark.version}: {str(exc).strip().splitlines()[0][:300]}"
        sys.stderr.write(f"format(kafka) cells skipped: {reason}\n")
        return {"connector": version, "skipped": reason}
    return report


def kafka_source_held(report: dict[str, object]) -> bool:
    if "error" in report:
        return False
    return "skipped" in report or (report["read_committed"] == report["read_committed_distinct"] == ROWS
                                   and report["format_kafka"] == ROWS)


def connect(bootstrap: str, prefix: str, work: str) -> dict[str, int]:
    """A Spark Connect server started by this pyspark's spark-submit (the sink installed on it), and a client
    session writing through it in exactly_once, its first attempts' Python workers killed."""
    from pyspark import find_spark_home
    from pyspark.sql import SparkSession

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = os.path.join(work, "connect-server.log")
    server = subprocess.Popen(
        [os.path.join(find_spark_home._find_spark_home(), "bin", "spark-submit"), "--master", "local[2,4]",
         "--class", "org.apache.spark.sql.connect.service.SparkConnectServer",
         "--conf", f"spark.connect.grpc.binding.port={port}", "--conf", "spark.connect.grpc.binding.address=127.0.0.1",
         "--conf", "spark.ui.enabled=false", "--conf", f"spark.pyspark.python={sys.executable}", "spark-internal"],
        cwd=work, stdout=open(log, "ab"), stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while "Spark Connect server started at" not in open(log, errors="replace").read():
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the Connect server did not start: {open(log).read()[-1500:]}")
            time.sleep(0.5)
        topic, summary = f"{prefix}-connect", os.path.join(work, "connect.jsonl")
        new_topic(bootstrap, topic)
        client = SparkSession.builder.remote(f"sc://127.0.0.1:{port}").create()
        (client.range(ROWS, numPartitions=PARTITIONS).selectExpr("CAST(id AS STRING) AS key", "'v' AS value")
         .write.format("recoverable_kafka").mode("append").option("kafka.bootstrap.servers", bootstrap)
         .option("topic", topic).option("delivery.guarantee", "exactly_once")
         .option("wal.path", os.path.join(work, "wal-connect")).option("summary.path", summary)
         .option("_test.killAfterRecords", "3000").save())
        client.stop()
        return outcome(bootstrap, topic, summary)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(timeout=30)


def main() -> int:
    bootstrap, prefix, work = sys.argv[1], sys.argv[2], sys.argv[3]
    import pandas
    import pyarrow
    from pyspark.sql import SparkSession

    import recoverable_sink

    # local[2,4]: Spark's default local master retries no task; this one gives each task 4 attempts.
    builder = (SparkSession.builder.master("local[2,4]").appName("matrix")
               .config("spark.ui.enabled", "false").config("spark.sql.execution.arrow.maxRecordsPerBatch", "1000"))
    if os.environ.get("RK_MATRIX_CONNECTOR_JARS"):
        builder = builder.config("spark.jars", os.environ["RK_MATRIX_CONNECTOR_JARS"])
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    df = spark.range(ROWS, numPartitions=PARTITIONS).selectExpr("CAST(id AS STRING) AS key", "'v' AS value")
    report: dict[str, object] = {"python": sys.version.split()[0], "pyspark": spark.version,
                                 "pandas": pandas.__version__, "pyarrow": pyarrow.__version__,
                                 "package": os.path.dirname(recoverable_sink.__file__)}
    ok = True
    for mode in ("at_least_once", "exactly_once"):
        topic = f"{prefix}-{mode}"
        new_topic(bootstrap, topic)
        summary = os.path.join(work, f"{mode}.jsonl")
        (df.write.format("recoverable_kafka").mode("append")
         .option("kafka.bootstrap.servers", bootstrap).option("topic", topic)
         .option("delivery.guarantee", mode).option("wal.path", os.path.join(work, "wal"))
         .option("summary.path", summary).option("_test.killAfterRecords", "3000").save())
        report[mode] = outcome(bootstrap, topic, summary)
        ok = ok and held(report[mode])
    report["stream"] = stream(spark, bootstrap, prefix, work)
    ok = ok and held(report["stream"])
    # The sink's own cells above never need Spark's Kafka connector; these do.
    if os.environ.get("RK_MATRIX_CONNECTOR_JARS"):
        report["kafka_source"] = kafka_source(spark, df, bootstrap, prefix)
    else:
        reason = os.environ.get("RK_MATRIX_NO_CONNECTOR", "no connector")
        sys.stderr.write(f"format(kafka) cells skipped: {reason}\n")
        report["kafka_source"] = {"skipped": reason}
    ok = ok and kafka_source_held(report["kafka_source"])
    spark.stop()
    if os.environ.get("RK_MATRIX_CONNECT") == "1":
        try:
            report["connect"] = connect(bootstrap, prefix, work)
            ok = ok and held(report["connect"])
        except Exception as exc:
            report["connect"] = {"error": str(exc).strip()[:500]}
            ok = False
    report["ok"] = ok
    sys.stdout.write(json.dumps(report) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
