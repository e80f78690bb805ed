"""What the scenarios share: the brokers, one local[2,4] SparkSession, a work directory and small helpers
(processes to kill, fault points to wait for, a write with a fault injected beside it)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaException

from testing.kafka_check import count_topic
from testing.kafka_local import REPO, KafkaCluster
from testing.spark import python_env, sink_writer
from testing.waiting import wait_until


@dataclass
class Trial:
    """One run of one scenario."""

    records_expected: int = 0
    lost: int = 0
    duplicated: int = 0
    errors: list[str] = field(default_factory=list)
    notes: dict[str, Any] = field(default_factory=dict)
    passed: bool = True


class Lab:
    def __init__(self, work: Path, kafka: KafkaCluster, kafka3: Callable[[], KafkaCluster],
                 spark: Callable[[], Any], guarantee: str = "at_least_once") -> None:
        self.guarantee = guarantee  # delivery.guarantee of every write the scenarios make
        self.work = work
        self.kafka = kafka
        self._kafka3 = kafka3
        self._spark = spark

    @property
    def spark(self) -> Any:
        return self._spark()

    @property
    def exactly_once(self) -> bool:
        return self.guarantee == "exactly_once"

    def job_args(self) -> list[str]:
        """The delivery guarantee, for a subprocess job (testing.chaos.jobs, testing.stream_job)."""
        return ["--option", f"delivery.guarantee={self.guarantee}"]

    @property
    def kafka3(self) -> KafkaCluster:
        return self._kafka3()

    def dir(self, name: str) -> Path:
        path = self.work / f"{name}-{uuid.uuid4().hex[:8]}"
        path.mkdir(parents=True)
        return path

    def topic(self, partitions: int = 4, cluster: KafkaCluster | None = None, **config: str) -> str:
        cluster = cluster or self.kafka
        return cluster.create_topic(f"chaos-{uuid.uuid4().hex[:10]}", partitions, None, config or None)

    def records(self, n: int, partitions: int = 4, prefix: str = "") -> tuple[Any, list[str]]:
        """A DataFrame of ``n`` records whose key is a unique id, and the ids."""
        from pyspark.sql import functions as F

        prefix = prefix or uuid.uuid4().hex[:6]
        df = self.spark.range(n, numPartitions=partitions).select(
            F.concat(F.lit(f"{prefix}-"), F.col("id").cast("string")).alias("key"),
            F.concat(F.lit("payload-"), F.col("id").cast("string"), F.lit("-" + "x" * 60)).alias("value"))
        return df, [f"{prefix}-{i}" for i in range(n)]

    def write(self, df: Any, bootstrap: str, topic: str, wal: Path, summary: Path, **options: str) -> dict:
        sink_writer(df, bootstrap, topic, wal, **{"summary.path": str(summary), "delivery.guarantee": self.guarantee,
                                                  **options}).save()
        return last_summary(summary)


def last_summary(path: Path) -> dict:
    return json.loads(path.read_text().splitlines()[-1])


def python_subprocess(args: list[str], log: Path, **env: str) -> subprocess.Popen:
    """A child Python program in its own process group (so a SIGKILL can take all of it)."""
    out = open(log, "ab")
    return subprocess.Popen([sys.executable, *args], cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                            start_new_session=True, env={**python_env(), **env})


def kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(60)


def ancestor_with(pid: int, needle: str) -> int | None:
    """The nearest ancestor process (or ``pid`` itself) whose command line contains ``needle``."""
    while pid > 1:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return None
        if needle in cmdline:
            return pid
        pid = int(stat.rsplit(")", 1)[1].split()[1])
    return None


def python_workers(wal_dir: Path) -> list[int]:
    """Spark Python workers (children of a pyspark.daemon) that have this WAL's data file open: the ones
    writing this trial's partitions, not idle reused workers."""
    target = str(wal_dir / "data.mdb")
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if b"pyspark.daemon" not in (entry / "cmdline").read_bytes():
                continue
            if any(os.readlink(fd) == target for fd in (entry / "fd").iterdir()):
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


def short_error(exc: BaseException) -> str:
    """The sink's own message out of a Spark/Py4J exception (the first line naming recoverable_sink)."""
    text = str(exc)
    for line in text.splitlines():
        if "recoverable_sink.errors." in line or "Error:" in line and "recoverable" in line:
            return line.strip()[:400]
    return text.splitlines()[0][:400] if text else type(exc).__name__


def cli(*args: str) -> subprocess.CompletedProcess:
    """The ``recoverable-kafka-wal`` command line, run from the repository."""
    return subprocess.run([sys.executable, "-m", "recoverable_sink.ops.cli", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=600)


def landed(bootstrap: str, topic: str) -> int:
    """Records in the topic so far, for waiting on a fault point: -1 while a leader does not answer (a broker
    just restarted by an earlier trial), which only means "not yet"."""
    try:
        return count_topic(bootstrap, topic)
    except KafkaException:
        return -1


def wait_for_records(bootstrap: str, topic: str, target: float, done: threading.Event) -> None:
    """Block until the topic holds ``target`` records or the write is over."""
    wait_until(lambda: done.is_set() or landed(bootstrap, topic) >= target, 300,
               "the write to reach the fault point", every_s=0.01)


def write_with_fault(trial: Trial, fault: Callable[[threading.Event], None],
                     write: Callable[[], dict]) -> dict | None:
    """Run ``write`` on this thread (Spark finds a registered Python data source through the calling thread's
    active session) while ``fault`` waits for its moment on another; errors go into the trial."""
    done = threading.Event()
    fault_errors: list[BaseException] = []

    def guarded() -> None:
        try:
            fault(done)
        except BaseException as exc:  # noqa: BLE001
            fault_errors.append(exc)

    injector = threading.Thread(target=guarded, daemon=True)
    injector.start()
    summary = None
    try:
        summary = write()
    except Exception as exc:  # noqa: BLE001
        trial.errors.append(short_error(exc))
    finally:
        done.set()
        injector.join(300)
    if fault_errors:
        trial.errors.append(f"fault injection failed: {fault_errors[0]}")
        trial.passed = False
    return summary


def random_fault_setup(lab: Lab, rng: random.Random, n: int, name: str, partitions: int,
                       cluster: KafkaCluster | None = None,
                       replication: int | None = 1) -> tuple[Path, str, Any, list[str], float]:
    """Work dir, topic, 3n records and a random fault point between 10% and 60% of them."""
    cluster = cluster or lab.kafka
    d = lab.dir(name)
    topic = cluster.create_topic(f"chaos-{os.urandom(5).hex()}", 4, replication)
    df, ids = lab.records(3 * n, partitions)
    return d, topic, df, ids, rng.uniform(0.1, 0.6) * len(ids)


def names_the_brokers_gone(error: str, exactly_once: bool) -> bool:
    """Whether a write's last error is one the brokers' death may end it with: records not acknowledged; a retry that
    started while they were down and could not read its write's proof; under exactly_once, a task that could not
    begin its transaction."""
    return "did not acknowledge" in error or ("proof topic" in error and "could not be read" in error) or \
        (exactly_once and "init_transactions" in error)


def write_through_broker_death(lab: Lab, d: Path, topic: str, df: Any, target: float, notes: dict[str, object],
                               **options: str) -> tuple[Trial, dict | None]:
    """Write while the broker is SIGKILLed once ``target`` records landed; restart it when the write is over."""

    def fault(done: threading.Event) -> None:
        wait_for_records(lab.kafka.bootstrap_servers, topic, target, done)
        notes["mid_write"] = not done.is_set()
        lab.kafka.kill_broker(1)

    trial = Trial(notes=notes)
    try:
        summary = write_with_fault(trial, fault, lambda: lab.write(
            df, lab.kafka.bootstrap_servers, topic, d / "wal", d / "summary.jsonl",
            **{"kafka.request.timeout.ms": "3000", **options}))
    finally:
        lab.kafka.start_broker(1)
    return trial, summary
