"""One cell of ``make matrix``, run by the Python of a fresh virtualenv that holds only pyspark and the
installed package (no repository on its path): a real write in both delivery modes, and a streaming write (its
own writer class), whose first attempts' Python workers are SIGKILLed mid-partition, each read back by a plain
read_committed consumer.

    <venv>/bin/python tools/matrix_job.py BOOTSTRAP PREFIX WORKDIR     # prints one JSON line; exit 0 if all held
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

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


def main() -> int:
    bootstrap, prefix, work = sys.argv[1], sys.argv[2], sys.argv[3]
    from pyspark.sql import SparkSession

    import recoverable_sink

    spark = (SparkSession.builder.master("local[2,4]").appName("matrix")
             .config("spark.ui.enabled", "false").config("spark.sql.execution.arrow.maxRecordsPerBatch", "1000")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    df = spark.range(ROWS, numPartitions=PARTITIONS).selectExpr("CAST(id AS STRING) AS key", "'v' AS value")
    report: dict[str, object] = {"python": sys.version.split()[0], "pyspark": spark.version,
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
    spark.stop()
    report["ok"] = ok
    sys.stdout.write(json.dumps(report) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
