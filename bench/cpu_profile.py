"""Where a write's CPU goes, per shape: ``perf record -a`` over repeated writes of one case (Spark's sink, the
sink at_least_once or exactly_once, the counting floor) in a warm session, every sample sorted into a part of
the pipeline by its process, thread and library. The broker's samples are left out, as bench.cpu leaves it out.

    .venv/bin/python -m bench.cpu_profile      # PROFILE_ROWS=1000000 PROFILE_WRITES=3 PROFILE_WARMUP=4
    PROFILE_SHAPES=100B,1024B,100B+headers PROFILE_CASES=spark_kafka,wal_on,exactly_once,python_floor \\
        .venv/bin/python -m bench.cpu_profile

Prints, per shape and case, µs of CPU per record in each part; writes build/bench/cpu_profile.json. Needs
``perf`` (linux-perf) and root or ``perf_event_paranoid`` <= 0. Run it alone on the machine.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
from collections import Counter, defaultdict
from pathlib import Path

from bench.floor import PythonFloor
from bench.harness import OUT, Bench, frame, spark_session
from testing.kafka_local import REPO, KafkaCluster

ROWS = int(os.environ.get("PROFILE_ROWS", "1000000"))
WRITES = int(os.environ.get("PROFILE_WRITES", "3"))
WARMUP = int(os.environ.get("PROFILE_WARMUP", "4"))  # full-size writes of every case first: Spark's JIT settles
SHAPES = os.environ.get("PROFILE_SHAPES", "100B,1024B,100B+headers").split(",")
CASES = os.environ.get("PROFILE_CASES", "spark_kafka,wal_on,exactly_once,python_floor").split(",")
FREQUENCY = "1999"
KEEP = os.environ.get("PROFILE_KEEP")  # a directory to keep each case's perf.data in, for perf report

# (thread name pattern, library path pattern, part) in order; the first that matches a sample names its part.
_WORKER_PARTS: list[tuple[str, str, str]] = [
    (r"^rdk:", r"", "librdkafka's threads (requests, acks, sockets)"),
    (r"", r"_digests", "record digests"),
    (r"", r"lmdb", "WAL: LMDB"),
    (r"", r"libz|zlib", "WAL: CRC32"),
    (r"", r"_produce", "native send loop"),
    (r"", r"librdkafka", "librdkafka calls on the task's thread"),
    (r"", r"arrow|parquet", "Arrow (hand-over read, WAL's IPC, casts)"),
    (r"", r"libpython|/bin/python", "Python interpreter"),
    (r"", r"/libc\.so|/libc-|ld-linux|/libm\.", "libc (malloc, free, memcpy)"),
    (r"", r"kernel", "kernel (sockets, fsync, futex, page faults)"),
    (r"", r"", "other libraries"),
]
_SAMPLE = re.compile(r"\s*(.+?)\s+(\d+)/\d+\s+[0-9a-f]+\s+(.*?)\s+\((.*)\)\s*$")


def _part(comm: str, dso: str) -> str:
    for thread, library, part in _WORKER_PARTS:
        if re.search(thread, comm) and re.search(library, dso):
            return part
    return "other libraries"


def _jvm_part(comm: str, dso: str) -> str:
    if re.match(r"GC|G1", comm):
        return "JVM: garbage collection"
    if re.match(r"C1 |C2 |Compiler", comm):
        return "JVM: JIT compiler"
    if "kernel" in dso:
        return "JVM: kernel (sockets, futex)"
    return "JVM: scan and Arrow encoding, Spark's sink (task threads)"


def classify(perf_data: Path, jvm_pid: int, exclude: set[int]) -> tuple[dict[str, int], dict[str, Counter[str]]]:
    """Samples per part: the Spark JVM's (by thread kind), the Python workers' (by thread and library); and per
    part the symbols sampled most. The benchmark's own process (its topic counts) and the broker are left out."""
    out = subprocess.run(["perf", "script", "-i", str(perf_data), "-F", "comm,pid,tid,ip,sym,dso"],
                         capture_output=True, text=True, check=True).stdout
    parts: dict[str, int] = defaultdict(int)
    symbols: dict[str, Counter[str]] = defaultdict(Counter)
    for line in out.splitlines():
        match = _SAMPLE.match(line)
        if match is None:
            continue
        comm, pid, sym, dso = match.group(1), int(match.group(2)), match.group(3), match.group(4)
        if pid in exclude or pid == 0:
            continue
        if pid == jvm_pid:
            part = _jvm_part(comm, dso)
        elif comm.startswith(("kworker", "jbd2", "ksoftirq", "kswapd", "kcompact", "kdamond", "rcu", "migration",
                              "perf", "swapper")):
            continue
        elif comm.startswith(("python", "pyspark", "rdk:")):
            part = _part(comm, dso)
        else:
            part = f"other process: {comm}"
        parts[part] += 1
        symbols[part][f"{sym or '?'} ({dso.rsplit('/', 1)[-1]})"] += 1
    return dict(parts), dict(symbols)


def main() -> None:
    root = REPO / "build" / "profile-kafka"
    KafkaCluster(root, 1).wipe()
    cluster = KafkaCluster(root, 1, broker_props={"log.segment.delete.delay.ms": "1000"})
    cluster.start()
    report: dict[str, dict[str, dict[str, float]]] = {}
    try:
        spark = spark_session()
        spark.dataSource.register(PythonFloor)
        jvm_pid = spark.sparkContext._gateway.proc.pid  # type: ignore[union-attr]
        exclude = {p.pid for p in cluster.procs.values()} | {os.getpid()}
        b = Bench(spark, cluster)
        for shape in SHAPES:
            value_bytes, headers = int(shape.split("B")[0]), shape.endswith("+headers")
            df = frame(spark, ROWS, value_bytes, headers).cache()
            assert df.count() == ROWS
            writers = {"spark_kafka": b.spark_kafka(df), "wal_on": b.recoverable(df, True),
                       "wal_off": b.recoverable(df, False),
                       "exactly_once": b.recoverable(df, True, **{"delivery.guarantee": "exactly_once"}),
                       "python_floor": b.python_floor(df)}
            for n in range(WARMUP):
                for case in CASES:
                    b.timed(f"{case} warm-up {n + 1}", 4, ROWS, writers[case], verify=case != "python_floor")
            report[shape] = {}
            for case in CASES:
                with tempfile.TemporaryDirectory() as tmp:
                    data = Path(KEEP or tmp) / f"{shape}-{case}.perf.data"
                    perf = subprocess.Popen(["perf", "record", "-a", "-F", FREQUENCY, "-o", str(data)],
                                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                    seconds = 0.0
                    for n in range(WRITES):
                        run = b.timed(f"{case} profiled {n + 1}", 4, ROWS, writers[case],
                                      verify=case != "python_floor")
                        seconds += run.seconds or 0.0
                    perf.send_signal(signal.SIGINT)
                    perf.wait(timeout=120)
                    samples, symbols = classify(data, jvm_pid, exclude)
                us = {part: n / int(FREQUENCY) * 1e6 / (ROWS * WRITES) for part, n in samples.items()}
                report[shape][case] = dict(sorted(us.items(), key=lambda kv: -kv[1]))
                total = sum(us.values())
                print(f"\n{shape} {case}: {total:.2f} µs CPU/record (perf samples; {seconds / WRITES:.2f} s/write)")
                for part, value in report[shape][case].items():
                    top = ", ".join(f"{sym} {n * 100 // samples[part]}%" for sym, n in symbols[part].most_common(4))
                    print(f"  {value:6.3f}  {part}: {top}")
                sys.stdout.flush()
            df.unpersist()
    finally:
        cluster.stop()
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "cpu_profile.json").write_text(json.dumps({"rows": ROWS, "writes": WRITES, "us_per_record": report},
                                                     indent=2))


if __name__ == "__main__":
    main()
