"""A healthy stream stopped with query.stop() in the middle of a micro-batch, as a user's program stops it, with
Spark's own log settings: the sink logs no ERROR, no WARNING and no stack trace, its abort does not fail (Spark said
the micro-batch "failed to abort" when an exactly_once stream was stopped in its first one), its lines carry the real
ids, each committed micro-batch says one INFO line, and Spark itself says no more than it does stopping the same
stream into format("kafka")."""

from __future__ import annotations

import re
import subprocess
import sys
from functools import cache

import pytest

from testing.kafka_local import REPO
from testing.spark import python_env

STACK_FRAME = re.compile(r"^\s+at [\w$.]+\(", re.M)


def _stop(fmt: str, bootstrap: str, topic: str, checkpoint, batches: int, *options: str) -> str:
    run = subprocess.run([sys.executable, "-m", "testing.stop_job", "--format", fmt, "--bootstrap", bootstrap,
                          "--topic", topic, "--checkpoint", str(checkpoint), "--batches", str(batches),
                          *[a for o in options for a in ("--option", o)]],
                         cwd=REPO, env={k: v for k, v in python_env().items() if k != "RECOVERABLE_KAFKA_LOG_LEVEL"},
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0 and "stopped after" in run.stdout, run.stdout[-2000:] + run.stderr[-4000:]
    return run.stderr


def _noise(stderr: str) -> dict[str, int]:
    return {"ERROR lines": len(re.findall(r"^.*\bERROR\b.*$", stderr, re.M)),
            "stack frames": len(STACK_FRAME.findall(stderr)),
            "Python tracebacks": stderr.count("Traceback (most recent call last)")}


@cache
def _kafka_noise(bootstrap: str, topic: str, checkpoint: str, batches: int) -> dict[str, int]:
    return _noise(_stop("kafka", bootstrap, topic, checkpoint, batches))


@pytest.mark.parametrize(("mode", "batches"), [("at_least_once", 2), ("exactly_once", 0)])
def test_a_healthy_stream_stopped_mid_micro_batch_logs_no_sink_error_and_no_more_than_spark_s_kafka_sink(
        kafka, new_topic, tmp_path, mode, batches):
    topic = new_topic(2)
    stderr = _stop("recoverable_kafka", kafka.bootstrap_servers, topic, tmp_path / "checkpoint", batches,
                   f"delivery.guarantee={mode}", f"wal.path={tmp_path / 'wal'}")
    sink = [line for line in stderr.splitlines() if "recoverable_sink" in line]
    assert not [line for line in sink if re.search(r"\b(ERROR|WARNING|CRITICAL)\b", line)], "\n".join(sink)
    assert "failed to abort" not in stderr and "this query's id" not in stderr and "query.id" not in stderr
    committed = [line for line in sink if re.search(r"INFO recoverable_sink\.summary: micro-batch \d+ of query "
                                                    r"[0-9a-f-]{36} committed", line)]
    assert len(committed) >= batches, "\n".join(sink)
    ours = _noise(stderr)
    theirs = _kafka_noise(kafka.bootstrap_servers, new_topic(2), str(tmp_path / "kafka-checkpoint"), batches)
    print(f"{mode}: the sink's stop {ours}, format('kafka')'s {theirs}")
    assert ours["Python tracebacks"] == 0, stderr[-6000:]
    assert all(ours[k] <= theirs[k] for k in ours), (ours, theirs, stderr[-6000:])
