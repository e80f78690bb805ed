"""Fault family: the Python worker writing a partition dies (SIGKILL), once a checkpoint acknowledged its
first k records (1) or at a random moment of the write (1b); Spark retries the task in a fresh worker on the
same host, whose WAL tells it what Kafka acknowledged.

A read_committed reader must see every record. After 1, none twice. After 1b under at_least_once, repeats
only of records in flight at the kill; under exactly_once none (the killed attempt's transaction is aborted).
"""

from __future__ import annotations

import os
import random
import signal
import threading

from testing.chaos.checker import check
from testing.chaos.lab import Lab, Trial, python_workers, random_fault_setup, wait_for_records, write_with_fault

# ---- 1. Python worker SIGKILL ----------------------------------------------------------------------------

def python_worker_kill(lab: Lab, rng: random.Random, n: int) -> Trial:
    """Each partition's Python worker is SIGKILLed once its first k records are acknowledged (k random);
    Spark retries the tasks (local[2,4]) and the retries must skip what was delivered."""
    d, topic = lab.dir("worker-kill"), lab.topic(4)
    df, ids = lab.records(n, 4)
    k = rng.randint(max(1, n // 40), n // 4 - n // 40)
    summary = lab.write(df, lab.kafka.bootstrap_servers, topic, d / "wal", d / "summary.jsonl",
                        **{"_test.killAfterRecords": str(k)})
    trial = Trial(notes={"kill_after": k, "retried_partitions": summary["retried_partitions"],
                         "skipped": summary["skipped"]})
    trial.passed = summary["retried_partitions"] > 0
    return check(lab, trial, lab.kafka.bootstrap_servers, topic, ids)


# ---- 1b. Python worker SIGKILL at a random moment --------------------------------------------------------

def python_worker_kill_random_moment(lab: Lab, rng: random.Random, n: int) -> Trial:
    """A Python worker SIGKILLed from outside at a random moment of the write (not at a checkpoint). Kafka may
    have acknowledged records whose acknowledgement the worker had not yet made durable: the retry re-sends
    them. Expected: none lost; duplicates bounded by the records in flight at the kill."""
    d, topic, df, ids, target = random_fault_setup(lab, rng, n, "worker-kill-random", 2)
    notes: dict[str, object] = {"at_records": int(target)}

    def fault(done: threading.Event) -> None:
        wait_for_records(lab.kafka.bootstrap_servers, topic, target, done)
        workers = python_workers(d / "wal")
        if not done.is_set() and workers:
            notes["killed_pid"] = rng.choice(workers)
            os.kill(notes["killed_pid"], signal.SIGKILL)  # type: ignore[arg-type]

    trial = Trial(notes=notes)
    summary = write_with_fault(trial, fault, lambda: lab.write(df, lab.kafka.bootstrap_servers, topic, d / "wal",
                                                                d / "summary.jsonl"))
    if summary:
        notes["retried_partitions"] = summary["retried_partitions"]
    check(lab, trial, lab.kafka.bootstrap_servers, topic, ids)
    # Duplicates here are the documented in-flight window; a kill that hit no writer proves nothing.
    trial.passed = trial.lost == 0 and not trial.errors and ("killed_pid" in notes or summary is not None)
    return trial
