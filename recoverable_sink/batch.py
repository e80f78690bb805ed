"""The batch writer: ``df.write.format("recoverable_kafka")``. ``write`` runs in every task (executor);
``commit``/``abort`` run on the driver."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage

from recoverable_sink.options import SinkOptions
from recoverable_sink.records import SchemaPlan
from recoverable_sink.summary import log_abort, log_commit, summarize, write_summary
from recoverable_sink.task import TaskIdentity, write_partition


class RecoverableKafkaBatchWriter(DataSourceArrowWriter):
    """Writes each partition through the WAL. The write id is made here, once, on the driver: it is
    pickled into every task and every retry, so a retry finds the log of the attempt it replaces.

    ``wal.writeId`` sets it instead, for writes that are re-run as a whole and must find the earlier run's
    log: in ``foreachBatch``, ``f"{query_id}-{batch_id}"`` makes a re-run micro-batch skip what the earlier
    run delivered."""

    def __init__(self, options: SinkOptions, plan: SchemaPlan) -> None:
        self.options = options
        self.plan = plan
        self.write_id = options.write_id or uuid.uuid4().hex

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        ctx = TaskContext.get()
        assert ctx is not None, "write() runs inside a Spark task"
        ident = TaskIdentity(
            write_id=self.write_id,
            partition=ctx.partitionId(),
            attempt=ctx.attemptNumber(),
            extra={"kind": "batch", "stage": ctx.stageId(), "task_attempt_id": ctx.taskAttemptId()},
        )
        return write_partition(iterator, self.options, self.plan, ident)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        summary = summarize(messages)
        log_commit(f"write {self.write_id}", summary)
        write_summary(self.options.summary_path, "commit", self.write_id, summary)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        summary = summarize(messages)
        log_abort(f"write {self.write_id}", summary, self.options.wal_path or "the default wal.path", self.write_id)
        write_summary(self.options.summary_path, "abort", self.write_id, summary)
