"""A healthy stream stopped with query.stop() in the middle of a micro-batch, as a user's program stops it, with
Spark's own log settings: the sink logs no ERROR, no WARNING and no stack trace, its abort does not fail (Spark said
the micro-batch "failed to abort" when an exactly_once stream was stopped in its first one), its lines carry the real
ids, each committed micro-batch says one INFO line, and what Spark itself says is only what it says stopping the same
stream into format("kafka"): its task-abort lines, and the interrupt's own exceptions. (How many of those lines, 3 a
task, depends on how many tasks the interrupt found running, for either sink: counts are not compared.)"""

from __future__ import annotations

import re
import subprocess
import sys
from functools import cache

import pytest

from testing.kafka_local import REPO
from testing.spark import python_env

# Spark's lines as it stops a streaming write's tasks, whatever the sink.
SPARK_STOP_LINES = [re.compile(p) for p in (
    r"ERROR WriteToDataSourceV2Exec: Data source write support MicroBatchWrite\[epoch: \d+, writer: \S+\] is aborting",
    r"ERROR WriteToDataSourceV2Exec: Data source write support MicroBatchWrite\[epoch: \d+, writer: \S+\] aborted",
    r"ERROR Utils: Aborting task",
    r"ERROR DataWritingSparkTask: Abort(ing|ed) commit for partition \d+ \(task \d+, attempt \d+, stage [\d.]+\)",
    # A task's status arriving after spark.stop() terminated the scheduler's pool (seen with format("kafka")).
    r"ERROR TaskSchedulerImpl: Exception in statusUpdate",
)]
# What the stop's interrupt raises: in a JVM sink's task, in its sleep; in a Python sink's, in the socket to its worker.
INTERRUPTS = re.compile(r"^(Caused by: )?(java\.nio\.channels\.ClosedByInterruptException|"
                        r"java\.lang\.InterruptedException|java\.lang\.reflect\.InvocationTargetException|"
                        r"org\.apache\.spark\.TaskKilledException|"
                        r"java\.util\.concurrent\.RejectedExecutionException)\b")
TRACE_LINE = re.compile(r"^\s+(at \S+\(|\.\.\. \d+ more)")


def _stop(fmt: str, bootstrap: str, topic: str, checkpoint, batches: int, *options: str) -> str:
    run = subprocess.run([sys.executable, "-m", "testing.stop_job", "--format", fmt, "--bootstrap", bootstrap,
                          "--topic", topic, "--checkpoint", str(checkpoint), "--batches", str(batches),
                          *[a for o in options for a in ("--option", o)]],
                         cwd=REPO, env={k: v for k, v in python_env().items() if k != "RECOVERABLE_KAFKA_LOG_LEVEL"},
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0 and "stopped after" in run.stdout, run.stdout[-2000:] + run.stderr[-4000:]
    return run.stderr


def _noise(stderr: str) -> dict[str, list[str]]:
    """The ERROR lines that are not Spark's stop lines, the exceptions heading stack traces that are not the
    interrupt's, and Python tracebacks."""
    lines = stderr.splitlines()
    errors = [re.sub(r"^.*?(?=ERROR )", "", line) for line in lines if re.search(r"\bERROR\b", line)]
    heads = [lines[i - 1].strip() for i in range(1, len(lines))
             if TRACE_LINE.match(lines[i]) and not TRACE_LINE.match(lines[i - 1])]
    return {"other ERROR lines": [e for e in errors if not any(p.match(e) for p in SPARK_STOP_LINES)],
            "other exceptions": [h for h in heads if not INTERRUPTS.match(h)],
            "Python tracebacks": [line for line in lines if "Traceback (most recent call last)" in line]}


@cache
def _kafka_noise(bootstrap: str, topic: str, checkpoint: str, batches: int) -> dict[str, list[str]]:
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
    # Lines beyond that vocabulary that a stop into format("kafka") says too are Spark's, not the sink's.
    theirs = _kafka_noise(kafka.bootstrap_servers, new_topic(2), str(tmp_path / "kafka-checkpoint"), batches)
    beyond = {k: [line for line in v if line not in theirs[k]] for k, v in ours.items()}
    assert not any(beyond.values()), (ours, theirs, stderr[-6000:])
