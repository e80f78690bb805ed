"""A streaming driver program that stops a healthy query with ``query.stop()`` in the middle of a micro-batch, as a
user's program does, with Spark's own log settings (nothing quietened): its stderr is what such a user reads.

    python -m testing.stop_job --format recoverable_kafka --bootstrap B --topic T --checkpoint C [--option k=v ...]
    python -m testing.stop_job --format kafka --bootstrap B --topic T --checkpoint C

A rate-micro-batch source feeds two partitions; a JVM-side pause upstream of the sink (``Thread.sleep`` through
``reflect``, the same for either sink) keeps each micro-batch's tasks inside the sink's write for a while, so the stop
finds them there. The program prints ``stopped after N micro-batches`` and exits 0.
"""

from __future__ import annotations

import argparse
import sys
import time

from testing.spark import connector_jars


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--format", choices=["recoverable_kafka", "kafka"], required=True)
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--batches", type=int, default=2, help="micro-batches committed before the stop")
    p.add_argument("--option", action="append", default=[], metavar="NAME=VALUE", help="a sink option")
    args = p.parse_args(argv)

    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[2,4]").appName("stop-job").config("spark.ui.enabled", "false")
             .config("spark.jars", connector_jars()).getOrCreate())
    pause_ms = 1500  # once per partition and micro-batch, where a row's number is a multiple of 400
    # rate-micro-batch: every micro-batch holds rows, the first too (the rate source's first is empty).
    df = (spark.readStream.format("rate-micro-batch").option("rowsPerBatch", 800).option("numPartitions", 2).load()
          .selectExpr("CAST(value AS STRING) AS key",
                      f"concat(CAST(value AS STRING), coalesce(CASE WHEN value % 400 < 2 THEN "
                      f"left(reflect('java.lang.Thread', 'sleep', CAST({pause_ms} AS BIGINT)), 0) END, '')) AS value"))
    writer = (df.writeStream.format(args.format).option("kafka.bootstrap.servers", args.bootstrap)
              .option("topic", args.topic).option("checkpointLocation", args.checkpoint))
    for item in args.option:
        writer = writer.option(*item.split("=", 1))
    query = writer.trigger(processingTime="1 second").start()
    deadline = time.monotonic() + 300
    while query.isActive and time.monotonic() < deadline and \
            sum(1 for p in query.recentProgress if p["numInputRows"]) < args.batches:
        time.sleep(0.1)
    # Inside the next micro-batch, once its tasks run (a job is active) and have had time to reach the pause.
    tracker = spark.sparkContext.statusTracker()
    while query.isActive and time.monotonic() < deadline and not (query.status["isTriggerActive"]
                                                                  and tracker.getActiveJobsIds()):
        time.sleep(0.02)
    time.sleep(0.7)
    batches = len(query.recentProgress)
    query.stop()
    spark.stop()
    sys.stdout.write(f"stopped after {batches} micro-batches\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
