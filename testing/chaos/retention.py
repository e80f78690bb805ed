"""Fault scenario of the WAL's retention: tasks that start after ``wal.retentionHours`` sweep the WAL while an
earlier task still waits for its input (an expensive upstream stage). A driver of its own, with Python workers
not reused, so that every task's worker sweeps as it starts."""

from __future__ import annotations

import random

from testing.chaos.checker import ids_in_topic, verdict
from testing.chaos.lab import Lab, Trial, last_summary, python_subprocess


def sweep_while_running(lab: Lab, rng: random.Random, n: int) -> Trial:
    """A retention of 2 s; 4 partitions, the first two held back 2.5-9 s before their first row (at random), the
    others sweeping as they start. Nothing may be retried, lost or repeated."""
    d, topic, rows, partitions = lab.dir("sweep"), lab.topic(2), 3 * n, 4
    delays = {0: rng.uniform(5.0, 9.0), 1: rng.uniform(2.5, 4.5)}
    trial = Trial(notes={"delays_s": {p: round(s, 2) for p, s in delays.items()}})
    job = python_subprocess(
        ["-m", "testing.chaos.jobs", "--rows", str(rows), "--partitions", str(partitions), "--prefix", "sweep",
         "--bootstrap", lab.kafka.bootstrap_servers, "--topic", topic, "--wal", str(d / "wal"),
         "--summary", str(d / "summary.jsonl"), "--conf", "spark.python.worker.reuse=false",
         *(a for p, s in delays.items() for a in ("--delay", f"{p}={s}")),
         "--option", f"wal.retentionHours={2.0 / 3600}", *lab.job_args()], d / "job.log")
    if job.wait(600) != 0:
        trial.errors.append((d / "job.log").read_text()[-600:])
        trial.passed = False
        return trial
    retried = last_summary(d / "summary.jsonl")["retried_partitions"]
    trial.notes["retried_partitions"] = retried
    found = ids_in_topic(lab.kafka.bootstrap_servers, topic, expected=rows)
    trial.lost, trial.duplicated, unexpected = verdict([f"sweep-{i}" for i in range(rows)], found)
    trial.records_expected = rows
    trial.passed = trial.lost == 0 and trial.duplicated == 0 and not unexpected and retried == 0
    return trial
