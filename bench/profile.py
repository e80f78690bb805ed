"""Where one task's time goes: an at-least-once writer driven with Arrow batches in this process (no Spark,
no JVM), against a real local broker, with the WAL on and off, then once more under cProfile.

    .venv/bin/python -m bench.profile     # PROFILE_ROWS=300000 PROFILE_VALUE_BYTES=100 PROFILE_REPS=5
    PROFILE_PARTITIONS=1 .venv/bin/python -m bench.profile
    PROFILE_HEADERS=1 .venv/bin/python -m bench.profile    # two headers per record
    PROFILE_OPTIONS=kafka.linger.ms=20,kafka.batch.num.messages=20000 .venv/bin/python -m bench.profile

Prints the median rows/s and CPU per record (the process's, librdkafka's and the WAL's threads included: what
the sink costs above Spark's hand-over) of each mode, and the functions with the most time of their own. The
broker runs under build/bench/profile-kafka and is stopped at the end.
"""

from __future__ import annotations

import cProfile
import os
import pstats
import shutil
import statistics
import sys
import tempfile
import time
import uuid

import pyarrow as pa

from recoverable_sink.columns import SchemaPlan
from recoverable_sink.contract import SinkCommitMessage, TaskIdentity
from recoverable_sink.executor.task import write_partition
from recoverable_sink.options import parse_options
from testing.kafka_local import REPO, KafkaCluster

ROWS = int(os.environ.get("PROFILE_ROWS", "300000"))
VALUE_BYTES = int(os.environ.get("PROFILE_VALUE_BYTES", "100"))
PARTITIONS = int(os.environ.get("PROFILE_PARTITIONS", "4"))
REPS = int(os.environ.get("PROFILE_REPS", "5"))
HEADERS = os.environ.get("PROFILE_HEADERS", "") == "1"  # two headers per record, as make bench's headers shape
# Extra sink options for both modes (name=value, comma-separated), to try a producer setting.
EXTRA = dict(item.split("=", 1) for item in os.environ.get("PROFILE_OPTIONS", "").split(",") if item)
BATCH = 10_000  # spark.sql.execution.arrow.maxRecordsPerBatch's default
HEADER_TYPE = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))


def batches() -> list[pa.RecordBatch]:
    pad = b"x" * max(0, VALUE_BYTES - 8)
    out = []
    for s in range(0, ROWS, BATCH):
        rows = range(s, min(ROWS, s + BATCH))
        columns = {"key": [b"k%07d" % (i % 100_000) for i in rows], "value": [b"%08d" % i + pad for i in rows]}
        if HEADERS:
            columns["headers"] = pa.array([[{"key": "source", "value": b"bench"}, {"key": "seq", "value": b"%d" % i}]
                                           for i in rows], HEADER_TYPE)
        out.append(pa.RecordBatch.from_pydict(columns))
    return out


def write(cluster: KafkaCluster, data: list[pa.RecordBatch], wal: str | None) -> SinkCommitMessage:
    topic = cluster.create_topic(f"profile-{uuid.uuid4().hex[:8]}", PARTITIONS, 1)
    options = parse_options({"kafka.bootstrap.servers": cluster.bootstrap_servers, "topic": topic, **EXTRA,
                             **({"wal.path": wal} if wal else {"wal.enabled": "false"})})
    plan = SchemaPlan(columns=("key", "value", "headers") if HEADERS else ("key", "value"), topic_option=topic)
    message = write_partition(iter(data), options, plan, TaskIdentity(uuid.uuid4().hex, 0, 0), "profile")
    assert message.acknowledged == sum(b.num_rows for b in data), message
    return message


def main() -> int:
    root = REPO / "build" / "bench" / "profile-kafka"
    shutil.rmtree(root, ignore_errors=True)
    cluster = KafkaCluster(root, 1).start()
    wal = tempfile.mkdtemp(prefix="profile-wal-", dir=REPO / "build" / "bench")
    try:
        data = batches()
        write(cluster, data[:2], wal)  # warm-up: connections, metadata, the WAL file
        seconds: dict[str, list[float]] = {"WAL on": [], "WAL off": []}
        cpu: dict[str, list[float]] = {"WAL on": [], "WAL off": []}
        for _ in range(REPS):  # interleaved, so drift hits both alike; the median counts
            for label, path in (("WAL on", wal), ("WAL off", None)):
                started, cpu_started = time.perf_counter(), time.process_time()
                write(cluster, data, path)
                seconds[label].append(time.perf_counter() - started)
                cpu[label].append(time.process_time() - cpu_started)  # every thread: librdkafka's, the WAL's
        for label, runs in seconds.items():
            sys.stdout.write(f"{label:8} {ROWS / statistics.median(runs):>10,.0f} rows/s, "
                             f"{statistics.median(cpu[label]) * 1e6 / ROWS:.2f} µs CPU/record (this process, all "
                             f"threads), medians of {REPS} ({ROWS:,} x {VALUE_BYTES} B, {PARTITIONS}-partition topic, "
                             "one task)\n")
        profiler = cProfile.Profile()
        profiler.enable()
        write(cluster, data, wal)
        profiler.disable()
        pstats.Stats(profiler, stream=sys.stdout).sort_stats("tottime").print_stats(15)
    finally:
        cluster.stop()
        shutil.rmtree(wal, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
