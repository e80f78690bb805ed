"""Fault family: runs that meet an earlier or a later run of the same write. A streaming query whose failed
micro-batch is re-run, after a restart from its checkpoint, on another number of partitions (22), and a zombie
driver frozen as a micro-batch starts and resumed after a second driver committed that batch and the next (23).

A read_committed reader must see every record once; under at_least_once the zombie's task, when it was frozen
mid-send, goes on sending what it had (its documented limit: repeats, never loss).
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
from pathlib import Path

from testing.chaos.checker import ids_in_topic, verdict
from testing.chaos.lab import Lab, Trial, kill_group, python_subprocess
from testing.chaos.scenarios.upstream import file_stream_args
from testing.waiting import wait_until


def _finish(lab: Lab, trial: Trial, topic: str, total: int) -> Trial:
    found = ids_in_topic(lab.kafka.bootstrap_servers, topic, expected=total)
    trial.lost, trial.duplicated, unexpected = verdict([str(i) for i in range(total)], found)
    trial.records_expected = total
    trial.passed = trial.passed and trial.lost == 0 and not unexpected
    return trial


# ---- 22. A failed micro-batch re-run on another partitioning ---------------------------------------------

def stream_rerun_repartitioned(lab: Lab, rng: random.Random, n: int) -> Trial:
    """A query whose micro-batches are repartitioned fails in every attempt of one task at a random id; restarted
    from its checkpoint with another partition count (3 <-> 4), Spark re-runs the failed micro-batch split
    otherwise. Partitions of the failed run that committed must not be sent again, nor any record lost."""
    d, topic = lab.dir("stream-repartition"), lab.topic(4)
    files, per_file = 6, max(40, n // 6)
    total = files * per_file
    before, after = rng.choice([(4, 3), (3, 4)])
    fail_at = rng.randrange(total)
    trial = Trial(notes={"fail_at_id": fail_at, "partitions": f"{before} -> {after}"})
    args = file_stream_args(lab, d, topic, files, per_file)
    first = python_subprocess([*args, "--repartition", str(before), "--fail-at-id", str(fail_at)], d / "first.log")
    if first.wait(600) == 0:
        trial.errors.append("the query succeeded although a micro-batch failed in every attempt")
        trial.passed = False
    trial.notes["left_by_failed_run"] = sum(ids_in_topic(lab.kafka.bootstrap_servers, topic, timeout_s=30).values())
    second = python_subprocess([*args, "--repartition", str(after)], d / "second.log")
    if second.wait(600) != 0:
        trial.errors.append((d / "second.log").read_text()[-600:])
        trial.passed = False
        return trial
    return _finish(lab, trial, topic, total)


# ---- 23. A zombie driver ---------------------------------------------------------------------------------

def _commits(summary: Path) -> list[int]:
    if not summary.exists():
        return []
    return [json.loads(line)["batch_id"] for line in summary.read_text().splitlines()
            if line.strip() and json.loads(line)["event"] == "commit"]


def zombie_driver(lab: Lab, rng: random.Random, n: int) -> Trial:
    """A streaming driver frozen (SIGSTOP, with its JVM and Python workers) at a random moment just as a
    micro-batch starts; a second driver runs the query from the same checkpoint to its end; the frozen one is
    resumed (SIGCONT): whatever its tasks still do, a read_committed reader sees every record once."""
    d, topic = lab.dir("stream-zombie"), lab.topic(2)
    files, per_file = 6, max(40, n // 6)
    total = files * per_file
    args = file_stream_args(lab, d, topic, files, per_file)
    after_batch = rng.randrange(0, 3)
    delay = rng.uniform(0.0, 0.4)
    trial = Trial(notes={"frozen_after_commit_of_batch": after_batch, "delay_s": round(delay, 3)})
    zombie = python_subprocess(args, d / "zombie.log")
    try:
        wait_until(lambda: after_batch in _commits(d / "summary.jsonl") or zombie.poll() is not None, 300,
                   f"micro-batch {after_batch} to be committed", every_s=0.005)
        time.sleep(delay)  # a random moment of the next micro-batch's start
        os.killpg(zombie.pid, signal.SIGSTOP)
        second = python_subprocess(args, d / "second.log")
        if second.wait(600) != 0:
            raise RuntimeError((d / "second.log").read_text()[-2000:])
        os.killpg(zombie.pid, signal.SIGCONT)
        try:  # it fails (its commit log is taken) or finds nothing left to do; either way it must end
            zombie.wait(300)
        except Exception:  # noqa: BLE001 - ended below
            trial.notes["zombie"] = "still running after 300 s: killed"
        trial.notes.setdefault("zombie", f"exit {zombie.returncode}")
    except Exception as exc:  # noqa: BLE001
        trial.errors.append(str(exc)[-600:])
        trial.passed = False
        return trial
    finally:
        kill_group(zombie)
    return _finish(lab, trial, topic, total)
