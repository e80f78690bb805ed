"""Fault family: the streaming driver (its JVM and Python workers with it) SIGKILLed and restarted from the
same checkpoint: mid-micro-batch once a task's first k records are acknowledged (6), at random moments, one
of them right after a micro-batch's commit() (12), or restarted writing to another topic (13).

A read_committed reader must see every record exactly once, in both modes (for 13: a batch committed before
the kill in the first topic, every later batch in the second).
"""

from __future__ import annotations

import json
import os
import random
import time
from pathlib import Path
from typing import Any

from testing.chaos.checker import check, ids_in_topic
from testing.chaos.lab import Lab, Trial, kill_group, landed, python_subprocess
from testing.waiting import wait_until

# ---- 6. Streaming driver SIGKILL and restart from checkpoint ---------------------------------------------

def stream_driver_kill(lab: Lab, rng: random.Random, n: int) -> Trial:
    """The streaming driver (JVM and Python workers with it) SIGKILLed mid-micro-batch once a task's first k
    records are acknowledged, then restarted from the same checkpoint."""
    d, topic = lab.dir("stream-kill"), lab.topic(2)
    files, per_file = 3, max(1, n // 3)
    source = d / "in"
    source.mkdir()
    for f in range(files):
        rows = (json.dumps({"id": i, "payload": "p"}) for i in range(f * per_file, (f + 1) * per_file))
        (source / f"part-{f}.json").write_text("\n".join(rows) + "\n")
    k = rng.randint(max(1, per_file // 20), per_file - per_file // 20)
    marker = d / "paused"
    args = ["-m", "testing.stream_job", "--source", "files", "--input", str(source), "--max-per-trigger", "1",
            "--bootstrap", lab.kafka.bootstrap_servers, "--topic", topic, "--checkpoint", str(d / "checkpoint"),
            "--wal", str(d / "wal"), "--summary", str(d / "summary.jsonl"),
            "--option", f"_test.pauseAfterRecords={k}", "--option", f"_test.pauseFile={marker}", *lab.job_args()]
    trial = Trial(notes={"kill_after": k})
    first = python_subprocess(args, d / "first.log")
    try:
        wait_until(lambda: marker.exists() or first.poll() is not None, 240, "the query to reach the kill point")
        if first.poll() is not None:
            raise RuntimeError((d / "first.log").read_text()[-2000:])
        kill_group(first)
        second = python_subprocess(args, d / "restart.log")
        if second.wait(300) != 0:
            raise RuntimeError((d / "restart.log").read_text()[-2000:])
    except Exception as exc:  # noqa: BLE001
        trial.errors.append(str(exc)[-600:])
        trial.passed = False
        kill_group(first)
        return trial
    return check(lab, trial, lab.kafka.bootstrap_servers, topic, [str(i) for i in range(files * per_file)])


# ---- 12. Streaming driver SIGKILL at random moments ------------------------------------------------------

def _stream_files(d: Path, files: int, per_file: int) -> Path:
    """JSON input files with increasing modification times, so micro-batch i (maxFilesPerTrigger=1) reads
    file i; ids 0..files*per_file-1 (each trial writes to a fresh topic)."""
    source = d / "in"
    source.mkdir()
    base = time.time() - 3600
    for f in range(files):
        rows = (json.dumps({"id": i, "payload": "p" * 40})
                for i in range(f * per_file, (f + 1) * per_file))
        path = source / f"part-{f:03d}.json"
        path.write_text("\n".join(rows) + "\n")
        os.utime(path, (base + f, base + f))
    return source


def _stream_args(lab: Lab, source: Path, d: Path, bootstrap: str, topic: str) -> list[str]:
    return ["-m", "testing.stream_job", "--source", "files", "--input", str(source), "--max-per-trigger", "1",
            "--bootstrap", bootstrap, "--topic", topic, "--checkpoint", str(d / "checkpoint"),
            "--wal", str(d / "wal"), "--summary", str(d / "summary.jsonl"), *lab.job_args()]


def _commits(summary: Path) -> list[int]:
    if not summary.exists():
        return []
    return [json.loads(line)["batch_id"] for line in summary.read_text().splitlines()
            if line.strip() and json.loads(line)["event"] == "commit"]


def _kill_stream_at_random(lab: Lab, rng: random.Random, d: Path, args: list[str], topic: str, total: int,
                           kills: int, notes: dict[str, Any]) -> None:
    """Run the streaming driver, SIGKILL it ``kills`` times at random moments (one of them right after a
    micro-batch's commit() returned, before Spark may have written its commit log), restart it each time from
    the same checkpoint, and let the last run finish."""
    moments = []
    for k in range(kills):
        job = python_subprocess(args, d / f"run{k}.log")
        try:
            if k == 0:
                goal = len(_commits(d / "summary.jsonl")) + rng.randint(1, 3)
                wait_until(lambda j=job, g=goal: len(_commits(d / "summary.jsonl")) >= g or j.poll() is not None,
                           300, "a micro-batch to be committed", every_s=0.005)
                moments.append(f"right after batch {goal - 1}'s commit(), maybe before its commit log")
            else:
                target = rng.uniform(0.2, 0.9) * total
                wait_until(lambda j=job, t=target: landed(lab.kafka.bootstrap_servers, topic) >= t
                           or j.poll() is not None, 300, "the query to reach the kill point", every_s=0.01)
                moments.append(f"at {int(target)} records in the topic")
        finally:
            kill_group(job)
    notes["kills"] = moments
    last = python_subprocess(args, d / "final.log")
    if last.wait(600) != 0:
        raise RuntimeError((d / "final.log").read_text()[-2000:])


def stream_driver_kill_random(lab: Lab, rng: random.Random, n: int) -> Trial:
    """The streaming driver SIGKILLed (with its JVM and Python workers) at random moments, one of them right
    after a micro-batch's tasks returned and its commit() ran, then restarted from the same checkpoint."""
    d, topic = lab.dir("stream-random"), lab.topic(2)
    files = 8
    per_file = max(1, n // files)
    source = _stream_files(d, files, per_file)
    trial = Trial(notes={})
    try:
        _kill_stream_at_random(lab, rng, d, _stream_args(lab, source, d, lab.kafka.bootstrap_servers, topic), topic,
                               files * per_file, 2, trial.notes)
    except Exception as exc:  # noqa: BLE001
        trial.errors.append(str(exc)[-600:])
        trial.passed = False
        return trial
    return check(lab, trial, lab.kafka.bootstrap_servers, topic, [str(i) for i in range(files * per_file)])


# ---- 13. A restarted query that writes to another topic --------------------------------------------------

def stream_restart_to_another_topic(lab: Lab, rng: random.Random, n: int) -> Trial:
    """A streaming query to topic A is SIGKILLed at a random moment and restarted from the same checkpoint
    writing to topic B (Spark allows it): every record of a batch committed before the kill is in A, every
    record of the batches run after the restart is in B (none skipped because A had it), none twice in a
    topic."""
    d, topic_a, topic_b = lab.dir("stream-retopic"), lab.topic(2), lab.topic(2)
    files = 6
    per_file = max(1, n // files)
    source = _stream_files(d, files, per_file)
    bs = lab.kafka.bootstrap_servers
    trial = Trial(notes={})
    try:
        first = python_subprocess(_stream_args(lab, source, d, bs, topic_a), d / "run-a.log")
        target = rng.uniform(0.15, 0.75) * files * per_file
        try:
            wait_until(lambda: landed(bs, topic_a) >= target or first.poll() is not None, 300,
                       "the query to reach the kill point", every_s=0.01)
        finally:
            kill_group(first)
        committed_before = set(_commits(d / "summary.jsonl"))
        second = python_subprocess(_stream_args(lab, source, d, bs, topic_b), d / "run-b.log")
        if second.wait(600) != 0:
            raise RuntimeError((d / "run-b.log").read_text()[-2000:])
    except Exception as exc:  # noqa: BLE001
        trial.errors.append(str(exc)[-600:])
        trial.passed = False
        return trial
    # The checkpoint's commit log may be one batch ahead of the summary lines (a kill between the two):
    # a batch is "in A" if its commit() ran before the kill, else B must have all of it.
    in_a, in_b = ids_in_topic(bs, topic_a), ids_in_topic(bs, topic_b)
    after = sorted(set(_commits(d / "summary.jsonl")) - committed_before)
    ids_of = {f: [str(i) for i in range(f * per_file, (f + 1) * per_file)] for f in range(files)}
    trial.records_expected = files * per_file
    trial.lost = sum(1 for f in range(files) for i in ids_of[f]
                     if (in_a[i] == 0 if f in committed_before else in_b[i] == 0))
    trial.duplicated = sum(c - 1 for c in in_a.values() if c > 1) + sum(c - 1 for c in in_b.values() if c > 1)
    trial.notes.update(at_records=int(target), batches_committed_to_a=sorted(committed_before),
                       batches_run_towards_b=after, in_a=len(in_a), in_b=len(in_b))
    trial.passed = trial.lost == 0 and trial.duplicated == 0 and set(range(files)) == committed_before | set(after)
    return trial
