"""A batch driver program for scenarios that need a driver of their own (a local-cluster master whose
executor JVMs can be SIGKILLed, or a process whose whole output is captured).

    python -m testing.chaos.jobs --master 'local-cluster[2,1,1024]' --rows 40000 --prefix p --bootstrap B --topic T \
        --wal W --summary S [--option name=value ...]
"""

from __future__ import annotations

import argparse
import sys

from testing.spark import local_spark, sink_writer


def _delayed(delays: dict[int, tuple[float, int]], per_partition: int) -> object:
    """A UDF passing values through, sleeping before a row of each partition in ``delays`` (seconds, row)."""
    import time

    from pyspark import TaskContext
    from pyspark.sql import functions as F

    at_rows = {p * per_partition + row: seconds for p, (seconds, row) in delays.items()}

    def delay(value: str) -> str:
        ctx = TaskContext.get()
        if ctx is not None and ctx.attemptNumber() == 0:
            time.sleep(at_rows.get(int(value.split("-")[1]), 0))
        return value

    return F.udf(delay, "string")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--master", default="local[2,4]")
    p.add_argument("--rows", type=int, required=True)
    p.add_argument("--partitions", type=int, default=4)
    p.add_argument("--prefix", required=True)
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--wal", default=None, help="wal.path (default: unset, each host's $RECOVERABLE_KAFKA_WAL_PATH)")
    p.add_argument("--summary", required=True)
    p.add_argument("--option", action="append", default=[], metavar="NAME=VALUE")
    p.add_argument("--conf", action="append", default=[], metavar="NAME=VALUE", help="a Spark setting")
    p.add_argument("--shuffle", type=int, default=0,
                   help="repartition(N, id %% 97) before the sink: a retried task reads its rows in another order")
    p.add_argument("--fail-at", type=int, default=None, metavar="ROW",
                   help="an upstream error at that row, in every attempt of its partition: the write fails")
    p.add_argument("--pace-ms", type=int, default=0,
                   help="a JVM-side pause of this many ms every 2,000 rows upstream of the sink, in every attempt: "
                        "its input arrives as a slow source's would")
    p.add_argument("--delay", action="append", default=[], metavar="PARTITION=SECONDS[@ROW]",
                   help="an upstream Python UDF holds back the partition's first row (or its ROW-th) that long, in "
                        "its first attempt")
    args = p.parse_args(argv)

    spark = local_spark("recoverable-kafka-chaos-job", args.master, **{
        "spark.task.maxFailures": "4", "spark.executor.memory": "768m",
        "spark.sql.execution.arrow.maxRecordsPerBatch": "2000",
        **dict(item.split("=", 1) for item in args.conf)})
    from pyspark.sql import functions as F

    df = spark.range(args.rows, numPartitions=args.partitions).select(
        F.concat(F.lit(f"{args.prefix}-"), F.col("id").cast("string")).alias("key"),
        F.concat(F.lit("payload-"), F.col("id").cast("string")).alias("value"))
    if args.pace_ms:
        # reflect() gives "null" for a void method: left(..., 0) keeps the value as it was.
        df = df.withColumn("value", F.concat("value", F.coalesce(F.expr(
            f"CASE WHEN CAST(split(key, '-')[1] AS BIGINT) % 2000 = 0 THEN "
            f"left(reflect('java.lang.Thread', 'sleep', CAST({args.pace_ms} AS BIGINT)), 0) END"), F.lit(""))))
    if args.delay:
        delays = {}
        for item in args.delay:
            partition, _, rest = item.partition("=")
            seconds, _, row = rest.partition("@")
            delays[int(partition)] = (float(seconds), int(row or 0))
        df = df.withColumn("value", _delayed(delays, args.rows // args.partitions)("value"))
    if args.fail_at is not None:
        df = df.withColumn("value", F.when(F.col("key") == f"{args.prefix}-{args.fail_at}", F.raise_error(
            F.lit(f"upstream failure at row {args.fail_at}"))).otherwise(F.col("value")))
    if args.shuffle:
        df = df.repartition(args.shuffle, (F.split("key", "-").getItem(1).cast("long") % 97))
    options = dict(item.split("=", 1) for item in args.option)
    sink_writer(df, args.bootstrap, args.topic, args.wal, **{"summary.path": args.summary, **options}).save()
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
