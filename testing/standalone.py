"""A Spark standalone cluster on this machine whose workers count as *different hosts* to Spark.

Spark never runs a speculative copy on a host where the task already has an attempt, and local-cluster
workers all share one host name, so speculation cannot happen there. Spark compares host names as strings:
a worker advertised as ``127.0.0.1`` and one advertised as ``localhost`` are two hosts to the scheduler,
while both still listen on 127.0.0.1 only. Each worker gets its own environment (e.g. its own
``RECOVERABLE_KAFKA_WAL_PATH``, so each "host" has its own WAL, as on a real cluster).

    with StandaloneCluster(work_dir, {"127.0.0.1": {...env...}, "localhost": {...env...}}) as cluster:
        ... SparkSession with master=cluster.master_url ...
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path
from types import TracebackType

import pyspark

from testing.kafka_local import free_port
from testing.spark import python_env
from testing.waiting import wait_until

SPARK_HOME = Path(pyspark.__file__).resolve().parent


class StandaloneCluster:
    """A master on 127.0.0.1 and one single-core worker per host name in ``workers`` (name -> extra env)."""

    def __init__(self, work: Path, workers: dict[str, dict[str, str]], memory: str = "1g",
                 host_names: dict[str, str] | None = None) -> None:
        self.work = work
        self.workers = workers
        # Worker -> the host name its processes see (a UTS namespace of their own, by `unshare --uts`): an
        # executor on "another host" than the driver, as on a real cluster, while still on 127.0.0.1.
        self.host_names = host_names or {}
        self.memory = memory
        self.port = free_port()
        self.master_url = f"spark://127.0.0.1:{self.port}"
        self.procs: list[subprocess.Popen] = []

    def _env(self, extra: dict[str, str]) -> dict[str, str]:
        # SPARK_LOCAL_IP keeps every web UI and RPC endpoint on 127.0.0.1. The daemons log at Spark's default
        # INFO level: their logs are how __enter__ knows the master is up and the workers registered.
        return {**python_env(), "SPARK_HOME": str(SPARK_HOME), "SPARK_LOCAL_IP": "127.0.0.1", **extra}

    def _start(self, name: str, args: list[str], extra: dict[str, str],
               host_name: str | None = None) -> subprocess.Popen:
        log = open(self.work / f"{name}.log", "ab")
        command = [str(SPARK_HOME / "bin" / "spark-class"), *args]
        if host_name is not None:
            command = ["unshare", "--uts", "sh", "-c", f'hostname {host_name} && exec "$@"', "sh", *command]
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=self._env(extra),
                                start_new_session=True)
        self.procs.append(proc)
        return proc

    def _log(self, name: str) -> str:
        path = self.work / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def __enter__(self) -> StandaloneCluster:
        try:
            return self._start_all()
        except BaseException:
            self.__exit__(None, None, None)  # a daemon that started must not outlive a failed start
            raise

    def _start_all(self) -> StandaloneCluster:
        self.work.mkdir(parents=True, exist_ok=True)
        self._start("master", ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port",
                               str(self.port), "--webui-port", "0"], {})
        wait_until(lambda: "I have been elected leader" in self._log("master") or self.procs[0].poll() is not None,
                   120, "the Spark master to start")
        if self.procs[0].poll() is not None:
            raise RuntimeError(f"the Spark master did not start:\n{self._log('master')[-2000:]}")
        for i, (host, env) in enumerate(self.workers.items()):
            self._start(f"worker-{i}", ["org.apache.spark.deploy.worker.Worker", "--host", host, "--port", "0",
                                        "--webui-port", "0", "--cores", "1", "--memory", self.memory,
                                        "--work-dir", str(self.work / f"worker-{i}"), self.master_url], env,
                        self.host_names.get(host))
        wait_until(lambda: len(re.findall(r"Registering worker", self._log("master"))) >= len(self.workers)
                   or any(p.poll() is not None for p in self.procs), 120, "the Spark workers to register")
        dead = [i for i, p in enumerate(self.procs) if p.poll() is not None]
        if dead:
            raise RuntimeError("a Spark daemon exited:\n" + "\n".join(
                self._log("master" if i == 0 else f"worker-{i - 1}")[-1500:] for i in dead))
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        # Executors are children of their worker, in its process group: one SIGKILL per group takes them too.
        for proc in reversed(self.procs):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for proc in self.procs:
            proc.wait(60)
