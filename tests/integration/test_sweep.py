"""The retention sweep against a task that is still running: with a retention of two seconds, a task that
waits longer than that for its first batch must keep its log while tasks that start later sweep the WAL.
Both delivery modes; how long each task waits is drawn at random. A driver of its own, with Python workers
not reused, so that every task's worker sweeps as it starts (a reused one sweeps once per 10 minutes)."""

import json
import random
import subprocess
import sys

import pytest

from testing.chaos.checker import ids_in_topic, verdict
from testing.kafka_local import REPO
from testing.spark import python_env

ROWS, PARTITIONS = 6_000, 4


@pytest.mark.parametrize("mode", ["at_least_once", "exactly_once"])
def test_a_sweep_never_removes_the_log_of_a_task_still_waiting_for_its_input(kafka, new_topic, tmp_path, mode):
    slow, quick = random.uniform(6.0, 9.0), random.uniform(2.5, 4.0)
    print(f"partition 0 waits {slow:.2f} s for its first row, partition 1 {quick:.2f} s")
    topic, summary = new_topic(2), tmp_path / "summary.jsonl"
    job = subprocess.run(
        [sys.executable, "-m", "testing.chaos.jobs", "--rows", str(ROWS), "--partitions", str(PARTITIONS),
         "--prefix", "sw", "--bootstrap", kafka.bootstrap_servers, "--topic", topic, "--wal", str(tmp_path / "wal"),
         "--summary", str(summary), "--conf", "spark.python.worker.reuse=false",
         "--delay", f"0={slow}", "--delay", f"1={quick}",
         "--option", f"delivery.guarantee={mode}", "--option", f"wal.retentionHours={2.0 / 3600}"],
        cwd=REPO, env=python_env(), capture_output=True, text=True, timeout=300)
    assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-3000:]
    found = ids_in_topic(kafka.bootstrap_servers, topic, expected=ROWS)
    assert verdict((f"sw-{i}" for i in range(ROWS)), found) == (0, 0, 0)
    assert json.loads(summary.read_text().splitlines()[-1])["retried_partitions"] == 0
