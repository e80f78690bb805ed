"""An executor on another host than the driver, as on any real cluster: a standalone worker whose processes have
a host name of their own (a UTS namespace, ``unshare --uts``), with its WAL where the driver never looks. The
proof of delivery of committed writes with a generated id must leave that host's WAL by itself."""

import json
import shutil
import socket

import pytest

from recoverable_sink.wal import open_wal
from testing.chaos.checker import ids_in_topic, verdict
from testing.chaos.lab import python_subprocess
from testing.standalone import StandaloneCluster

pytestmark = pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare (util-linux)")

EXECUTOR_HOST = "rk-executor-host"


def test_the_proof_of_committed_generated_id_writes_leaves_an_executor_host(kafka, new_topic, tmp_path):
    wal, topic, rows = tmp_path / "wal", new_topic(4), 8_000
    conf = {"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1", "spark.cores.max": "1",
            "spark.executor.cores": "1"}
    with StandaloneCluster(tmp_path / "cluster", {"127.0.0.1": {"RECOVERABLE_KAFKA_WAL_PATH": str(wal)}},
                           host_names={"127.0.0.1": EXECUTOR_HOST}) as cluster:
        for write in range(2):
            job = python_subprocess(
                ["-m", "testing.chaos.jobs", "--master", cluster.master_url, "--rows", str(rows),
                 "--prefix", f"w{write}", "--bootstrap", kafka.bootstrap_servers, "--topic", topic,
                 "--summary", str(tmp_path / "summary.jsonl"), "--option", "wal.proofGraceSeconds=1",
                 *[arg for item in conf.items() for arg in ("--conf", "=".join(item))]],
                tmp_path / f"job{write}.log", SPARK_LOCAL_IP="127.0.0.1")
            assert job.wait(300) == 0, (tmp_path / f"job{write}.log").read_text(errors="replace")[-3000:]
    found = ids_in_topic(kafka.bootstrap_servers, topic, expected=2 * rows)
    assert verdict((f"w{w}-{i}" for w in range(2) for i in range(rows)), found) == (0, 0, 0)

    attempts = open_wal(str(wal)).attempts()
    assert {a.host for a in attempts} <= {EXECUTOR_HOST} != {socket.gethostname()}  # not the driver's host
    writes = [json.loads(line)["write_id"] for line in (tmp_path / "summary.jsonl").read_text().splitlines()
              if line.strip()]
    assert len(writes) == 2
    # The second write's tasks released the proof of the first (done over a second earlier); only the second's
    # may be left, for the next task on this host to release.
    assert {a.write_id for a in attempts} <= {writes[-1]}, sorted({(a.write_id, a.state) for a in attempts})
