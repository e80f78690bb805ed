"""Fault family: the state the sink leaves behind, on the brokers and in the WAL, over a long run. A stream of
200 exactly_once micro-batches, after which the brokers hold at most 2 x partitions of its transactional ids
and marker groups (20); tasks that start after ``wal.retentionHours`` sweeping the WAL while an earlier task
still waits for its input, an expensive upstream stage (21). Each runs a driver of its own (for 21 with Python
workers not reused, so that every task's worker sweeps as it starts).

A read_committed reader must see every record exactly once; in 21 no task may have been retried.
"""

from __future__ import annotations

import random
import uuid

from testing.chaos.checker import ids_in_topic, verdict
from testing.chaos.lab import Lab, Trial, last_summary, python_subprocess
from testing.chaos.scenarios.upstream import file_stream_args
from testing.kafka_check import consumer_groups, transactional_ids


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


def long_stream_broker_state(lab: Lab, rng: random.Random, n: int) -> Trial:
    """exactly_once: a query of 200 micro-batches over 4 partitions. The brokers keep at most 2 x 4 of its
    transactional ids and of its marker groups, whatever the query's length; every record once."""
    d, topic, partitions, batches = lab.dir("long-stream"), lab.topic(4), 4, 200
    per_file = max(8, n // 400)
    prefix = f"long-{uuid.uuid4().hex[:8]}-"
    args = file_stream_args(lab, d, topic, batches, per_file, "--repartition", str(partitions),
                            "--option", f"transactional.id.prefix={prefix}")
    job = python_subprocess(args, d / "job.log")
    trial = Trial(notes={"micro_batches": batches})
    if job.wait(1800) != 0:
        trial.errors.append((d / "job.log").read_text()[-600:])
        trial.passed = False
        return trial
    ids = transactional_ids(lab.kafka.bootstrap_servers, prefix) - {f"{prefix}preflight"}
    groups = consumer_groups(lab.kafka.bootstrap_servers, prefix)
    trial.notes.update(transactional_ids=len(ids), marker_groups=len(groups))
    if len(ids) > 2 * partitions or len(groups) > 2 * partitions:
        trial.errors.append(f"{len(ids)} transactional ids and {len(groups)} marker groups after {batches} "
                            f"micro-batches of {partitions} partitions")
        trial.passed = False
    total = batches * per_file
    found = ids_in_topic(lab.kafka.bootstrap_servers, topic, expected=total)
    trial.lost, trial.duplicated, unexpected = verdict([str(i) for i in range(total)], found)
    trial.records_expected = total
    trial.passed = trial.passed and trial.lost == 0 and trial.duplicated == 0 and not unexpected
    return trial
