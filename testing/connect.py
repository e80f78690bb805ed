"""A local Spark Connect server (``SparkConnectServer`` from pyspark's own jars) for the Connect tests.

The server is the Spark driver: its Python workers use this virtualenv, where the sink is installed, so a
Connect client writes ``format("recoverable_kafka")`` with no register call (the server finds the format).

    with ConnectServer(work_dir) as server:
        spark = SparkSession.builder.remote(server.url).getOrCreate()
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from types import TracebackType

from testing.kafka_local import free_port
from testing.spark import connector_jars, python_env
from testing.standalone import SPARK_HOME
from testing.waiting import wait_until

_STARTED = "Spark Connect server started at"


class ConnectServer:
    """``spark-submit --class org.apache.spark.sql.connect.service.SparkConnectServer`` on 127.0.0.1."""

    def __init__(self, work: Path, master: str = "local[2,4]") -> None:
        self.work = work
        self.master = master
        self.port = free_port()
        self.url = f"sc://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    @property
    def log_file(self) -> Path:
        return self.work / "connect-server.log"

    def _log(self) -> str:
        return self.log_file.read_text(errors="replace") if self.log_file.exists() else ""

    def __enter__(self) -> ConnectServer:
        self.work.mkdir(parents=True, exist_ok=True)
        # The server logs at Spark's default INFO level: its start line is how we know it is up.
        self.proc = subprocess.Popen(
            [str(SPARK_HOME / "bin" / "spark-submit"), "--master", self.master,
             "--class", "org.apache.spark.sql.connect.service.SparkConnectServer",
             "--conf", f"spark.connect.grpc.binding.port={self.port}",
             "--conf", "spark.connect.grpc.binding.address=127.0.0.1",
             "--conf", "spark.ui.enabled=false", "--conf", f"spark.pyspark.python={sys.executable}",
             "--conf", f"spark.jars={connector_jars()}", "--conf", "spark.task.maxFailures=4",
             "spark-internal"],
            cwd=self.work, stdout=open(self.log_file, "ab"), stderr=subprocess.STDOUT, start_new_session=True,
            env={**python_env(), "SPARK_HOME": str(SPARK_HOME), "SPARK_LOCAL_IP": "127.0.0.1"})
        try:
            wait_until(lambda: _STARTED in self._log() or self.proc.poll() is not None, 180,
                       "the Spark Connect server to start")
            if self.proc.poll() is not None:
                raise RuntimeError(f"the Spark Connect server did not start:\n{self._log()[-3000:]}")
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)

