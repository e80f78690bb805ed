"""The streaming writer: ``writeStream.format("recoverable_kafka")``. ``write`` runs in every task
(executor); ``commit``/``abort`` run on the driver, on a fresh writer object for every micro-batch.

A task's WAL identity is (query id, batch id, partition, attempt). The query id is stable across restarts
from the same checkpoint and Spark re-runs an uncommitted batch under the same batch id, so a re-run after
a driver crash finds the earlier run's log on that host and skips what Kafka already acknowledged.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import DataSourceStreamArrowWriter, WriterCommitMessage

from recoverable_sink._logging import get_logger
from recoverable_sink.options import SinkOptions
from recoverable_sink.records import SchemaPlan
from recoverable_sink.summary import log_abort, log_commit, summarize, write_summary
from recoverable_sink.task import TaskIdentity, write_partition
from recoverable_sink.wal import Wal, open_wal

log = get_logger("stream")

_last_sweep: dict[str, float] = {}
_SWEEP_EVERY_S = 600.0


def stream_write_id(query_id: str, batch_id: int) -> str:
    return f"{query_id}-b{batch_id:012d}"


def sweep(wal: Wal, query_id: str, batch_id: int, retention_s: float) -> None:
    """WAL hygiene for long-running queries, run by tasks on each host.

    Batch ``batch_id`` only starts once every earlier batch of the query is committed, so logs of earlier
    batches of this query left by failed attempts (their retry ran elsewhere) are no longer needed. Logs of
    any streaming query older than ``wal.retentionHours`` are removed as abandoned, at most every 10 minutes.
    """
    stale = [a.key for a in wal.attempts(f"{query_id}-b") if int(a.extra["batch_id"]) < batch_id]
    if stale:
        freed = wal.purge(stale)
        log.info("WAL %s: purged %d attempt log(s) of committed batches of query %s (%d bytes)",
                 wal.path, len(stale), query_id, freed)
    now = time.time()
    if now - _last_sweep.get(wal.path, 0.0) < _SWEEP_EVERY_S:
        return
    _last_sweep[wal.path] = now
    old = [a for a in wal.attempts() if a.extra.get("kind") == "stream" and now - a.created > retention_s]
    if old:
        freed = wal.purge([a.key for a in old])
        log.warning("WAL %s: removed %d streaming attempt log(s) older than wal.retentionHours=%g (%d bytes): %s",
                    wal.path, len(old), retention_s / 3600, freed, sorted({a.write_id for a in old}))


class RecoverableKafkaStreamWriter(DataSourceStreamArrowWriter):
    """Writes each micro-batch's partitions through the WAL, exactly once across task retries and driver
    restarts from the same checkpoint (deterministic input, same host)."""

    def __init__(self, options: SinkOptions, plan: SchemaPlan) -> None:
        self.options = options
        self.plan = plan

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        ctx = TaskContext.get()
        assert ctx is not None, "write() runs inside a Spark task"
        query_id = ctx.getLocalProperty("sql.streaming.queryId") or "unknown-query"
        batch_id = int(ctx.getLocalProperty("streaming.sql.batchId") or 0)
        if self.options.wal_enabled:
            sweep(open_wal(self.options.resolved_wal_path()), query_id, batch_id, self.options.retention_seconds)
        ident = TaskIdentity(
            write_id=stream_write_id(query_id, batch_id),
            partition=ctx.partitionId(),
            attempt=ctx.attemptNumber(),
            extra={"kind": "stream", "query_id": query_id, "batch_id": batch_id,
                   "task_attempt_id": ctx.taskAttemptId()},
        )
        return write_partition(iterator, self.options, self.plan, ident)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        summary = summarize(messages)
        log_commit(f"micro-batch {batchId}", summary)
        write_summary(self.options.summary_path, "commit", f"batch-{batchId}", {"batch_id": batchId, **summary})

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        summary = summarize(messages)
        log_abort(f"micro-batch {batchId}", summary, self.options.wal_path or "the default wal.path",
                  f"<query id>-b{batchId:012d}")
        write_summary(self.options.summary_path, "abort", f"batch-{batchId}", {"batch_id": batchId, **summary})
