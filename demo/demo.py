"""The demo job: write a generated DataFrame to Kafka with format("recoverable_kafka"), read the topic back
with an independent consumer (testing.kafka_check), and compare.

    make demo                                   # uses (or starts) the local broker on 127.0.0.1:9092
    KAFKA_BOOTSTRAP=host1:9092,host2:9092 make demo   # any other cluster (it must allow topic creation)
    DEMO_ROWS=1000000 make demo

Exit status 0 when every record written was found exactly once, 1 otherwise. A broker it started keeps
running afterwards (`make kafka-down` stops it).
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid

from testing.kafka_check import read_topic
from testing.kafka_local import REPO, create_topic, ensure_local, metadata
from testing.spark import local_spark

DEMO_DIR = REPO / "build" / "demo"


def _is_local(bootstrap: str) -> bool:
    port = os.environ.get("KAFKA_PORT", "9092")
    return bootstrap in (f"127.0.0.1:{port}", f"localhost:{port}")


def resolve_bootstrap() -> str:
    """KAFKA_BOOTSTRAP if it names another cluster; else the local development broker, started if needed."""
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP", "").strip()
    if bootstrap and not _is_local(bootstrap):
        if metadata(bootstrap, timeout_s=15) is None:
            raise SystemExit(f"KAFKA_BOOTSTRAP={bootstrap}: no Kafka broker answered within 15s")
        return bootstrap
    print("using the local Kafka broker (starting it if it is not up) ...", flush=True)
    return ensure_local()


def main() -> int:
    rows = int(os.environ.get("DEMO_ROWS", "100000"))
    bootstrap = resolve_bootstrap()
    topic = f"demo-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
    create_topic(bootstrap, topic, partitions=3)  # the cluster's default replication factor

    from pyspark.sql import functions as F

    from recoverable_sink import RecoverableKafkaDataSource

    spark = local_spark("recoverable-kafka-demo")
    spark.dataSource.register(RecoverableKafkaDataSource)

    df = spark.range(rows, numPartitions=4).select(
        F.concat(F.lit("user-"), (F.col("id") % 1000).cast("string")).alias("key"),
        F.to_json(F.struct(F.col("id"), (F.col("id") * 7 % 101).alias("amount"))).alias("value"),
    )
    started = time.monotonic()
    (df.write.format("recoverable_kafka")
       .option("kafka.bootstrap.servers", bootstrap)
       .option("topic", topic)
       .option("wal.path", str(DEMO_DIR / "wal"))
       .mode("append").save())
    seconds = time.monotonic() - started
    spark.stop()

    found = read_topic(bootstrap, topic, timeout_s=180, expected=rows)
    ids = {json.loads(r["value"])["id"] for r in found}
    print(f"topic    {topic} on {bootstrap}")
    print(f"written  {rows} records in {seconds:.1f}s ({rows / max(seconds, 1e-9):,.0f} records/s)")
    print(f"found    {len(found)} records")
    print(f"distinct {len(ids)} ids")
    ok = rows == len(found) == len(ids) and ids == set(range(rows))
    print("OK: every record written was found exactly once" if ok else "MISMATCH: written != found")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
