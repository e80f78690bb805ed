"""What the dead-letter option costs when nothing is refused: the same rows written with and without
``errors.tolerance=all``, interleaved, medians of DLQ_REPS. Part of ``make bench``; alone, against the development
broker:

    .venv/bin/python -m bench.dead_letters      # DLQ_ROWS=1000000 DLQ_REPS=5

* ``wal_on``: the sink as it is by default (a refused record fails the write);
* ``wal_on_dead_letters``: the same rows with a dead-letter topic named; no record is refused;
* ``wal_on_dead_letters_refusing``: 0.1% of the rows too large for the topic, routed to the dead-letter topic.

Reported per case: seconds and CPU per record (the driver, its JVM and the Python workers; the broker excluded),
and the option's CPU against ``wal_on`` (the target: within 3%). Whole writes move by more than 3% from one
repetition to the next on 2 cores, so the task's own extra work is also timed alone (``per_batch``): the checks of
one 10,000-record batch as a write without the option makes them, against the same with the option (the checks,
then the split that finds nothing to route), medians of 500.
"""

from __future__ import annotations

import os
import statistics
import sys
from typing import Any

import pyarrow as pa

from bench.harness import OUT, Bench, run_alone
from testing.spark import sink_writer

ROWS = int(os.environ.get("DLQ_ROWS", "1000000"))
REPS = int(os.environ.get("DLQ_REPS", "5"))
PARTITIONS = 4
LIMIT = 2000  # the topic's max.message.bytes: a 3 KB value is refused


def measure(b: Bench) -> dict[str, Any]:
    """The three cases; returns the ``dead_letters`` section of results.json."""
    from pyspark.sql import functions as F

    ids = b.spark.range(0, ROWS, 1, PARTITIONS)
    key, value = F.col("id").cast("string").alias("key"), F.lpad(F.col("id").cast("string"), 100, "v")
    plain = ids.select(key, value.alias("value")).cache()
    refusing = ids.select(key, F.when(F.col("id") % 1000 == 7, F.repeat(F.lit("x"), 3000)).otherwise(value)
                          .alias("value")).cache()
    plain.count(), refusing.count()
    dead = b.fresh_topic("dead-letters", 1)
    cases = {
        "wal_on": (plain, {}, ROWS),
        "wal_on_dead_letters": (plain, {"errors.tolerance": "all", "errors.deadletterqueue.topic.name": dead}, ROWS),
        "wal_on_dead_letters_refusing": (refusing, {"errors.tolerance": "all",
                                                    "errors.deadletterqueue.topic.name": dead}, ROWS - ROWS // 1000),
    }
    for df, options, rows in cases.values():  # warm-up: the JVM and the workers
        b.timed("warm-up", PARTITIONS, rows, lambda t, df=df, o=options: _write(b, df, t, o))
    runs: dict[str, list[Any]] = {name: [] for name in cases}
    for _ in range(REPS):
        for name, (df, options, rows) in cases.items():
            runs[name].append(b.timed(name, PARTITIONS, rows, lambda t, df=df, o=options: _write(b, df, t, o)))
    plain.unpersist(), refusing.unpersist()
    out: dict[str, Any] = {"rows": ROWS, "partitions": PARTITIONS, "reps": REPS, "cases": []}
    cpu_of: dict[str, float] = {}
    for name, done in runs.items():
        ok = [r for r in done if not r.error]
        seconds = statistics.median(r.seconds for r in ok) if ok else None
        cpu = [r.cpu_seconds for r in ok if r.cpu_seconds is not None]
        if cpu:
            cpu_of[name] = statistics.median(cpu) * 1e6 / ROWS
        out["cases"].append({"case": name, "seconds": seconds and round(seconds, 3),
                             "cpu_us_per_record": round(cpu_of[name], 3) if name in cpu_of else None,
                             "errors": [r.error for r in done if r.error]})
    if "wal_on" in cpu_of and "wal_on_dead_letters" in cpu_of:
        out["option_cpu_vs_without"] = round(cpu_of["wal_on_dead_letters"] / cpu_of["wal_on"], 3)
    out["per_batch"] = per_batch()
    if "wal_on" in cpu_of:
        extra = out["per_batch"]["with_option_us_per_record"] - out["per_batch"]["without_us_per_record"]
        out["per_batch"]["extra_vs_wal_on_cpu"] = round(extra / cpu_of["wal_on"], 4)
    return out


def per_batch(rows: int = 10_000, reps: int = 500) -> dict[str, float]:
    """The task's checks of one batch without the option, and with it (checks and split), µs per record."""
    import time

    from recoverable_sink.executor import dead_letters
    from recoverable_sink.executor.record_checks import Fixed, check_batch, find_refusals
    from recoverable_sink.options import DeadLetterTopic

    batch = pa.RecordBatch.from_pydict({"key": [b"%d" % i for i in range(rows)],
                                        "value": [b"%0100d" % i for i in range(rows)]})
    dead = DeadLetterTopic("dlq", 1_000_000)

    def without() -> None:
        check_batch(batch, "t", "p0", 0, Fixed(4, 1_000_000))

    def with_option() -> None:
        refusals = find_refusals(batch, "t", Fixed(4, 1_000_000))
        dead_letters.split(batch, refusals, dead, "t", "c", {})

    def median_us(step: Any) -> float:
        step()
        times = []
        for _ in range(reps):
            started = time.perf_counter()
            step()
            times.append(time.perf_counter() - started)
        return statistics.median(times) * 1e6 / rows

    a, b = median_us(without), median_us(with_option)
    return {"without_us_per_record": round(a, 4), "with_option_us_per_record": round(b, 4)}


def _write(b: Bench, df: Any, topic: str, options: dict[str, str]) -> None:
    # The topic refuses values over LIMIT (set in every case alike); the driver reads it, and the tasks route such
    # records to the dead-letter topic.
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[
        ConfigEntry("max.message.bytes", str(LIMIT), incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([resource])[resource].result(timeout=30)
    sink_writer(df, b.bootstrap, topic, OUT / "wal", **options).save()


def main() -> int:
    return run_alone(measure, "dead_letters")


if __name__ == "__main__":
    sys.exit(main())
