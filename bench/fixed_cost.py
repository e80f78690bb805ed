"""What a write costs before its first record: the first write of a session, a small write, and a small
exactly_once micro-batch, each against Spark's own ``format("kafka")``. Part of ``make bench``; alone:

    .venv/bin/python -m bench.fixed_cost       # FIXED_REPS=6 FIXED_FIRST_REPS=2 FIXED_MICRO_BATCHES=12

Beside Spark's sink, ``python_noop`` is bench.floor's Python DataSource whose writer only reads its input: the
floor any Python sink pays (Spark starts its Python workers for the lookup, the planning, the tasks and the commit).

* ``first_write``: a new driver process (its own SparkSession) writes 4 rows; the write call's wall time.
* ``small_write``: 4 rows into a 1-partition DataFrame in a warm session; the median write call.
* ``micro_batch``: a file-source stream of 4-row micro-batches on 2 partitions; the median of Spark's own
  ``addBatch`` duration per micro-batch, the first one left out.

Writes ``build/bench/fixed_cost.json`` (``make bench`` folds it into ``results.json``).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench.floor import PythonFloor
from testing.kafka_local import REPO, KafkaCluster
from testing.spark import local_spark, python_env

OUT = REPO / "build" / "bench"
REPS = int(os.environ.get("FIXED_REPS", "6"))
FIRST_REPS = int(os.environ.get("FIXED_FIRST_REPS", "2"))
MICRO_BATCHES = int(os.environ.get("FIXED_MICRO_BATCHES", "12"))
CASES: dict[str, dict[str, str]] = {
    "spark_kafka": {},
    "python_noop": {},
    "at_least_once": {"delivery.guarantee": "at_least_once"},
    "exactly_once": {"delivery.guarantee": "exactly_once"},
}


def _register(spark: Any) -> None:
    from recoverable_sink import RecoverableKafkaDataSource

    spark.dataSource.register(RecoverableKafkaDataSource)
    spark.dataSource.register(PythonFloor)


def _writer(df: Any, case: str, bootstrap: str, topic: str, wal: str) -> Any:
    if case == "python_noop":
        return df.write.format("python_floor").mode("append")
    if case == "spark_kafka":
        return df.write.format("kafka").mode("append").option("kafka.bootstrap.servers", bootstrap) \
            .option("topic", topic)
    return df.write.format("recoverable_kafka").mode("append").options(
        **{"kafka.bootstrap.servers": bootstrap, "topic": topic, "wal.path": wal, **CASES[case]})


def first_write(case: str, bootstrap: str, topic: str) -> float:
    """Run in a new process (``--first CASE``): build a session, write 4 rows, return the write's seconds."""
    spark = local_spark("fixed-cost-first")
    _register(spark)
    try:
        df = spark.range(4, numPartitions=1).selectExpr("CAST(id AS STRING) AS key", "'v' AS value")
        started = time.perf_counter()
        _writer(df, case, bootstrap, topic, tempfile.mkdtemp(prefix="rk-first-")).save()
        return time.perf_counter() - started
    finally:
        spark.stop()


def _first_in_new_process(case: str, bootstrap: str, topic: str) -> float:
    out = subprocess.run([sys.executable, "-m", "bench.fixed_cost", "--first", case, bootstrap, topic], cwd=REPO,
                         env=python_env(), capture_output=True, text=True, timeout=600, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def micro_batch_ms(spark: Any, case: str, bootstrap: str, topic: str, work: Path) -> float:
    source = work / f"in-{case}"
    source.mkdir()
    base = time.time() - 3600
    for f in range(MICRO_BATCHES):
        path = source / f"part-{f:03d}.json"
        path.write_text("".join(f'{{"id": {f * 4 + i}}}\n' for i in range(4)))
        os.utime(path, (base + f, base + f))
    df = (spark.readStream.schema("id LONG").option("maxFilesPerTrigger", 1).json(str(source)).repartition(2)
          .selectExpr("CAST(id AS STRING) AS key", "'v' AS value"))
    fmt = "kafka" if case == "spark_kafka" else "recoverable_kafka"
    writer = df.writeStream.format(fmt).option("kafka.bootstrap.servers", bootstrap).option("topic", topic) \
        .option("checkpointLocation", str(work / f"cp-{case}"))
    if case != "spark_kafka":
        writer = writer.options(**{"wal.path": str(work / f"wal-{case}"), **CASES[case]})
    query = writer.trigger(availableNow=True).start()
    query.awaitTermination(600)
    if query.exception() is not None:
        raise RuntimeError(str(query.exception()))
    durations = [p["durationMs"]["addBatch"] for p in query.recentProgress if p["numInputRows"]]
    return statistics.median(durations[1:] or durations)


def measure(bootstrap: str, create_topic: Any) -> dict[str, Any]:
    spark = local_spark("fixed-cost", **{"spark.sql.shuffle.partitions": "2"})
    _register(spark)
    results: dict[str, Any] = {"first_write_s": {}, "small_write_ms": {}, "micro_batch_ms": {}}
    with tempfile.TemporaryDirectory(prefix="rk-fixed-") as tmp:
        work = Path(tmp)
        df = spark.range(4, numPartitions=1).selectExpr("CAST(id AS STRING) AS key", "'v' AS value")
        for case in CASES:  # warm-up: each path's classes, workers and clients once
            _writer(df, case, bootstrap, create_topic(), str(work / "wal")).save()
        small: dict[str, list[float]] = {case: [] for case in CASES}
        for _ in range(REPS):  # interleaved, so drift hits every case alike
            for case in CASES:
                topic = create_topic()
                started = time.perf_counter()
                _writer(df, case, bootstrap, topic, str(work / "wal")).save()
                small[case].append((time.perf_counter() - started) * 1000)
        results["small_write_ms"] = {c: round(statistics.median(v), 1) for c, v in small.items()}
        for case in CASES:
            if case != "python_noop":  # a stream needs a stream writer
                results["micro_batch_ms"][case] = micro_batch_ms(spark, case, bootstrap, create_topic(), work)
    spark.stop()
    first: dict[str, list[float]] = {case: [] for case in CASES}
    for _ in range(FIRST_REPS):
        for case in CASES:
            first[case].append(_first_in_new_process(case, bootstrap, create_topic()))
    results["first_write_s"] = {c: round(statistics.median(v), 2) for c, v in first.items()}
    return results


def main() -> int:
    if len(sys.argv) == 5 and sys.argv[1] == "--first":
        sys.stdout.write(f"{first_write(sys.argv[2], sys.argv[3], sys.argv[4])}\n")
        return 0
    OUT.mkdir(parents=True, exist_ok=True)
    cluster = KafkaCluster(OUT / "fixed-kafka", 1)
    cluster.wipe()
    cluster.start()
    try:
        results = measure(cluster.bootstrap_servers,
                          lambda: cluster.create_topic(f"fixed-{uuid.uuid4().hex[:10]}", 2, 1, None))
    finally:
        cluster.stop()
    (OUT / "fixed_cost.json").write_text(json.dumps(results, indent=2) + "\n")
    sys.stdout.write(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
