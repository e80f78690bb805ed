"""The demo job: write a generated DataFrame to Kafka with format("recoverable_kafka"), read the topic back
with an independent consumer, and compare.

    make demo                                   # starts a local broker on 127.0.0.1:9092 if none runs
    KAFKA_BOOTSTRAP=host:9092 make demo         # any other cluster (it must allow topic creation)
    DEMO_ROWS=1000000 make demo

Exit status 0 when every record written was found exactly once, 1 otherwise.
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid

from devtools.kafka_check import read_topic
from devtools.kafka_local import REPO, KafkaCluster, _local


def main() -> int:
    rows = int(os.environ.get("DEMO_ROWS", "100000"))
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP")
    if bootstrap:
        cluster = KafkaCluster(REPO / "build" / "demo" / "external", 1)
        cluster.ports = [int(hp.rsplit(":", 1)[1]) for hp in bootstrap.split(",")]
    else:
        cluster = _local()
        if cluster.pid(1) is None:
            print(f"starting a local Kafka broker on {cluster.bootstrap_servers} ...", flush=True)
            cluster.start()
        bootstrap = cluster.bootstrap_servers
    topic = f"demo-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
    cluster.create_topic(topic, partitions=3, replication_factor=1)

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    spark = (SparkSession.builder.master("local[2,4]").appName("recoverable-kafka-demo")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.driver.extraJavaOptions",
                     f"-Dlog4j2.configurationFile={REPO / 'spark_conf' / 'log4j2.properties'}")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    df = spark.range(rows, numPartitions=4).select(
        F.concat(F.lit("user-"), (F.col("id") % 1000).cast("string")).alias("key"),
        F.to_json(F.struct(F.col("id"), (F.col("id") * 7 % 101).alias("amount"))).alias("value"),
    )
    summary_path = REPO / "build" / "demo" / "summary.jsonl"
    started = time.monotonic()
    # No spark.dataSource.register call: the installed pyspark_recoverable_kafka module registers the format.
    (df.write.format("recoverable_kafka")
       .option("kafka.bootstrap.servers", bootstrap)
       .option("topic", topic)
       .option("wal.path", str(REPO / "build" / "demo" / "wal"))
       .option("summary.path", str(summary_path))
       .mode("append").save())
    seconds = time.monotonic() - started
    spark.stop()

    summary = json.loads(summary_path.read_text().splitlines()[-1])
    found = read_topic(bootstrap, topic, timeout_s=120, expected=rows)
    ids = {json.loads(r["value"])["id"] for r in found}
    print(f"topic       {topic} on {bootstrap}")
    print(f"written     {summary['acknowledged']} records acknowledged by Kafka in {seconds:.1f}s "
          f"({rows / seconds:,.0f} records/s)")
    print(f"found       {len(found)} records, {len(ids)} distinct ids (expected {rows})")
    ok = summary["acknowledged"] == len(found) == len(ids) == rows
    print("OK: written == found" if ok else "MISMATCH: written != found")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
