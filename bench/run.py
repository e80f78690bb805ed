"""The side-by-side benchmark behind ``make bench``.

One local broker, one SparkSession (``local[2,4]``), the same cached DataFrame for every case:

* ``spark_kafka``  Spark's own ``format("kafka")`` (JVM producer, acks=all, idempotent)
* ``wal_on``       ``format("recoverable_kafka")`` with its LMDB write-ahead log
* ``wal_off``      the same with ``wal.enabled=false`` (what the WAL itself costs)
* ``wal_on_confluent`` ``wal_on`` with ``producer.native=false``: confluent-kafka's ``produce()`` per record
  instead of the C loop (what the native producer gains; the path ``--py-files`` takes)
* ``exactly_once`` ``wal_on`` with ``delivery.guarantee=exactly_once`` (one transaction per Spark partition)
* ``raw_client``   one confluent-kafka producer in a Python process of its own (bench.raw_client), no Spark
  (the Python client's ceiling)

per record shape (100 B and 1 KB values on 1- and 4-partition topics; 10 KB values, and 100 B values with two
headers, on a 4-partition topic; every record keyed), interleaved A B C D A B C D ... so that drift (page
cache, JIT, broker log segments) hits every case alike; the median of the write call's wall time counts.
Every run writes to a fresh topic whose record count is checked, then deleted. Then the cost of a retry, and
the Python worker's peak memory writing one partition of 1x and 4x the usual partition size, and the fixed cost of
a write (bench.fixed_cost: a session's first write, a small write, a small micro-batch), and rate-limited
writes against the time their limits imply (bench.rate), and Schema Registry framing against plain Avro bytes
(bench.registry), and the dead-letter option with nothing refused against none (bench.dead_letters), and what
the proof topic costs: CPU with and without it, its bytes per record, a re-run's read (bench.proof_cost), and the
benchmark-only produce path of our own against librdkafka (bench.own_produce), and a stream's latency to a
read_committed reader and its micro-batch time beside Spark's sink (bench.stream_latency).

    make bench                                        # BENCH_ROWS=2000000 BENCH_REPS=3 BENCH_JVM_WARMUP_WRITES=2
                                                      # BENCH_JVM_WARMUP_MAX=8
    BENCH_ROWS=200000 BENCH_REPS=1 .venv/bin/python -m bench.run

Writes build/bench/results.json and build/bench/results.png; exit status 0 only if every run verified.
The timed, verified write every case makes, and the DataFrame it writes, are bench.harness's.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from bench.cpu import CpuMeter
from bench.floor import PythonFloor
from bench.harness import DF_PARTITIONS, OUT, Bench, Run, frame, spark_session
from bench.raw_client import row as raw_row
from bench.report import markdown, plot
from testing.kafka_local import KafkaCluster

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

ROWS = int(os.environ.get("BENCH_ROWS", "2000000"))
REPS = int(os.environ.get("BENCH_REPS", "3"))
CORES = 2  # local[2,4]: two task slots; the raw client runs on one (this process's main thread)
WARMUP_ROWS = min(ROWS, 40_000)
# Full-size untimed writes of every Spark case before the first timed shape: Spark's own sink is slow for its
# first few writes in a session while the JVM's JIT and heap settle (docs/performance.md, "What each case
# measures"), so a small warm-up left its first repetitions slow and flattered the sink.
JVM_WARMUP_WRITES = int(os.environ.get("BENCH_JVM_WARMUP_WRITES", "2"))
# Past that minimum, warm-up rounds go on (up to this many in all) until Spark's sink's last write took within
# SETTLED of the one before: two rounds did not settle its JIT at 500,000 rows (the last was up to 2.2x the median).
JVM_WARMUP_MAX = max(JVM_WARMUP_WRITES, int(os.environ.get("BENCH_JVM_WARMUP_MAX", "8")))
SETTLED = 0.05
CASES = ("spark_kafka", "wal_on", "wal_off", "wal_on_confluent", "exactly_once", "raw_client", "python_floor")
UNVERIFIED = {"python_floor"}  # sends nothing: no topic to count
EXACTLY_ONCE = {"delivery.guarantee": "exactly_once"}
CONFLUENT = {"producer.native": "false"}
# A quick look at some shapes only (no retry or memory runs), e.g. BENCH_ONLY=100B:4,100B+headers:4
ONLY = {tuple(item.split(":")) for item in os.environ.get("BENCH_ONLY", "").split(",") if item}


@dataclass(frozen=True)
class Shape:
    """What the records look like: value size, headers, how many rows, which topic layouts."""

    value_bytes: int
    rows: int
    layouts: tuple[int, ...]
    headers: bool = False

    @property
    def label(self) -> str:
        return f"{self.value_bytes}B" + ("+headers" if self.headers else "")


SHAPES = (
    Shape(100, ROWS, (1, 4)),
    Shape(1024, ROWS, (1, 4)),
    Shape(10240, max(1, ROWS // 20), (4,)),  # 1 GB at the default ROWS: the cache must fit the driver's memory
    Shape(100, ROWS, (4,), headers=True),
)


def check_same_rows(df: DataFrame, rows: int, value_bytes: int, headers: bool) -> None:
    """The raw client builds its rows itself (bench.raw_client.row) rather than collecting them (2 GB would pass
    the driver's spark.driver.maxResultSize): a spot check against Spark's rows guards the equivalence."""
    spark_rows = [*df.take(3), *df.tail(2)]
    ours = [raw_row(i, value_bytes, headers) for i in (0, 1, 2, rows - 2, rows - 1)]
    theirs = [(r["key"].encode(), r["value"].encode(),
               [(h["key"], bytes(h["value"])) for h in r["headers"]] if "headers" in r else None)
              for r in spark_rows]
    if theirs != ours:
        raise AssertionError(f"the raw client's rows differ from the DataFrame's: {ours[0]!r} vs {theirs[0]!r}")


def cache_info(spark: SparkSession) -> dict[str, int]:
    """Memory and disk held by cached RDDs (a cache that spilled to disk would slow every Spark case)."""
    infos = spark.sparkContext._jsc.sc().getRDDStorageInfo()  # no public API for this
    return {"memory_bytes": sum(i.memSize() for i in infos), "disk_bytes": sum(i.diskSize() for i in infos),
            "cached_partitions": sum(i.numCachedPartitions() for i in infos)}


def median_entry(case: str, shape: Shape, partitions: int, runs: list[Run]) -> dict[str, Any]:
    ok = [r.seconds for r in runs if r.error is None and r.seconds is not None]
    med = statistics.median(ok) if ok else None
    cpu = [r.cpu_seconds for r in runs if r.error is None and r.cpu_seconds is not None]
    med_cpu = statistics.median(cpu) if cpu else None
    rows = shape.rows
    return {"case": case, "shape": shape.label, "value_bytes": shape.value_bytes, "headers": shape.headers,
            "topic_partitions": partitions, "rows": rows,
            "runs": [round(r.seconds, 3) if r.seconds is not None else None for r in runs],
            "median_seconds": round(med, 3) if med else None,
            "rows_per_second": round(rows / med) if med else None,
            "cpu_runs": [round(r.cpu_seconds, 3) if r.cpu_seconds is not None else None for r in runs],
            "median_cpu_seconds": round(med_cpu, 3) if med_cpu else None,
            "cpu_us_per_record": round(med_cpu * 1e6 / rows, 3) if med_cpu else None,
            "errors": [r.error for r in runs if r.error]}


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a and b else None


def bench_shape(b: Bench, shape: Shape, results: list[dict[str, Any]], ratios: list[dict[str, Any]],
                rss: list[dict[str, Any]]) -> DataFrame:
    rows, value_bytes = shape.rows, shape.value_bytes
    print(f"\n== {shape.label}: caching {rows:,} rows ...", flush=True)
    df = frame(b.spark, rows, value_bytes, shape.headers).cache()
    assert df.count() == rows
    check_same_rows(df, rows, value_bytes, shape.headers)
    print(f"  cache: {cache_info(b.spark)}", flush=True)
    writers = {"spark_kafka": b.spark_kafka(df), "wal_on": b.recoverable(df, wal=True),
               "wal_off": b.recoverable(df, wal=False), "exactly_once": b.recoverable(df, wal=True, **EXACTLY_ONCE),
               "wal_on_confluent": b.recoverable(df, wal=True, **CONFLUENT),
               "raw_client": b.raw_client(rows, value_bytes, shape.headers), "python_floor": b.python_floor(df)}
    # Untimed warm-up on a small slice: starts the Python workers, their producers and the JVM's Kafka
    # producer, and warms the JIT, so that the first timed repetition is not the only one paying for it.
    warmup_rows = min(rows, WARMUP_ROWS)
    small = frame(b.spark, warmup_rows, value_bytes, shape.headers)
    warm = {"spark_kafka": b.spark_kafka(small), "wal_on": b.recoverable(small, wal=True),
            "wal_off": b.recoverable(small, wal=False), "exactly_once": b.recoverable(small, wal=True, **EXACTLY_ONCE),
            "wal_on_confluent": b.recoverable(small, wal=True, **CONFLUENT),
            "raw_client": b.raw_client(warmup_rows, value_bytes, shape.headers), "python_floor": b.python_floor(small)}
    for case in CASES:
        b.timed(f"{case} {shape.label} warm-up", 4, warmup_rows, warm[case], verify=case not in UNVERIFIED)
    last_warmup: dict[str, Run] = {}  # the last full-size warm-up write of each case: the JIT settled by then?
    if not b.jvm_warm:
        spark_times: list[float] = []
        for n in range(JVM_WARMUP_MAX):
            for case in CASES:
                if case != "raw_client":
                    last_warmup[case] = b.timed(f"{case} {shape.label} JVM warm-up {n + 1}", 4, rows, writers[case],
                                                verify=case not in UNVERIFIED)
            spark_times.append(last_warmup["spark_kafka"].seconds or 0.0)
            if n + 1 >= JVM_WARMUP_WRITES and len(spark_times) > 1 and \
                    abs(spark_times[-1] - spark_times[-2]) <= SETTLED * spark_times[-2]:
                break
        b.jvm_warmup_rounds = len(spark_times)
        b.jvm_warm = True
    peak_by_layout: dict[int, float] = {}
    anon_by_layout: dict[int, float] = {}
    for partitions in shape.layouts:
        if ONLY and (shape.label, str(partitions)) not in ONLY:
            continue
        runs: dict[str, list[Run]] = {c: [] for c in CASES}
        for rep in range(REPS):
            for case in CASES:
                what = f"{case} {shape.label} {partitions}p rep {rep + 1}/{REPS}"
                runs[case].append(b.timed(what, partitions, rows, writers[case], sample_rss=case == "wal_on",
                                          verify=case not in UNVERIFIED))
        entries = {c: median_entry(c, shape, partitions, runs[c]) for c in CASES}
        if partitions == 4:  # the warm-up writes went to 4-partition topics
            for case, warmed in last_warmup.items():
                entries[case]["last_warmup_vs_median_seconds"] = ratio(warmed.seconds, entries[case]["median_seconds"])
                entries[case]["last_warmup_vs_median_cpu"] = ratio(warmed.cpu_seconds,
                                                                    entries[case]["median_cpu_seconds"])
        results.extend(entries.values())
        rps = {c: e["rows_per_second"] for c, e in entries.items()}
        cpu = {c: e["cpu_us_per_record"] for c, e in entries.items()}
        ratios.append({
            "shape": shape.label, "value_bytes": value_bytes, "headers": shape.headers, "rows": rows,
            "topic_partitions": partitions,
            "wal_on_vs_spark_kafka": ratio(rps["wal_on"], rps["spark_kafka"]),
            "wal_on_vs_wal_off": ratio(rps["wal_on"], rps["wal_off"]),
            "wal_on_vs_wal_on_confluent": ratio(rps["wal_on"], rps["wal_on_confluent"]),
            "wal_on_vs_raw_client": ratio(rps["wal_on"], rps["raw_client"]),
            "wal_on_vs_raw_client_per_core": ratio(rps["wal_on"] and rps["wal_on"] / CORES, rps["raw_client"]),
            "exactly_once_vs_spark_kafka": ratio(rps["exactly_once"], rps["spark_kafka"]),
            "exactly_once_vs_wal_on": ratio(rps["exactly_once"], rps["wal_on"]),
            # CPU per record, the sink's over Spark's sink's (below 1: the sink is cheaper), and over the floor.
            "cpu_wal_on_vs_spark_kafka": ratio(cpu["wal_on"], cpu["spark_kafka"]),
            "cpu_exactly_once_vs_spark_kafka": ratio(cpu["exactly_once"], cpu["spark_kafka"]),
            "cpu_wal_on_vs_wal_off": ratio(cpu["wal_on"], cpu["wal_off"]),
            "cpu_wal_on_vs_python_floor": ratio(cpu["wal_on"], cpu["python_floor"]),
            "cpu_spark_kafka_vs_python_floor": ratio(cpu["spark_kafka"], cpu["python_floor"]),
        })
        peak_by_layout[partitions] = max((r.peak_rss_mib or 0 for r in runs["wal_on"]), default=0)
        anon_by_layout[partitions] = max((r.peak_anon_mib or 0 for r in runs["wal_on"]), default=0)
    if not peak_by_layout:
        return df
    rss.append({"shape": shape.label, "value_bytes": value_bytes, "headers": shape.headers,
                "wal_on_worker_peak_rss_mib": round(max(peak_by_layout.values()), 1),
                "by_topic_partitions": {str(p): round(v, 1) for p, v in peak_by_layout.items()},
                # VmRSS minus the mapped LMDB file pages: the worker's own memory.
                "wal_on_worker_peak_anon_mib": round(max(anon_by_layout.values()), 1)})
    return df


# The JVM loggers that print a stack trace per killed Python worker.
_TASK_FAILURE_LOGGERS = (
    "org.apache.spark.util.Utils",
    "org.apache.spark.executor.Executor",
    "org.apache.spark.scheduler.TaskSetManager",
    "org.apache.spark.sql.execution.datasources.v2.DataWritingSparkTask",
)


@contextmanager
def quiet_task_failures(spark: SparkSession) -> Iterator[None]:
    """Silence the expected task-failure stack traces of a deliberate kill; back to ERROR afterwards."""
    jvm = spark.sparkContext._jvm  # log4j levels are only reachable through the JVM
    configurator, level = jvm.org.apache.logging.log4j.core.config.Configurator, jvm.org.apache.logging.log4j.Level
    for name in _TASK_FAILURE_LOGGERS:
        configurator.setLevel(name, level.OFF)
    try:
        yield
    finally:
        for name in _TASK_FAILURE_LOGGERS:
            configurator.setLevel(name, level.ERROR)


def retry_cost(b: Bench, df: DataFrame) -> dict[str, Any]:
    """A WAL-on write whose every partition's worker is SIGKILLed halfway (attempt 0), against the same write
    undisturbed; the retried tasks must skip what Kafka already acknowledged."""
    partitions = 4
    kill_after = ROWS // DF_PARTITIONS // 2
    print(f"\n== retry cost: 100 B, {partitions}-partition topic, _test.killAfterRecords={kill_after:,}", flush=True)
    print("  (each killed run makes Spark log one 'Python worker exited unexpectedly' per partition: intended; "
          "those loggers are silenced for the killed runs)", flush=True)
    plain: list[Run] = []
    killed: list[Run] = []
    for rep in range(REPS):
        plain.append(b.timed(f"wal_on no-kill rep {rep + 1}/{REPS}", partitions, ROWS, b.recoverable(df, wal=True)))
        with quiet_task_failures(b.spark):
            killed.append(b.timed(f"wal_on killed rep {rep + 1}/{REPS}", partitions, ROWS,
                                  b.recoverable(df, wal=True, **{"_test.killAfterRecords": str(kill_after)})))
    details = []
    for run in killed:
        s = run.summary or {}
        published, skipped = s.get("published"), s.get("skipped")
        resent = published - (ROWS - skipped) if published is not None and skipped is not None else None
        details.append({"seconds": run.seconds and round(run.seconds, 3), "published": published,
                        "skipped": skipped, "retried_partitions": s.get("retried_partitions"),
                        "records_resent": resent, "topic_holds_rows": run.error is None, "error": run.error})
        if resent not in (0, None):
            b.errors.append(f"retry run re-sent {resent} records Kafka had already acknowledged")
        if run.error is None and s.get("retried_partitions", 0) < 1:
            b.errors.append("retry run: _test.killAfterRecords did not make any partition retry")
    p = [r.seconds for r in plain if r.error is None and r.seconds]
    k = [r.seconds for r in killed if r.error is None and r.seconds]
    med_p, med_k = (statistics.median(p) if p else None), (statistics.median(k) if k else None)
    return {"value_bytes": 100, "topic_partitions": partitions, "rows": ROWS, "kill_after_records": kill_after,
            "no_kill_runs": [r.seconds and round(r.seconds, 3) for r in plain],
            "killed_runs": details,
            "no_kill_median_seconds": med_p and round(med_p, 3), "killed_median_seconds": med_k and round(med_k, 3),
            "extra_seconds": round(med_k - med_p, 3) if med_p and med_k else None}


def memory_by_partition_size(b: Bench) -> list[dict[str, Any]]:
    """One task writing one partition of 1x and 4x the benchmark's partition size (1 KB values, WAL on):
    the Python worker's peak memory should not grow with it."""
    base = ROWS // DF_PARTITIONS
    out = []
    print(f"\n== memory by partition size: one partition of {base:,} and {4 * base:,} rows, 1 KB values", flush=True)
    for factor in (1, 4):
        rows = factor * base
        df = frame(b.spark, rows, 1024, partitions=1)
        run = b.timed(f"wal_on 1KB one partition x{factor}", 4, rows, b.recoverable(df, wal=True), sample_rss=True)
        out.append({"partition_rows": rows, "factor": factor, "seconds": run.seconds and round(run.seconds, 3),
                    "worker_peak_rss_mib": run.peak_rss_mib and round(run.peak_rss_mib, 1),
                    "worker_peak_anon_mib": run.peak_anon_mib and round(run.peak_anon_mib, 1), "error": run.error})
    return out


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(OUT / "wal", ignore_errors=True)
    (OUT / "summary.jsonl").unlink(missing_ok=True)
    root = OUT / "kafka"
    KafkaCluster(root, 1).wipe()  # a previous run that died may have left its broker running
    # Deleted topics' files go after 1 s, not the default minute, so 2 GB runs do not pile up on disk.
    cluster = KafkaCluster(root, 1, broker_props={"log.segment.delete.delay.ms": "1000"})
    print(f"starting a broker under {root} ...", flush=True)
    cluster.start()
    started = time.monotonic()
    # Counted from here: the broker already runs, so only what this process starts next (Spark's JVM, its Python
    # workers, the raw client) shares its CPU account.
    cpu = CpuMeter({p.pid for p in cluster.procs.values()})
    spark = None
    b: Bench | None = None
    try:
        spark = spark_session()
        from recoverable_sink import RecoverableKafkaDataSource

        spark.dataSource.register(RecoverableKafkaDataSource)
        spark.dataSource.register(PythonFloor)
        b = Bench(spark, cluster, cpu=cpu)
        results: list[dict[str, Any]] = []
        ratios: list[dict[str, Any]] = []
        rss: list[dict[str, Any]] = []
        retry: dict[str, Any] = {}
        for shape in SHAPES:
            if ONLY and not any(label == shape.label for label, _ in ONLY):
                continue
            df = bench_shape(b, shape, results, ratios, rss)
            if shape == SHAPES[0] and not ONLY:
                retry = retry_cost(b, df)
            df.unpersist(blocking=True)  # the next shape's cache needs the storage memory
        memory = memory_by_partition_size(b) if not ONLY else []
        rate: dict[str, Any] = {}
        if not ONLY:
            from bench import rate as rate_limit

            rate = rate_limit.measure(b)
        registry: dict[str, Any] = {}
        if not ONLY:
            from bench import registry as schema_registry

            registry = schema_registry.measure(b)
        dead: dict[str, Any] = {}
        proof: dict[str, Any] = {}
        own: dict[str, Any] = {}
        latency: dict[str, Any] = {}
        if not ONLY:
            from bench import dead_letters, own_produce
            from testing.kafka_check import count_records

            dead = dead_letters.measure(b)
            from bench import proof_cost

            proof = proof_cost.measure(b)
            from bench import stream_latency

            latency = stream_latency.measure(b.spark, b.bootstrap, lambda: b.fresh_topic("latency", 4))
            own = own_produce.measure(b.bootstrap, lambda: b.fresh_topic("own-produce", 1),
                                      lambda topic: count_records(b.bootstrap, topic))
        fixed: dict[str, Any] = {}
        if not ONLY:  # last: it stops the session, to time a first write in a new one
            from bench.fixed_cost import measure

            fixed = measure(cluster.bootstrap_servers, lambda: b.fresh_topic("fixed", 2))
        for e in results:
            b.errors.extend(e["errors"])
        report = {
            "rows": ROWS, "reps": REPS, "jvm_warmup_writes": JVM_WARMUP_WRITES, "jvm_warmup_max": JVM_WARMUP_MAX,
            "jvm_warmup_rounds": b.jvm_warmup_rounds, "cores": CORES,
            "spark_master": "local[2,4]", "cpu_accounting": cpu.method,
            "note": f"Spark cases run {CORES} tasks in parallel on {CORES} cores; raw_client is one producer in one "
                    "Python thread (1 core, plus librdkafka's I/O threads); "
                    "wal_on_vs_raw_client_per_core = (wal_on rows/s / 2) / (raw_client rows/s / 1). "
                    "Seconds are the write call's wall time (Spark job planning and scheduling included). "
                    "CPU is user + system of the driver, its JVM and every Python worker over the write call (the "
                    "broker excluded; raw_client: its own process over its timed section); python_floor is a Python "
                    "sink that only counts its Arrow batches (bench.floor).",
            "results": results, "ratios": ratios, "worker_peak_rss": rss, "retry_cost": retry,
            "memory_by_partition_size": memory, "fixed_cost": fixed, "rate_limit": rate,
            "schema_registry": registry, "dead_letters": dead, "proof_cost": proof, "own_produce_prototype": own,
            "stream_latency": latency,
            "errors": sorted(set(b.errors)), "ok": not b.errors,
            "wall_minutes": round((time.monotonic() - started) / 60, 1),
        }
        (OUT / "results.json").write_text(json.dumps(report, indent=2) + "\n")
        plot(results, OUT / "results.png", ROWS)
        print("\n" + markdown(report))
        print(f"\nresults: {OUT / 'results.json'}, chart: {OUT / 'results.png'}")
        return 0 if report["ok"] else 1
    finally:
        if b is not None:
            b.admin = None  # closed before the broker goes, or librdkafka complains of the lost connection
        if spark is not None:
            spark.stop()
        cluster.stop()
        cpu.close()


if __name__ == "__main__":
    sys.exit(main())
