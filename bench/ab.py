"""A quick side-by-side of sink variants against Spark's own sink, on one cached DataFrame (no make bench).

    .venv/bin/python -m bench.ab                     # AB_ROWS=2000000 AB_REPS=5 AB_PARTITIONS=4 AB_VALUE_BYTES=100
    AB_HEADERS=1 .venv/bin/python -m bench.ab        # two headers per record (make bench's headers shape)
    AB_WARMUP_WRITES=2 .venv/bin/python -m bench.ab  # full-size untimed writes of every case first (default 1)
    AB_VARIANTS='{"wal_on": {}, "linger20": {"kafka.linger.ms": "20"}}' .venv/bin/python -m bench.ab

Each case's wall time and CPU per record (the driver, its JVM and the workers, the broker left out: bench.cpu)
are printed. Each variant is a set of sink options (``"_wal": "false"`` turns the WAL off); every repetition
writes each case once, interleaved, to a fresh topic whose count is checked. To compare against another commit,
install that commit's package into a directory and put it first on the path, from outside the repository: Python
puts the working directory first on the path of this driver and of Spark's workers (``python -m``), so from the
repository's root its own package wins whatever PYTHONPATH says:

    git worktree add /tmp/base <commit> && .venv/bin/python -m pip install -q --no-deps --target /tmp/basepkg /tmp/base
    cd /tmp && PYTHONPATH=/tmp/basepkg:$OLDPWD $OLDPWD/.venv/bin/python -m bench.ab

Runs of two sessions differ more than runs within one (the same code took 2.1 s in one session and 3.3 s in
another): alternate sessions of the two commits, two or more each, and compare medians.
"""

from __future__ import annotations

import json
import os
import statistics

from bench.cpu import CpuMeter
from bench.harness import Bench, frame, spark_session
from testing.kafka_local import REPO, KafkaCluster

ROWS = int(os.environ.get("AB_ROWS", "2000000"))
REPS = int(os.environ.get("AB_REPS", "5"))
PARTITIONS = int(os.environ.get("AB_PARTITIONS", "4"))
VALUE_BYTES = int(os.environ.get("AB_VALUE_BYTES", "100"))
HEADERS = os.environ.get("AB_HEADERS", "") == "1"
VARIANTS: dict[str, dict[str, str]] = json.loads(os.environ.get("AB_VARIANTS", '{"wal_on": {}}'))
WARMUP_ROWS = 100_000
# As make bench's BENCH_JVM_WARMUP_WRITES: after the small warm-up alone the first full-size writes of every case
# (Spark's sink and this one's JVM side alike) were still getting faster, by half with headers.
WARMUP_WRITES = int(os.environ.get("AB_WARMUP_WRITES", "1"))


def main() -> None:
    root = REPO / "build" / "ab-kafka"
    KafkaCluster(root, 1).wipe()
    cluster = KafkaCluster(root, 1, broker_props={"log.segment.delete.delay.ms": "1000"})
    cluster.start()
    # Joined after the broker started, so Spark's JVM and its workers are counted and the broker is not.
    cpu = CpuMeter({p.pid for p in cluster.procs.values()})
    try:
        spark = spark_session()
        b = Bench(spark, cluster, cpu=cpu)
        df = frame(spark, ROWS, VALUE_BYTES, HEADERS).cache()
        assert df.count() == ROWS
        small = frame(spark, WARMUP_ROWS, VALUE_BYTES, HEADERS)
        writers, warm = {"spark_kafka": b.spark_kafka(df)}, {"spark_kafka": b.spark_kafka(small)}
        for name, given in VARIANTS.items():
            options = dict(given)
            wal = options.pop("_wal", "true") == "true"
            writers[name], warm[name] = b.recoverable(df, wal, **options), b.recoverable(small, wal, **options)
        for name, write in warm.items():
            b.timed(f"{name} warm-up", PARTITIONS, WARMUP_ROWS, write)
        for n in range(WARMUP_WRITES):
            for name, write in writers.items():
                b.timed(f"{name} full-size warm-up {n + 1}/{WARMUP_WRITES}", PARTITIONS, ROWS, write)
        runs: dict[str, list[float]] = {name: [] for name in writers}
        cpus: dict[str, list[float]] = {name: [] for name in writers}
        for rep in range(REPS):
            for name, write in writers.items():
                run = b.timed(f"{name} rep {rep + 1}/{REPS}", PARTITIONS, ROWS, write)
                if run.seconds is not None:
                    runs[name].append(run.seconds)
                if run.cpu_seconds is not None:
                    cpus[name].append(run.cpu_seconds * 1e6 / ROWS)
        spark_s = statistics.median(runs["spark_kafka"])
        spark_cpu = statistics.median(cpus["spark_kafka"]) if cpus["spark_kafka"] else None
        for name, seconds in runs.items():
            median = statistics.median(seconds)
            line = (f"{name}: median {median:.2f} s, {ROWS / median:,.0f} rows/s, "
                    f"{spark_s / median:.2f}x Spark's sink; runs {', '.join(f'{s:.2f}' for s in seconds)}")
            if cpus[name] and spark_cpu:
                cpu_median = statistics.median(cpus[name])
                line += (f"; CPU {cpu_median:.2f} µs/record ({cpu.method}), {cpu_median / spark_cpu:.2f}x Spark's; "
                         f"runs {', '.join(f'{c:.2f}' for c in cpus[name])}")
            print(line, flush=True)
        if b.errors:
            raise SystemExit(f"{len(b.errors)} runs failed: {b.errors[0]}")
    finally:
        cluster.stop()
        cpu.close()


if __name__ == "__main__":
    main()
