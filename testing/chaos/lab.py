"""What the scenarios share: the brokers, one local[2,4] SparkSession, a work directory and small helpers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from testing.kafka_local import REPO, KafkaCluster
from testing.spark import python_env, sink_writer


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
