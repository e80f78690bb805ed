"""One Spark task's write (executor): the partition writer with the delivery mode of the write's guarantee, driven
over the task's input, committed only if the input ended as Spark ends a finished partition.

Shared by the batch and the streaming writer; only the identity differs (write id vs query/batch id). The protocol
itself is in :mod:`recoverable_sink.executor.partition_writer`, the modes in :mod:`recoverable_sink.executor.delivery`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import pyarrow as pa

from recoverable_sink.columns import SchemaPlan
from recoverable_sink.contract import SinkCommitMessage, TaskIdentity
from recoverable_sink.errors import InputCutShortError
from recoverable_sink.executor.attempt_log import LogOfAttempt, open_log
from recoverable_sink.executor.delivery import AtLeastOnce, DeliveryMode, MarkerReader, Transactional, TransactionClient
from recoverable_sink.executor.kafka_proof import KafkaProofLog, ProofStart
from recoverable_sink.executor.partition_writer import Clock, PartitionWriter, final_wait_s
from recoverable_sink.executor.proof import NoProofTopic, ProofTopic
from recoverable_sink.executor.spark_input import InputEnd
from recoverable_sink.options import KafkaProof, SinkOptions
from recoverable_sink.producer.protocol import SinkProducer

__all__ = ["PartitionWriter", "mode_for", "open_writer", "write_partition"]


def mode_for(options: SinkOptions, ident: TaskIdentity, producer: SinkProducer | None = None,
             transaction: TransactionClient | None = None, markers: MarkerReader | None = None) -> DeliveryMode:
    """The delivery mode of ``options.guarantee``. ``producer`` replaces the pooled one (at_least_once), and
    ``transaction`` the partition's transaction and ``markers`` the reader of other partitions' markers
    (exactly_once): a test's or the model's scripted ones."""
    if options.exactly_once:
        return Transactional(options, ident, final_wait_s(options), transaction, markers)
    return AtLeastOnce(options, producer)


def proof_for(options: SinkOptions, ident: TaskIdentity, start: ProofStart | None = None) -> ProofTopic:
    """The proof topic of the write (``start``: where its driver says the write's proof is read from; a stream's
    tasks look it up), or none with ``proof.kafka=false``."""
    if isinstance(options.proof, KafkaProof):
        return KafkaProofLog(options, options.proof, ident, start)
    return NoProofTopic()


def open_writer(options: SinkOptions, plan: SchemaPlan, ident: TaskIdentity, cluster_id: str,
                producer: SinkProducer | None = None, *, transaction: TransactionClient | None = None,
                markers: MarkerReader | None = None, log: LogOfAttempt | None = None,
                proof: ProofTopic | None = None, proof_start: ProofStart | None = None,
                clock: Clock | None = None, topic_max: Callable[[str], int | None] | None = None) -> PartitionWriter:
    """A started writer for ``options.guarantee`` (see :func:`mode_for`); ``log``, ``proof``, ``clock`` and
    ``topic_max`` (a topic column's topics' max.message.bytes) replace the host's WAL, the proof topic, time and the
    brokers' answers for a test or the model."""
    return PartitionWriter(options, plan, ident, cluster_id,
                           mode_for(options, ident, producer, transaction, markers),
                           log if log is not None else open_log(options, ident),
                           proof if proof is not None else proof_for(options, ident, proof_start), clock,
                           topic_max).start()


def write_partition(batches: Iterable[pa.RecordBatch], options: SinkOptions, plan: SchemaPlan,
                    ident: TaskIdentity, cluster_id: str,
                    input_end: Callable[[], InputEnd] = lambda: InputEnd.UNKNOWN,
                    proof_start: ProofStart | None = None) -> SinkCommitMessage:
    """Write one partition: commit once the input ended normally, abort on any failure. ``input_end`` says how
    the input ended (:func:`~recoverable_sink.executor.spark_input.how_input_ended` in a Spark task): a cut-short
    input is a failure, so that no part of a partition is ever committed or marked fully logged."""
    writer = open_writer(options, plan, ident, cluster_id, proof_start=proof_start)
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
