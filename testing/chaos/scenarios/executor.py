"""Fault family: the executor JVM running a task dies (SIGKILL, its Python workers with it) once the task's
first k records are acknowledged (2), at a random moment of a sink stage reading a shuffle (14), or with its
WAL directory deleted so the retry runs as if on another host (15); and a task stalls until spark.speculation
runs a copy on another host (16). Each runs a driver of its own (local-cluster or a standalone cluster).

A read_committed reader must see every record. After 2, none twice. Under at_least_once, 14 and 15 may repeat
records acknowledged after the last checkpoint (15's retry finds the rest in the proof topic), 16 what both live
attempts send once the copy has started (the documented limit); under exactly_once none (the retry's or copy's
init_transactions fences the old attempt).
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess

from recoverable_sink.executor.partition_writer import CHECKPOINT_MAX_RECORDS
from testing.chaos.checker import check
from testing.chaos.lab import (
    Lab,
    Trial,
    ancestor_with,
    kill_group,
    landed,
    last_summary,
    python_subprocess,
    python_workers,
)
from testing.standalone import StandaloneCluster
from testing.waiting import wait_until

# ---- 2. Executor JVM SIGKILL on local-cluster ------------------------------------------------------------

def executor_jvm_kill(lab: Lab, rng: random.Random, n: int, wipe_wal: bool = False) -> Trial:
    """On local-cluster[2,1,1024], the executor JVM running a task is SIGKILLed once the task's first k
    records are acknowledged; the task is rescheduled on an executor of the same host, where the WAL is
    (with ``wipe_wal``, the WAL directory is deleted too: the retry runs as if on another host)."""
    d, topic = lab.dir("executor-kill"), lab.topic(4)
    prefix = f"ex{rng.randrange(1 << 30):x}"
    k = rng.randint(max(1, n // 40), n // 4 - n // 40)
    marker = d / "paused"
    job = python_subprocess(
        ["-m", "testing.chaos.jobs", "--master", "local-cluster[2,1,1024]", "--rows", str(n), "--prefix", prefix,
         "--bootstrap", lab.kafka.bootstrap_servers, "--topic", topic, "--wal", str(d / "wal"),
         "--summary", str(d / "summary.jsonl"), "--option", f"_test.pauseAfterRecords={k}",
         "--option", f"_test.pauseFile={marker}", *lab.job_args()], d / "job.log")
    trial = Trial(notes={"kill_after": k})
    try:
        wait_until(lambda: marker.exists() or job.poll() is not None, 240, "a task to reach the kill point")
        if job.poll() is not None:
            raise RuntimeError((d / "job.log").read_text()[-2000:])
        worker_pid = int(marker.read_text().split()[3])
        executor = ancestor_with(worker_pid, "CoarseGrainedExecutorBackend")
        if executor is None:
            raise RuntimeError(f"no executor JVM above Python worker {worker_pid}")
        os.kill(executor, signal.SIGKILL)
        trial.notes["killed_executor_pid"] = executor
        if wipe_wal:
            shutil.rmtree(d / "wal")
            trial.notes["wal_deleted"] = True
        code = job.wait(300)
        if code != 0:
            raise RuntimeError((d / "job.log").read_text()[-2000:])
        summary = last_summary(d / "summary.jsonl")
        trial.notes.update(retried_partitions=summary["retried_partitions"], skipped=summary["skipped"])
        trial.passed = summary["retried_partitions"] > 0
    except Exception as exc:  # noqa: BLE001
        trial.errors.append(str(exc)[-600:])
        trial.passed = False
        kill_group(job)
        return trial
    return check(lab, trial, lab.kafka.bootstrap_servers, topic, [f"{prefix}-{i}" for i in range(n)])


# ---- 14. A sink stage reading a shuffle, executor JVM SIGKILLed ------------------------------------------

def shuffle_executor_kill(lab: Lab, rng: random.Random, n: int) -> Trial:
    """On local-cluster[2,1,1024] the sink reads the output of repartition(8, id % 97), whose rows a retried
    task reads in another order; an executor JVM is SIGKILLed at a random moment of the write. Repeats are
    limited to records acknowledged after the last checkpoint (reported); none lost."""
    d, topic = lab.dir("shuffle-executor-kill"), lab.topic(4)
    prefix = f"sh{rng.randrange(1 << 30):x}"
    rows = 3 * n
    job = python_subprocess(
        ["-m", "testing.chaos.jobs", "--master", "local-cluster[2,1,1024]", "--rows", str(rows), "--prefix", prefix,
         "--shuffle", "8", "--bootstrap", lab.kafka.bootstrap_servers, "--topic", topic, "--wal", str(d / "wal"),
         "--summary", str(d / "summary.jsonl"), *lab.job_args()], d / "job.log")
    target = rng.uniform(0.1, 0.6) * rows
    trial = Trial(notes={"at_records": int(target)})
    try:
        wait_until(lambda: landed(lab.kafka.bootstrap_servers, topic) >= target or job.poll() is not None,
                   300, "the write to reach the kill point", every_s=0.01)
        # The executors whose Python workers write this trial's partitions; between two tasks none may hold
        # the WAL open, so wait for one (or for the job's end).
        executors: set[int] = set()

        def writing_executors() -> bool:
            executors.update(e for e in (ancestor_with(w, "CoarseGrainedExecutorBackend")
                                         for w in python_workers(d / "wal")) if e)
            return bool(executors) or job.poll() is not None

        wait_until(writing_executors, 60, "an executor writing this trial's partitions", every_s=0.01)
        if job.poll() is None:
            victim = rng.choice(sorted(executors))
            os.kill(victim, signal.SIGKILL)
            trial.notes["killed_executor_pid"] = victim
        if job.wait(400) != 0:
            raise RuntimeError((d / "job.log").read_text()[-2000:])
        summary = last_summary(d / "summary.jsonl")
        trial.notes.update(retried_partitions=summary["retried_partitions"], skipped=summary["skipped"])
    except Exception as exc:  # noqa: BLE001
        trial.errors.append(str(exc)[-600:])
        trial.passed = False
        kill_group(job)
        return trial
    check(lab, trial, lab.kafka.bootstrap_servers, topic, [f"{prefix}-{i}" for i in range(rows)])
    if "killed_executor_pid" not in trial.notes:
        trial.notes["outcome"] = "the write finished before the kill"
    trial.passed = trial.lost == 0 and not trial.errors
    return trial


# ---- 15. Executor JVM SIGKILL and its WAL directory lost -------------------------------------------------

def executor_kill_wal_lost(lab: Lab, rng: random.Random, n: int) -> Trial:
    trial = executor_jvm_kill(lab, rng, n, wipe_wal=True)
    if not lab.exactly_once:  # the retry reads the killed attempt's proof in the proof topic: the kill bound holds
        trial.passed = (trial.lost == 0 and not trial.errors and trial.notes.get("retried_partitions", 0) > 0
                        and trial.duplicated <= 2 * CHECKPOINT_MAX_RECORDS)
    return trial


# ---- 16. Speculative execution ---------------------------------------------------------------------------

def speculation(lab: Lab, rng: random.Random, n: int) -> Trial:
    """``spark.speculation=true`` on a standalone cluster of two hosts to Spark (workers advertised as
    127.0.0.1 and localhost, each with its own WAL directory): one task stalls mid-write after a random number
    of records, Spark starts a copy on the other host, the copy finishes first; the stalled attempt is then
    killed by Spark or wakes up as a zombie. Under exactly_once the copy's init_transactions fences the stalled
    attempt and aborts its open transaction: nothing lost, nothing repeated. Under at_least_once nothing is
    lost; the copy skips what the stalled attempt had proven in the proof topic when the copy started, and what
    both send after that is repeated."""
    d, topic = lab.dir("speculation"), lab.topic(4)
    prefix = f"sp{rng.randrange(1 << 30):x}"
    k = rng.randint(max(1, n // 40), n // 4 - n // 40)
    marker = d / "stalled"
    hosts = {"127.0.0.1": {"RECOVERABLE_KAFKA_WAL_PATH": str(d / "wal-host-a")},
             "localhost": {"RECOVERABLE_KAFKA_WAL_PATH": str(d / "wal-host-b")}}
    trial = Trial(notes={"stall_after": k})
    conf = {"spark.speculation": "true", "spark.speculation.interval": "200ms", "spark.speculation.quantile": "0.5",
            "spark.speculation.multiplier": "2", "spark.speculation.minTaskRuntime": "2s",
            "spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1", "spark.cores.max": "2",
            "spark.executor.cores": "1"}
    with StandaloneCluster(d / "cluster", hosts) as cluster:
        job = python_subprocess(
            ["-m", "testing.chaos.jobs", "--master", cluster.master_url, "--rows", str(n), "--prefix", prefix,
             "--bootstrap", lab.kafka.bootstrap_servers, "--topic", topic, "--summary", str(d / "summary.jsonl"),
             "--option", f"_test.pauseAfterRecords={k}", "--option", f"_test.pauseFile={marker}",
             "--option", "_test.pauseSeconds=90", *lab.job_args(),
             *[arg for item in conf.items() for arg in ("--conf", "=".join(item))]],
            d / "job.log", SPARK_LOCAL_IP="127.0.0.1")
        try:
            code = job.wait(400)
        except subprocess.TimeoutExpired:
            kill_group(job)
            code = -1
    if code != 0:
        trial.errors.append((d / "job.log").read_text(errors="replace")[-1500:])
        trial.passed = False
        return trial
    stalled = int(marker.read_text().split()[1]) if marker.exists() else None
    tasks = {t["partition"]: t for t in last_summary(d / "summary.jsonl")["tasks"]}
    winner = tasks.get(stalled) if stalled is not None else None
    trial.notes.update(stalled_partition=stalled, committed_by_attempt=winner and winner["attempt"],
                       committed_wal=winner and winner["wal_path"])
    if winner is None or winner["attempt"] == 0:
        trial.errors.append("no speculative copy committed the stalled partition")
        trial.passed = False
    check(lab, trial, lab.kafka.bootstrap_servers, topic, [f"{prefix}-{i}" for i in range(n)])
    if not lab.exactly_once:
        trial.passed = trial.lost == 0 and not trial.errors  # two live attempts both send (README, Guarantees)
    return trial
