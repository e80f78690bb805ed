"""Fault family: failures upstream of the sink's Python writer, on the JVM side of its stage or in a Python UDF,
which end the writer's input early at an Arrow batch boundary: one task failing in every attempt, then a re-run
under the same wal.writeId (17); every task's first attempt failing (18); a stream's micro-batch failing in
every attempt, then restarted with a transient failure (19). Batch scenarios run in the lab's SparkSession,
streams in a driver of their own.

A read_committed reader must see nothing of the failed task or micro-batch under exactly_once, no record from
past the failing row in either mode, and every record exactly once after the re-run, retries or restart.
"""

from __future__ import annotations

import random
import uuid
from pathlib import Path
from typing import Any

from testing.chaos.checker import ids_in_topic, verdict
from testing.chaos.lab import Lab, Trial, python_subprocess


def _records(lab: Lab, n: int, partitions: int, prefix: str, fail_at: int | None = None,
             flaky_at: set[int] | None = None) -> tuple[Any, list[str]]:
    """``n`` records keyed by a unique id; ``fail_at``: the JVM fails every attempt of the task holding that row;
    ``flaky_at``: a Python UDF upstream fails the first attempt of each task holding one of those rows."""
    from pyspark import TaskContext
    from pyspark.sql import functions as F

    df = lab.spark.range(n, numPartitions=partitions)
    value = F.concat(F.lit("payload-"), F.col("id").cast("string"))
    if fail_at is not None:
        value = F.when(F.col("id") == fail_at, F.raise_error(F.lit(f"upstream failure at row {fail_at}"))) \
            .otherwise(value)
    if flaky_at:
        rows = frozenset(flaky_at)

        def flaky(row: int, payload: str) -> str:
            ctx = TaskContext.get()
            if row in rows and ctx is not None and ctx.attemptNumber() == 0:
                raise RuntimeError(f"transient upstream failure at row {row}")
            return payload

        value = F.udf(flaky, "string")(F.col("id"), value)
    df = df.select(F.concat(F.lit(f"{prefix}-"), F.col("id").cast("string")).alias("key"), value.alias("value"))
    return df, [f"{prefix}-{i}" for i in range(n)]


def upstream_failure(lab: Lab, rng: random.Random, n: int) -> Trial:
    """Every attempt of one task fails on the JVM side at a random row; the write fails. A read_committed reader
    must see none of that partition under exactly_once (at least once: no row twice, none from past the
    failure); the fault removed, a re-run under the same wal.writeId delivers every record once."""
    d, topic, partitions = lab.dir("upstream-failure"), lab.topic(4), 4
    rows = 3 * n
    fail_at = rng.randrange(rows)
    per = rows // partitions
    failing = range((fail_at // per) * per, min(rows, (fail_at // per + 1) * per))  # spark.range's split
    write_id = f"upstream-{uuid.uuid4().hex[:8]}"
    trial = Trial(notes={"fail_at_row": fail_at})
    prefix = uuid.uuid4().hex[:6]
    df, ids = _records(lab, rows, partitions, prefix, fail_at=fail_at)
    try:
        lab.write(df, lab.kafka.bootstrap_servers, topic, d / "wal", d / "summary.jsonl",
                  **{"wal.writeId": write_id})
        trial.errors.append("the write succeeded although one of its tasks failed in every attempt")
        trial.passed = False
    except Exception:  # noqa: BLE001 - the expected failure
        pass
    seen = ids_in_topic(lab.kafka.bootstrap_servers, topic, timeout_s=30)
    of_failed = {ids[i] for i in failing}
    visible = sum(c for k, c in seen.items() if k in of_failed)
    trial.notes["visible_of_failed_partition"] = visible
    if lab.exactly_once and visible:
        trial.errors.append(f"{visible} records of the failed partition visible to read_committed")
        trial.passed = False
    past = sum(c for k, c in seen.items() if k in of_failed and int(k.rsplit("-", 1)[1]) >= fail_at)
    trial.notes["twice_before_rerun"] = sum(c - 1 for c in seen.values() if c > 1)
    if past:
        trial.errors.append(f"{past} records from past the failing row were sent")
        trial.passed = False
    clean, _ = _records(lab, rows, partitions, prefix)
    lab.write(clean, lab.kafka.bootstrap_servers, topic, d / "wal", d / "summary.jsonl", **{"wal.writeId": write_id})
    found = ids_in_topic(lab.kafka.bootstrap_servers, topic, expected=rows)
    trial.lost, trial.duplicated, unexpected = verdict(ids, found)
    trial.records_expected = rows
    trial.passed = trial.passed and trial.lost == 0 and trial.duplicated == 0 and not unexpected
    return trial


def transient_upstream_failure(lab: Lab, rng: random.Random, n: int) -> Trial:
    """The first attempt of every task fails upstream (a Python UDF in its own worker) at a random row of its
    partition; Spark's retries succeed. Every record once."""
    topic, partitions, rows = lab.topic(4), 4, 3 * n
    d = lab.dir("transient-upstream")
    per = rows // partitions
    at = {p * per + rng.randrange(per) for p in range(partitions)}
    df, ids = _records(lab, rows, partitions, uuid.uuid4().hex[:6], flaky_at=at)
    summary = lab.write(df, lab.kafka.bootstrap_servers, topic, d / "wal", d / "summary.jsonl")
    trial = Trial(notes={"fail_at_rows": sorted(at), "retried_partitions": summary["retried_partitions"]})
    found = ids_in_topic(lab.kafka.bootstrap_servers, topic, expected=rows)
    trial.lost, trial.duplicated, unexpected = verdict(ids, found)
    trial.records_expected = rows
    trial.passed = trial.lost == 0 and trial.duplicated == 0 and not unexpected \
        and summary["retried_partitions"] == partitions
    return trial


def file_stream_args(lab: Lab, d: Path, topic: str, files: int, per_file: int, *extra: str) -> list[str]:
    """Write ``files`` JSON input files (once) and return the arguments of a testing.stream_job reading one of
    them per micro-batch; ids 0..files*per_file-1."""
    source = d / "in"
    source.mkdir(exist_ok=True)
    for f in range(files):
        path = source / f"part-{f:04d}.json"
        if not path.exists():
            path.write_text("".join(f'{{"id": {i}, "payload": "p{i}"}}\n'
                                    for i in range(f * per_file, (f + 1) * per_file)))
    return ["-m", "testing.stream_job", "--source", "files", "--input", str(source), "--max-per-trigger", "1",
            "--bootstrap", lab.kafka.bootstrap_servers, "--topic", topic, "--checkpoint", str(d / "checkpoint"),
            "--wal", str(d / "wal"), "--summary", str(d / "summary.jsonl"), *lab.job_args(), *extra]


def stream_upstream_failures(lab: Lab, rng: random.Random, n: int) -> Trial:
    """A streaming query whose micro-batch fails upstream in every attempt at a random id: the query stops; under
    exactly_once nothing of that micro-batch is visible. Restarted from its checkpoint without the fault but with
    a transient failure (first attempt only) at another random id, it delivers every record once."""
    d, topic = lab.dir("stream-upstream"), lab.topic(2)
    files, per_file = 8, max(10, n // 8)
    total = files * per_file
    fail_at, flaky_at = rng.randrange(total), rng.randrange(total)
    trial = Trial(notes={"fail_at_id": fail_at, "flaky_at_id": flaky_at})
    args = file_stream_args(lab, d, topic, files, per_file)
    first = python_subprocess([*args, "--fail-at-id", str(fail_at)], d / "first.log")
    if first.wait(600) == 0:
        trial.errors.append("the query succeeded although a micro-batch failed in every attempt")
        trial.passed = False
    seen = ids_in_topic(lab.kafka.bootstrap_servers, topic, timeout_s=30)
    failed_file = range((fail_at // per_file) * per_file, (fail_at // per_file + 1) * per_file)
    visible = sum(seen[str(i)] for i in failed_file)
    trial.notes["visible_of_failed_batch"] = visible
    if lab.exactly_once and visible:
        trial.errors.append(f"{visible} records of the failed micro-batch visible to read_committed")
        trial.passed = False
    second = python_subprocess([*args, "--flaky-at-id", str(flaky_at)], d / "second.log")
    if second.wait(600) != 0:
        trial.errors.append((d / "second.log").read_text()[-600:])
        trial.passed = False
        return trial
    found = ids_in_topic(lab.kafka.bootstrap_servers, topic, expected=total)
    trial.lost, trial.duplicated, unexpected = verdict([str(i) for i in range(total)], found)
    trial.records_expected = total
    trial.passed = trial.passed and trial.lost == 0 and trial.duplicated == 0 and not unexpected
    return trial
