"""Streaming latency: how soon a record is visible to a ``read_committed`` reader, and how long a micro-batch takes,
with Spark's own ``format("kafka")`` beside the sink in both modes. Part of ``make bench``; alone:

    .venv/bin/python -m bench.stream_latency   # LATENCY_RATE=2000 LATENCY_SECONDS=60 LATENCY_PARTITIONS=4

Each case runs a rate source of LATENCY_RATE rows a second on LATENCY_PARTITIONS partitions with the default
trigger (a micro-batch as soon as the last one ended) for LATENCY_SECONDS, the first 10 s left out. Every record's
value is the source's own timestamp (epoch ms, when the rate source made the row); a ``read_committed`` consumer
in this process stamps each record as it reads it, so latency = seen - made: the source's wait for its
micro-batch, the micro-batch itself and the commit, as a reader sees them. Reported: p50 and p99 of that latency,
and the mean and p50 of Spark's own micro-batch duration (``triggerExecution``) over the measured window. Beside them
``python_noop`` (bench.floor's Python sink that only reads its input, micro-batches only): what any Python sink's
micro-batch takes.
"""

from __future__ import annotations

import os
import statistics
import sys
import threading
import time
import uuid
from typing import Any

from confluent_kafka import Consumer

from bench.harness import Bench, run_alone

RATE = int(os.environ.get("LATENCY_RATE", "2000"))
SECONDS = int(os.environ.get("LATENCY_SECONDS", "60"))
PARTITIONS = int(os.environ.get("LATENCY_PARTITIONS", "4"))
WARMUP_S = 10
CASES: dict[str, dict[str, str] | None] = {
    "spark_kafka": None,
    "python_noop": None,
    "at_least_once": {"delivery.guarantee": "at_least_once"},
    "exactly_once": {"delivery.guarantee": "exactly_once"},
}


class _Reader(threading.Thread):
    """A read_committed consumer noting, for each record, (made ms, seen ms)."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        super().__init__(daemon=True)
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"latency-{uuid.uuid4().hex}",
                                  "auto.offset.reset": "earliest", "isolation.level": "read_committed",
                                  "fetch.wait.max.ms": "10", "enable.auto.commit": "false"})
        self.consumer.subscribe([topic])
        self.seen: list[tuple[int, int]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                for msg in self.consumer.consume(10_000, 0.05):
                    if msg.error() is None and msg.value():
                        self.seen.append((int(msg.value()), int(time.time() * 1000)))
        finally:
            self.consumer.close()


def run_case(spark: Any, bootstrap: str, topic: str, name: str, options: dict[str, str] | None,
             work: str) -> dict[str, Any]:
    from pyspark.sql import functions as F

    rows = (spark.readStream.format("rate").option("rowsPerSecond", RATE).option("numPartitions", PARTITIONS).load()
            .select(F.col("value").cast("string").alias("key"),
                    (F.unix_micros(F.col("timestamp")) / 1000).cast("long").cast("string").alias("value")))
    reader = _Reader(bootstrap, topic)  # in every case, python_noop's too: each has the same consumer beside it
    reader.start()
    checkpoint = f"{work}/checkpoint-{uuid.uuid4().hex}"
    if name == "python_noop":
        writer = rows.writeStream.format("python_floor")
    elif options is None:
        writer = rows.writeStream.format("kafka").option("kafka.bootstrap.servers", bootstrap).option("topic", topic)
    else:
        writer = rows.writeStream.format("recoverable_kafka").options(
            **{"kafka.bootstrap.servers": bootstrap, "topic": topic, "wal.path": f"{work}/wal",
               "transactional.id.prefix": f"latency-{uuid.uuid4().hex[:8]}-", **options})
    query = writer.option("checkpointLocation", checkpoint).start()
    started = time.time()
    try:
        while time.time() - started < SECONDS:
            if query.exception() is not None:
                raise RuntimeError(f"the query failed: {query.exception()}")
            time.sleep(0.5)
        progress = list(query.recentProgress)
    finally:
        query.stop()
        time.sleep(2)  # the last micro-batch's records reach the reader
        reader.stop.set()
        reader.join(timeout=30)
    start_ms = (started + WARMUP_S) * 1000
    latencies = sorted(seen - made for made, seen in reader.seen if made >= start_ms)
    durations = [p["durationMs"].get("triggerExecution", 0) for p in progress
                 if p.get("numInputRows") and _epoch_ms(p["timestamp"]) >= start_ms]
    if (not latencies and name != "python_noop") or not durations:
        raise RuntimeError(f"no measured records ({len(latencies)}) or micro-batches ({len(durations)})")
    batches = {"micro_batches": len(durations), "batch_mean_ms": round(statistics.mean(durations), 1),
               "batch_p50_ms": statistics.median(durations)}
    if not latencies:
        return batches
    return {"records": len(latencies), "p50_ms": latencies[len(latencies) // 2],
            "p99_ms": latencies[int(len(latencies) * 0.99)], **batches}


def _epoch_ms(timestamp: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp() * 1000


def measure(spark: Any, bootstrap: str, fresh_topic: Any) -> dict[str, Any]:
    """Each case once, in turn; returns the ``stream_latency`` section of results.json."""
    import tempfile

    out: dict[str, Any] = {"rate": RATE, "seconds": SECONDS, "partitions": PARTITIONS, "cases": {}}
    with tempfile.TemporaryDirectory(prefix="latency-") as work:
        for name, options in CASES.items():
            out["cases"][name] = run_case(spark, bootstrap, fresh_topic(), name, options, work)
            sys.stdout.write(f"  stream latency, {name}: {out['cases'][name]}\n")
    spark_case, eo = out["cases"]["spark_kafka"], out["cases"]["exactly_once"]
    out["exactly_once_vs_spark"] = {"batch_mean": round(eo["batch_mean_ms"] / spark_case["batch_mean_ms"], 2),
                                    "p99": round(eo["p99_ms"] / spark_case["p99_ms"], 2)}
    out["python_noop_vs_spark"] = {"batch_mean": round(out["cases"]["python_noop"]["batch_mean_ms"]
                                                       / spark_case["batch_mean_ms"], 2)}
    return out


def main() -> int:
    def fresh(b: Bench) -> Any:
        return lambda: b.fresh_topic("latency", PARTITIONS)

    def measured(b: Bench) -> dict[str, Any]:
        from bench.floor import PythonFloor

        b.spark.dataSource.register(PythonFloor)
        return measure(b.spark, b.bootstrap, fresh(b))

    return run_alone(measured, "stream_latency", count_cpu=False)


if __name__ == "__main__":
    sys.exit(main())
