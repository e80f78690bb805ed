"""The streaming writer: ``writeStream.format("recoverable_kafka")``. ``write`` runs in every task
(executor); ``commit``/``abort`` run on the driver, on a fresh writer object for every micro-batch.

A task's identity is (query id, batch id, partition). The query id is stable across restarts from the same
checkpoint and Spark re-runs an uncommitted batch under the same batch id, so a re-run after a driver crash
(even one between the tasks' end and the commit log) finds the earlier run's proof of delivery on that host
and sends nothing twice. That proof is released when a later micro-batch of the query runs on the host.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import WriterCommitMessage

from recoverable_sink.columns import SchemaPlan
from recoverable_sink.contract import SinkCommitMessage, TaskIdentity, new_run_id, stream_write_id
from recoverable_sink.driver import proof_place
from recoverable_sink.driver.summary import log_abort, log_commit, summarize, write_summary
from recoverable_sink.errors import RecoverableSinkError, sentence_first
from recoverable_sink.options import SinkOptions

try:
    from pyspark.sql.datasource import DataSourceStreamArrowWriter as _StreamArrowWriter
except ImportError:  # pyspark 4.0, which has no Arrow stream writer class
    from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamWriter

    # misc: the two bases' commit/abort differ (a batch's and a stream's), which pyspark 4.0's worker asks for
    # anyway; RecoverableKafkaStreamWriter defines the stream's.
    class _StreamArrowWriter(DataSourceStreamWriter, DataSourceArrowWriter):  # type: ignore[no-redef,misc]
        """pyspark 4.0's write worker hands Arrow batches to any writer that is a ``DataSourceArrowWriter``, a
        stream writer included (4.1 names that case ``DataSourceStreamArrowWriter``), so the sink reads the
        same input on 4.0 as on 4.1+, with no rows turned back into Arrow."""


class RecoverableKafkaStreamWriter(_StreamArrowWriter):
    """Writes each micro-batch's partitions through the WAL: across task retries and driver restarts from the
    same checkpoint, a record acknowledged once is not sent again on the same host."""

    def __init__(self, options: SinkOptions, plan: SchemaPlan, cluster_id: str) -> None:
        self.options = options
        self.plan = plan
        self.cluster_id = cluster_id
        # One run of this micro-batch (this driver-side writer, one SparkContext): its tasks' attempt ids are ordered.
        self.run_id = new_run_id()

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        with sentence_first():
            return self._write(iterator)

    def _write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        from recoverable_sink.executor.spark_input import how_input_ended  # executor-side code, imported where it runs
        from recoverable_sink.executor.task import write_partition

        ctx = TaskContext.get()
        assert ctx is not None, "write() runs inside a Spark task"
        query_id = ctx.getLocalProperty("sql.streaming.queryId")
        batch_id = ctx.getLocalProperty("streaming.sql.batchId")
        if not query_id or batch_id is None:
            raise RecoverableSinkError(
                "the streaming writer ran without Spark's query id or batch id (sql.streaming.queryId, "
                "streaming.sql.batchId), so it cannot tell a re-run batch from a new one; run it from a "
                "writeStream query, or use df.write with wal.writeId inside foreachBatch"
            )
        batch = int(batch_id)
        ident = TaskIdentity(write_id=stream_write_id(query_id, batch), partition=ctx.partitionId(),
                             attempt=ctx.attemptNumber(), kind="stream",
                             query_id=query_id, batch_id=batch, task_attempt_id=ctx.taskAttemptId(), run=self.run_id)
        message = write_partition(iterator, self.options, self.plan, ident, self.cluster_id, input_end=how_input_ended)
        message.query_id = query_id
        return message

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        proof_place.advance_stream(self.options, messages)
        summary = summarize(messages)
        log_commit(f"micro-batch {batchId}", summary, routine_at_debug=True)
        write_summary(self.options.summary_path, "commit", f"batch-{batchId}", {"batch_id": batchId, **summary})

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        summary = summarize(messages)
        done = [m for m in messages if isinstance(m, SinkCommitMessage)]
        query_id = next((str(m.query_id) for m in done if m.query_id), None)
        log_abort(f"micro-batch {batchId}", summary, self.options.wal_path or next((m.wal_path for m in done), None),
                  stream_write_id(query_id, batchId) if query_id else f"(this query's id)-b{batchId:012d}",
                  "restart the query from its checkpoint: Spark re-runs the batch under the same id and it sends "
                  "only what Kafka never acknowledged")
        write_summary(self.options.summary_path, "abort", f"batch-{batchId}", {"batch_id": batchId, **summary})
