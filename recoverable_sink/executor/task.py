"""One Spark task's write (executor): the writer for the partition's delivery guarantee, driven over the task's
input, committed only if the input ended as Spark ends a finished partition.

Shared by the batch and the streaming writer; only the identity differs (write id vs query/batch id). The
protocol itself is in :mod:`recoverable_sink.executor.writer` (at_least_once) and
:mod:`recoverable_sink.executor.exactly_once_writer`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import pyarrow as pa

from recoverable_sink.columns import SchemaPlan
from recoverable_sink.contract import SinkCommitMessage, TaskIdentity
from recoverable_sink.errors import InputCutShortError
from recoverable_sink.executor.exactly_once_writer import ExactlyOnceWriter
from recoverable_sink.executor.rerun import settle_micro_batches
from recoverable_sink.executor.spark_input import InputEnd
from recoverable_sink.executor.writer import AtLeastOnceWriter
from recoverable_sink.options import SinkOptions
from recoverable_sink.producer.protocol import SinkProducer
from recoverable_sink.wal import open_wal

__all__ = ["AtLeastOnceWriter", "ExactlyOnceWriter", "open_writer", "write_partition"]


def open_writer(options: SinkOptions, plan: SchemaPlan, ident: TaskIdentity, cluster_id: str,
                producer: SinkProducer | None = None) -> AtLeastOnceWriter:
    """A started writer for ``options.guarantee``. ``producer`` replaces the pooled one (at_least_once only: an
    exactly_once attempt always makes its own transactional producer). A micro-batch's task first settles the
    query's logs on this host: a zombie's stands down before any producer fences the query's current one, and
    the logs of committed micro-batches go."""
    if options.wal_enabled and ident.kind == "stream":
        settle_micro_batches(open_wal(options.resolved_wal_path()), ident)
    if options.exactly_once:
        return ExactlyOnceWriter(options, plan, ident, cluster_id).start()
    return AtLeastOnceWriter(options, plan, ident, cluster_id, producer).start()


def write_partition(batches: Iterable[pa.RecordBatch], options: SinkOptions, plan: SchemaPlan,
                    ident: TaskIdentity, cluster_id: str,
                    input_end: Callable[[], InputEnd] = lambda: InputEnd.UNKNOWN) -> SinkCommitMessage:
    """Write one partition: commit once the input ended normally, abort on any failure. ``input_end`` says how
    the input ended (:func:`~recoverable_sink.executor.spark_input.how_input_ended` in a Spark task): a cut-short
    input is a failure, so that no part of a partition is ever committed or marked fully logged."""
    writer = open_writer(options, plan, ident, cluster_id)
    try:
        for batch in batches:
            writer.write(batch)
        if input_end() is InputEnd.CUT_SHORT:
            raise InputCutShortError(
                f"{ident.where}: Spark ended this task's input after {writer.position} records because the JVM side "
                "of the task failed (its own error is the task's error). Nothing of this attempt is committed"
                + (": its transaction is aborted" if options.exactly_once else
                   "; what Kafka acknowledged stays recorded in this host's WAL, so a retry here does not send it "
                   "again"))
        return writer.commit()
    except BaseException:
        writer.abort()
        raise
