"""The benchmarks' shared harness: one write, timed, to a fresh topic whose record count is checked.

``Bench`` holds the SparkSession and the local broker and builds the writers the benchmarks compare (Spark's
``format("kafka")``, the ``recoverable_kafka`` sink, bench.raw_client); ``frame`` is the DataFrame they write and
``spark_session`` the session. ``make bench`` (bench.run), bench.floor, bench.ab and bench.sizes use it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import traceback
import uuid
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from confluent_kafka.admin import AdminClient

from bench.cpu import CpuMeter
from bench.raw_client import DISTINCT_KEYS
from bench.rss import WorkerRssSampler
from testing.kafka_check import count_records, count_topic
from testing.kafka_local import REPO, KafkaCluster
from testing.spark import local_spark, sink_writer

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

OUT = REPO / "build" / "bench"
DF_PARTITIONS = 4  # frame()'s default number of Spark partitions


@dataclass
class Run:
    seconds: float | None = None
    cpu_seconds: float | None = None  # user + system of the driver, its JVM and the Python workers (bench.cpu)
    error: str | None = None
    summary: dict[str, Any] | None = None
    peak_rss_mib: float | None = None
    peak_anon_mib: float | None = None


@dataclass
class Bench:
    spark: SparkSession
    cluster: KafkaCluster
    errors: list[str] = field(default_factory=list)
    admin: AdminClient | None = None
    jvm_warm: bool = False
    jvm_warmup_rounds: int = 0
    cpu: CpuMeter | None = None

    @property
    def bootstrap(self) -> str:
        return self.cluster.bootstrap_servers

    # ---- topics ---------------------------------------------------------------------------------------
    def fresh_topic(self, label: str, partitions: int) -> str:
        # create_topic waits until every partition's log answers (a first request too early made Spark's sink
        # stall 120 s and duplicate: KAFKA-15591).
        return self.cluster.create_topic(f"bench-{label}-{uuid.uuid4().hex[:8]}", partitions, 1)

    def drop_topic(self, topic: str) -> None:
        # 1 KB x 2M rows is 2 GB of log per run: delete it as soon as it is counted.
        # One long-lived client: a temporary one would be destroyed before its future resolves.
        if self.admin is None:
            self.admin = AdminClient({"bootstrap.servers": self.bootstrap})
        try:
            self.admin.delete_topics([topic], operation_timeout=60)[topic].result(timeout=90)
        except Exception as exc:  # a failed clean-up must not hide the measurement
            print(f"  warning: could not delete topic {topic}: {exc}", file=sys.stderr)

    def timed(self, what: str, partitions: int, rows: int, write: Callable[[str], dict[str, Any] | None],
              sample_rss: bool = False, verify: bool = True) -> Run:
        """Run one write to a fresh topic, time it and count its CPU, verify the topic holds exactly ``rows``
        records (unless ``verify`` is off: a sink that sends nothing)."""
        topic = self.fresh_topic(what.split()[0].replace("_", "-"), partitions)
        run = Run()
        sampler = WorkerRssSampler() if sample_rss else None
        try:
            with sampler or nullcontext():
                cpu_before = self.cpu.seconds() if self.cpu is not None else None
                started = time.perf_counter()
                run.summary = write(topic)
                run.seconds = time.perf_counter() - started
                if cpu_before is not None and self.cpu is not None:
                    run.cpu_seconds = self.cpu.seconds() - cpu_before
                if run.summary and "timed_seconds" in run.summary:  # a case that times itself (the raw client)
                    run.seconds = run.summary["timed_seconds"]
                    run.cpu_seconds = run.summary.get("cpu_seconds")
            # A transactional write's topic also holds its commit markers: count what read_committed reads.
            transactional = what.startswith("exactly_once")
            landed = rows if not verify else \
                count_records(self.bootstrap, topic) if transactional else count_topic(self.bootstrap, topic)
            if landed != rows:
                run.error = f"{what}: topic {topic} holds {landed} records, expected {rows}"
        except Exception as exc:  # record it, keep measuring the other cases
            run.error = f"{what}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            traceback.print_exc()
        finally:
            if sampler is not None:
                run.peak_rss_mib, run.peak_anon_mib = sampler.peak_mib(), sampler.peak_anon_mib()
            self.drop_topic(topic)
        if run.error:
            self.errors.append(run.error)
            print(f"  ERROR {run.error}", flush=True)
        else:
            print(f"  {what}: {run.seconds:.2f} s ({rows / run.seconds:,.0f} rows/s)"
                  + (f", CPU {run.cpu_seconds * 1e6 / rows:.2f} µs/record" if run.cpu_seconds is not None else "")
                  + (f", worker peak RSS {run.peak_rss_mib:.0f} MiB (anon {run.peak_anon_mib:.0f})"
                     if run.peak_rss_mib else ""), flush=True)
        return run

    # ---- the four writers ---------------------------------------------------------------------------------
    def spark_kafka(self, df: DataFrame) -> Callable[[str], None]:
        def write(topic: str) -> None:
            (df.write.format("kafka")
             .option("kafka.bootstrap.servers", self.bootstrap)
             .option("topic", topic)
             .option("kafka.acks", "all")
             .option("kafka.enable.idempotence", "true")
             .mode("append").save())
        return write

    def recoverable(self, df: DataFrame, wal: bool, **extra: str) -> Callable[[str], dict[str, Any]]:
        def write(topic: str) -> dict[str, Any]:
            summary_path = OUT / "summary.jsonl"
            options = {"summary.path": str(summary_path), **({} if wal else {"wal.enabled": "false"}), **extra}
            sink_writer(df, self.bootstrap, topic, OUT / "wal", **options).save()
            # The driver appends one line per write; the last one is this write's.
            return json.loads(summary_path.read_text().splitlines()[-1])
        return write

    def python_floor(self, df: DataFrame) -> Callable[[str], None]:
        """bench.floor's sink, which only counts its Arrow batches: what any Python sink pays before it sends."""
        def write(topic: str) -> None:
            df.write.format("python_floor").mode("append").save()
        return write

    def raw_client(self, rows: int, value_bytes: int, headers: bool) -> Callable[[str], dict[str, Any]]:
        """The raw client in a process of its own (bench.raw_client), which builds its records before it starts
        its clock; the time counted is the one it reports."""
        def write(topic: str) -> dict[str, Any]:
            command = [sys.executable, "-m", "bench.raw_client", self.bootstrap, topic, str(rows), str(value_bytes)]
            done = subprocess.run([*command, *(["--headers"] if headers else [])], cwd=REPO, capture_output=True,
                                  text=True, timeout=1800)
            if done.returncode != 0:
                raise RuntimeError(f"bench.raw_client exited with {done.returncode}: {done.stderr.strip()[-500:]}")
            result = json.loads(done.stdout.strip().splitlines()[-1])
            return {"timed_seconds": result["seconds"], "cpu_seconds": result.get("cpu_seconds")}
        return write


def spark_session() -> SparkSession:
    # The sink's per-write INFO lines would drown the progress lines; its warnings (the kills) still show.
    if not (os.environ.get("RECOVERABLE_KAFKA_LOG_LEVEL") or os.environ.get("RECOVERABLE_SINK_LOG_LEVEL")):
        os.environ["RECOVERABLE_KAFKA_LOG_LEVEL"] = "WARNING"
    return local_spark("recoverable-sink-bench", **{"spark.driver.memory": "4g"})


def frame(spark: SparkSession, rows: int, value_bytes: int, headers: bool = False,
          partitions: int = DF_PARTITIONS) -> DataFrame:
    """key = k<id % 100000>; value = "<id>:" padded with x to value_bytes (unique per row); with ``headers``,
    two headers: source=bench and seq=<id>."""
    from pyspark.sql import functions as F

    columns = [
        F.concat(F.lit("k"), (F.col("id") % DISTINCT_KEYS).cast("string")).alias("key"),
        F.rpad(F.concat(F.col("id").cast("string"), F.lit(":")), value_bytes, "x").alias("value"),
    ]
    if headers:
        columns.append(F.array(
            F.struct(F.lit("source").alias("key"), F.lit("bench").cast("binary").alias("value")),
            F.struct(F.lit("seq").alias("key"), F.col("id").cast("string").cast("binary").alias("value")),
        ).alias("headers"))
    return spark.range(0, rows, 1, partitions).select(*columns)


def run_alone(measure: Callable[[Bench], dict[str, Any]], name: str, count_cpu: bool = True) -> int:
    """A section of ``make bench`` run on its own (``python -m bench.<name>``): the development broker, a session
    with the sink registered, ``measure``'s result written to build/bench/<name>.json and printed. Exit status 0
    unless the Bench noted an error."""
    from recoverable_sink import RecoverableKafkaDataSource
    from testing.kafka_local import ensure_local, local_cluster

    ensure_local()
    cpu = CpuMeter(set()) if count_cpu else None
    spark = spark_session()
    spark.dataSource.register(RecoverableKafkaDataSource)
    b = Bench(spark, local_cluster(), cpu=cpu)
    try:
        result = measure(b)
    finally:
        spark.stop()
        if cpu is not None:
            cpu.close()
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    sys.stdout.write(json.dumps(result, indent=2) + "\n")
    return 0 if not b.errors else 1
