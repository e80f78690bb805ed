"""What a rate-limited write takes against what its limit implies (``rate.recordsPerSecond``,
``rate.bytesPerSecond``, both per task). Part of ``make bench``; alone, against the development broker:

    .venv/bin/python -m bench.rate        # RATE_ROWS=200000 RATE_PARTITIONS=2 RATE_RECORDS=5000 RATE_BYTES=500k

Each limit writes RATE_ROWS rows of 100 B values on RATE_PARTITIONS partitions (in waves of as many tasks as
the session has cores), under a
generated id with the WAL on. A task's limit implies rows per task / limit seconds (bytes: its keys' and
values' bytes / limit); the write's own fixed cost (the fastest of three one-record-per-partition writes) is
taken off before comparing, and so is the tenth of a second the first piece goes without waiting.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from bench.harness import OUT, Bench, frame, run_alone
from recoverable_sink.options import parse_size
from testing.kafka_check import count_topic
from testing.spark import sink_writer

ROWS = int(os.environ.get("RATE_ROWS", "200000"))
PARTITIONS = int(os.environ.get("RATE_PARTITIONS", "2"))
RECORDS = float(os.environ.get("RATE_RECORDS", "5000"))
BYTES = os.environ.get("RATE_BYTES", "500k")
VALUE_BYTES = 100


def _write(b: Bench, rows: int, options: dict[str, str]) -> tuple[float, bool]:
    topic = b.fresh_topic("rate", PARTITIONS)
    df = frame(b.spark, rows, VALUE_BYTES, partitions=PARTITIONS)
    started = time.perf_counter()
    sink_writer(df, b.bootstrap, topic, OUT / "wal", **options).save()
    seconds = time.perf_counter() - started
    verified = count_topic(b.bootstrap, topic, timeout_s=60) == rows
    b.drop_topic(topic)
    return seconds, verified


def measure(b: Bench) -> dict[str, Any]:
    """Both limits, each against the time it implies; returns the ``rate_limit`` section of results.json."""
    fixed = min(_write(b, PARTITIONS, {})[0] for _ in range(3))
    per_task = ROWS // PARTITIONS
    # Tasks beyond the session's cores wait for a free one: the limit's time comes once per wave of tasks.
    waves = -(-PARTITIONS // b.spark.sparkContext.defaultParallelism)
    # The bench frame's key is "k" and up to five digits; its value is padded to VALUE_BYTES.
    key_bytes = sum(len(f"k{i % 100_000}") for i in range(per_task)) / per_task
    limit_bytes = parse_size("rate.bytesPerSecond", BYTES)
    cases = {
        "records": ({"rate.recordsPerSecond": f"{RECORDS:g}"}, waves * per_task / RECORDS),
        "bytes": ({"rate.bytesPerSecond": BYTES}, waves * per_task * (key_bytes + VALUE_BYTES) / limit_bytes),
    }
    out: dict[str, Any] = {"rows": ROWS, "partitions": PARTITIONS, "waves": waves, "value_bytes": VALUE_BYTES,
                           "fixed_seconds": round(fixed, 2), "cases": []}
    for name, (options, implied) in cases.items():
        seconds, verified = _write(b, ROWS, options)
        paced = seconds - fixed + 0.1 * waves  # each task's first piece (a tenth of a second's) goes at once
        entry = {"limit": name, "options": options, "seconds": round(seconds, 2), "implied_seconds": round(implied, 2),
                 "paced_vs_implied": round(paced / implied, 3), "within_10pct": abs(paced / implied - 1) <= 0.10,
                 "verified": verified}
        sys.stdout.write(json.dumps(entry) + "\n")
        if not verified:
            b.errors.append(f"rate limit {name}: records missing")
        out["cases"].append(entry)
    return out


def main() -> int:
    return run_alone(measure, "rate", count_cpu=False)


if __name__ == "__main__":
    sys.exit(main())
