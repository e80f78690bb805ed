"""A streaming driver program for kill-and-restart tests: runs one query into format("recoverable_kafka")
with trigger(availableNow=True) and exits 0 when the input is processed.

    python -m testing.stream_job --source files --input DIR --bootstrap B --topic T --checkpoint C --wal W
    python -m testing.stream_job --source kafka --source-topic S --bootstrap B --topic T --checkpoint C --wal W

Run it in its own process group so a test can SIGKILL the driver together with its JVM and Python workers.
"""

from __future__ import annotations

import argparse
import sys

from testing.spark import local_spark, sink_stream_writer


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
    args = p.parse_args(argv)

    spark = local_spark("recoverable-kafka-stream-job", args.master, **{"spark.sql.shuffle.partitions": "2"})

    if args.source == "files":
        reader = spark.readStream.schema("id LONG, payload STRING")
        if args.max_per_trigger:
            reader = reader.option("maxFilesPerTrigger", args.max_per_trigger)
        df = reader.json(args.input).selectExpr("CAST(id AS STRING) AS key", "to_json(struct(*)) AS value")
    elif args.source == "kafka":
        reader = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", args.bootstrap)
                  .option("subscribe", args.source_topic).option("startingOffsets", "earliest"))
        if args.max_per_trigger:
            reader = reader.option("maxOffsetsPerTrigger", args.max_per_trigger)
        df = reader.load().selectExpr("key", "value")
    else:
        df = spark.readStream.format("rate").option("rowsPerSecond", 1000).load() \
            .selectExpr("CAST(value AS STRING) AS value")

    options = dict(item.split("=", 1) for item in args.option)
    if args.summary:
        options["summary.path"] = args.summary
    writer = (sink_stream_writer(df, args.bootstrap, args.topic, args.wal, checkpointLocation=args.checkpoint,
                                 **options)
              .outputMode(args.output_mode).trigger(availableNow=True))
    query = writer.start()
    query.awaitTermination()
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
