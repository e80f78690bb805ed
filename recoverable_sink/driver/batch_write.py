"""The batch writer: ``df.write.format("recoverable_kafka")``. ``write`` runs in every task (executor);
``commit``/``abort`` run on the driver."""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Iterator

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage

from recoverable_sink._logging import get_logger
from recoverable_sink.columns import SchemaPlan
from recoverable_sink.contract import SinkCommitMessage, TaskIdentity, new_run_id
from recoverable_sink.driver import proof_place
from recoverable_sink.driver.summary import log_abort, log_commit, summarize, wal_location, write_summary
from recoverable_sink.errors import sentence_first
from recoverable_sink.options import SinkOptions

log = get_logger("writer")


class RecoverableKafkaBatchWriter(DataSourceArrowWriter):
    """Writes each partition through the WAL. The write id is made here, once, on the driver: it is
    pickled into every task and every retry, so a retry finds the log of the attempt it replaces.

    ``wal.writeId`` sets it instead, for writes that are re-run as a whole and must find the earlier run's
    log: re-running a failed write with the same ``wal.writeId`` sends only what Kafka never acknowledged, and
    in ``foreachBatch``, ``f"{query_id}-{batch_id}"`` makes a re-run micro-batch skip what the earlier run
    delivered. The proof of delivery of a ``wal.writeId`` write stays in the WAL for ``wal.retentionHours``."""

    def __init__(self, options: SinkOptions, plan: SchemaPlan, cluster_id: str) -> None:
        self.options = options
        self.plan = plan
        self.cluster_id = cluster_id
        self.write_id = options.write_id or uuid.uuid4().hex
        # One run of this write (this driver-side writer, one SparkContext): its tasks' attempt ids are ordered.
        self.run_id = new_run_id()
        # Where the tasks read the write's proof in the proof topic (None: proof.kafka=false).
        self.proof_start = proof_place.start_for(options, self.write_id, generated=options.write_id is None)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        from recoverable_sink.executor.spark_input import how_input_ended  # executor-side code, imported where it runs
        from recoverable_sink.executor.task import write_partition

        ctx = TaskContext.get()
        assert ctx is not None, "write() runs inside a Spark task"
        ident = TaskIdentity(write_id=self.write_id, partition=ctx.partitionId(), attempt=ctx.attemptNumber(),
                             kind="batch", stage=ctx.stageId(), task_attempt_id=ctx.taskAttemptId(), run=self.run_id,
                             generated=self.options.write_id is None)
        with sentence_first():
            return write_partition(iterator, self.options, self.plan, ident, self.cluster_id,
                                   input_end=how_input_ended, proof_start=self.proof_start)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        summary = summarize(messages)
        log_commit(f"write {self.write_id}", summary)
        write_summary(self.options.summary_path, "commit", self.write_id, summary)
        proof_place.finish_write(self.options, self.write_id, self.proof_start, self.options.write_id is None,
                                 messages)
        if self.options.write_id is None:
            self._release_proof(messages)
            if self.options.exactly_once:
                # A generated id is never re-run: its markers are of no further use. Under wal.writeId they stay
                # (a re-run of a committed write then sends nothing) until offsets.retention.minutes.
                from recoverable_sink.producer.transactions import delete_markers, marker_groups

                partitions = [m.partition for m in messages if isinstance(m, SinkCommitMessage)]
                delete_markers(self.options, marker_groups(self.options, self.write_id, partitions))

    def _release_proof(self, messages: list[WriterCommitMessage | None]) -> None:
        """A write under a generated id is never re-run, so once it is committed its proof of delivery is of no
        use: drop it where the driver can reach it (the WAL paths the tasks on this host reported: local and
        local-cluster masters); on other hosts the next task drops it if the proof topic holds it (else
        wal.proofMaxBytes bounds it)."""
        if not self.options.wal_enabled:
            return
        here = socket.gethostname()
        paths = {m.wal_path for m in messages if isinstance(m, SinkCommitMessage) and m.wal_path and m.host == here}
        from recoverable_sink.wal import open_wal

        for path in sorted(paths):
            if os.path.exists(os.path.join(path, "data.mdb")):
                wal = open_wal(path)
                wal.purge([a.key for a in wal.attempts(f"{self.write_id}/")])

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        proof_place.refresh_entry(self.options, self.write_id, self.proof_start)
        summary = summarize(messages)
        reported = [m.wal_path for m in messages if isinstance(m, SinkCommitMessage) and m.wal_path]
        wal_path = self.options.wal_path or (reported[0] if reported else None)
        path_arg = wal_location(wal_path)[1]
        log_abort(f"write {self.write_id}", summary, wal_path, self.write_id,
                  f"re-run it with .option('wal.writeId', '{self.write_id}') once the cause is fixed: it sends only "
                  "what Kafka never acknowledged (recomputed from the source), or, where every unfinished partition "
                  f"was fully logged, `recoverable-kafka-wal replay --path {path_arg} --write-id {self.write_id} "
                  "--bootstrap-servers ...` on each executor host")
        write_summary(self.options.summary_path, "abort", self.write_id, summary)
