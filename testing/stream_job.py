"""A streaming driver program for kill-and-restart tests: runs one query into format("recoverable_kafka")
with trigger(availableNow=True) and exits 0 when the input is processed.

    python -m testing.stream_job --source files --input DIR --bootstrap B --topic T --checkpoint C --wal W
    python -m testing.stream_job --source kafka --source-topic S --bootstrap B --topic T --checkpoint C --wal W

Run it in its own process group so a test can SIGKILL the driver together with its JVM and Python workers.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from pyspark.sql import DataFrame

from testing.spark import local_spark, sink_stream_writer


def write_inputs(d: Path, sizes: list[int]) -> int:
    """``--source files`` input: one JSON file per size, ids numbered on from 0 across them, read as one micro-batch of
    len(sizes) partitions (one file each); returns the number of rows."""
    d.mkdir(parents=True)
    first = 0
    for f, n in enumerate(sizes):
        (d / f"part-{f:04d}.json").write_text("".join(f'{{"id": {i}, "payload": "p{i}"}}\n'
                                                      for i in range(first, first + n)))
        first += n
    return first


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--source", choices=["files", "kafka", "rate"], required=True)
    p.add_argument("--input", help="directory of JSON files with an id field (files source)")
    p.add_argument("--source-topic", help="topic to read (kafka source)")
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--wal", required=True)
    p.add_argument("--summary")
    p.add_argument("--master", default="local[2,4]")
    p.add_argument("--max-per-trigger", type=int, default=0, help="files or offsets per micro-batch")
    p.add_argument("--output-mode", default="append")
    p.add_argument("--option", action="append", default=[], metavar="NAME=VALUE", help="extra sink option")
    p.add_argument("--conf", action="append", default=[], metavar="NAME=VALUE", help="a Spark setting")
    p.add_argument("--rate", type=int, default=1000, help="rate source: rows per second (the row's number is its key)")
    p.add_argument("--rate-partitions", type=int, default=4, help="rate source: partitions of every micro-batch")
    p.add_argument("--stop-file", help="rate source: stop between micro-batches once this file exists")
    p.add_argument("--repartition", type=int, default=0, help="files source: partitions of every micro-batch")
    p.add_argument("--fail-at-id", type=int, default=None,
                   help="files source: the JVM fails every attempt of the task holding this id, upstream of the sink")
    p.add_argument("--flaky-at-id", type=int, default=None,
                   help="files source: a Python UDF upstream of the sink fails the first attempt holding this id")
    args = p.parse_args(argv)

    spark = local_spark("recoverable-kafka-stream-job", args.master, **{
        "spark.sql.shuffle.partitions": "2", **dict(item.split("=", 1) for item in args.conf)})

    if args.source == "files":
        reader = spark.readStream.schema("id LONG, payload STRING")
        if args.max_per_trigger:
            reader = reader.option("maxFilesPerTrigger", args.max_per_trigger)
        df = reader.json(args.input)
        if args.repartition:
            df = df.repartition(args.repartition)
        df = upstream_faults(df, args.fail_at_id, args.flaky_at_id) \
            .selectExpr("CAST(id AS STRING) AS key", "to_json(struct(*)) AS value")
    elif args.source == "kafka":
        reader = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", args.bootstrap)
                  .option("subscribe", args.source_topic).option("startingOffsets", "earliest"))
        if args.max_per_trigger:
            reader = reader.option("maxOffsetsPerTrigger", args.max_per_trigger)
        df = reader.load().selectExpr("key", "value")
    else:
        df = (spark.readStream.format("rate").option("rowsPerSecond", args.rate)
              .option("numPartitions", args.rate_partitions).load()
              .selectExpr("CAST(value AS STRING) AS key", "CAST(value AS STRING) AS value"))

    options = dict(item.split("=", 1) for item in args.option)
    if args.summary:
        options["summary.path"] = args.summary
    writer = (sink_stream_writer(df, args.bootstrap, args.topic, args.wal, checkpointLocation=args.checkpoint,
                                 **options).outputMode(args.output_mode))
    # The rate source never runs out: it runs on a 1 s trigger until the stop file appears.
    query = writer.trigger(processingTime="1 second" if args.source == "rate" else None,
                           availableNow=args.source != "rate" or None).start()
    if args.source == "rate" and args.stop_file:
        while query.isActive and not os.path.exists(args.stop_file):
            time.sleep(0.5)
        while query.isActive and query.status["isTriggerActive"]:  # between micro-batches, not inside one
            time.sleep(0.05)
        query.stop()
    query.awaitTermination()
    spark.stop()
    return 0


def upstream_faults(df: DataFrame, fail_at: int | None, flaky_at: int | None) -> DataFrame:
    """Failures on the JVM side of the sink's stage: ``raise_error`` in every attempt of the task holding
    ``fail_at``; a Python UDF (its own worker, outside the sink's) failing the first attempt holding ``flaky_at``."""
    from pyspark import TaskContext
    from pyspark.sql import functions as F

    if fail_at is not None:
        df = df.withColumn("payload", F.when(F.col("id") == fail_at, F.raise_error(F.lit(f"upstream failure at id "
                                                                                           f"{fail_at}")))
                           .otherwise(F.col("payload")))
    if flaky_at is not None:
        def flaky(row_id: int, payload: str) -> str:
            ctx = TaskContext.get()
            if row_id == flaky_at and ctx is not None and ctx.attemptNumber() == 0:
                raise RuntimeError(f"transient upstream failure at id {flaky_at}")
            return payload

        df = df.withColumn("payload", F.udf(flaky, "string")("id", "payload"))
    return df


if __name__ == "__main__":
    sys.exit(main())
