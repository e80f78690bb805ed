"""The at-least-once partition writer (executor): one task attempt's records through the WAL to Kafka.

The protocol, per (write id, partition):
1. :meth:`AtLeastOnceWriter.start` takes a producer, opens the attempt's log and reads what earlier attempts on
   this host logged: the digests of the records Kafka acknowledged to them (see :mod:`recoverable_sink.identity`).
2. :meth:`~AtLeastOnceWriter.write` normalises and checks each input batch; records whose digest matches an
   acknowledged one are skipped (as a multiset), the rest are logged to the WAL (fsynced, with their digests)
   before the producer sees them.
3. What Kafka acknowledged is learnt at drains and checkpointed to the WAL with every store and on a short
   timer; a fully acknowledged segment keeps only its digests.
4. :meth:`~AtLeastOnceWriter.commit`: once the whole partition is logged the attempt is ``logged``; once Kafka
   acknowledged everything it is ``done`` and keeps only digests, as proof of delivery until the write is
   certainly committed. On any failure, :meth:`~AtLeastOnceWriter.abort`.

:class:`recoverable_sink.executor.exactly_once_writer.ExactlyOnceWriter` extends it with the partition's transaction.
Neither needs Spark: a test drives them with plain Arrow batches.
"""

from __future__ import annotations

import gc
import socket
import time
from collections.abc import Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass
from enum import Enum
from typing import TypeVar

import pyarrow as pa

from recoverable_sink._logging import get_logger
from recoverable_sink.columns import SchemaPlan
from recoverable_sink.contract import SinkCommitMessage, TaskIdentity
from recoverable_sink.errors import (
    DeliveryError,
    FatalProducerError,
    InputCutShortError,
    RecordError,
    RerunRefusedError,
    StaleAttemptError,
    UnknownTopicError,
)
from recoverable_sink.executor import dead_letters, resume_plan
from recoverable_sink.executor.attempt_log import Acks, LogOfAttempt, NoLog, open_log
from recoverable_sink.executor.normalise import normalise
from recoverable_sink.executor.pacing import Pacer, pacer_for
from recoverable_sink.executor.record_checks import TOPIC_BATCH_FRAMING, check_batch, find_refusals
from recoverable_sink.executor.rerun import EarlierRuns, NoEarlierRuns
from recoverable_sink.executor.resume_plan import (
    Evidence,
    Plan,
    Prior,
    Refuse,
    Send,
    SkipIfCommitted,
    StandDown,
    TaskAttempt,
    Wait,
)
from recoverable_sink.identity import DeliveredSet, Fingerprint, record_digests, slices, split
from recoverable_sink.options import DeadLetterTopic, SinkOptions
from recoverable_sink.producer.ledger import Ledger, delivery_timeout_s
from recoverable_sink.producer.pool import producers
from recoverable_sink.producer.protocol import SinkProducer
from recoverable_sink.producer.topics import create_as_brokers_would, says_missing

log = get_logger("writer")

_FLUSH_MARGIN_S = 30.0  # past librdkafka's own delivery timeout, which reports every undelivered record

# A drain this often, so that acknowledgements reach the WAL and a hard kill repeats little; how often was chosen
# by measurement (docs/performance.md, "Checkpoint interval").
CHECKPOINT_EVERY_S = 0.05

# A WAL segment (one LMDB value and transaction, one hand-over to the producer) holds about this many bytes of
# Arrow data at most, not a whole batch of 10,000 large records (100 MB at 10 KB): docs/performance.md, "Segments
# of about 8 MiB".
SEGMENT_MAX_BYTES = 8 * 2**20


class Phase(Enum):
    """Where a writer is. ``SKIPPING`` is exactly_once's: an earlier attempt's transaction holds the partition,
    so the input is only counted."""

    NEW = "new"
    WRITING = "writing"
    SKIPPING = "skipping"
    COMMITTED = "committed"
    ABORTED = "aborted"


def final_wait_s(options: SinkOptions) -> float:
    """How long the end of a task waits for the last acknowledgements."""
    timeout = delivery_timeout_s(options)
    return timeout + min(_FLUSH_MARGIN_S, max(1.0, timeout))


class _Partitions:
    """Partition counts of the topics a batch names, from the cluster's metadata, asked once per topic."""

    def __init__(self, producer: SinkProducer, options: SinkOptions) -> None:
        self.producer = producer
        self.options = options
        self.counts: dict[str, int] = {}

    def __call__(self, topic: str) -> int:
        if topic not in self.counts:
            count, err = self.producer.partition_count(topic, 30)
            if err is not None:
                if not says_missing(err):
                    # Not an answer that the topic is missing (a time-out, no authorisation): the task fails.
                    raise RecordError(f"topic {topic}'s metadata could not be read ({err.str()}): check the brokers "
                                      "and that this principal may DESCRIBE and WRITE the topic")
                # A topic column's topic: created as the brokers would auto-create it, unless topic.mustExist.
                why = "topic.mustExist=true" if self.options.topic_must_exist else \
                    create_as_brokers_would(self.options, topic, 30)
                if why is not None:
                    raise UnknownTopicError(f"topic {topic} does not exist ({err.str()}), and {why}: create it "
                                            "first, or check its name")
                count, err = self.producer.partition_count(topic, 30)
                if err is not None:
                    raise RecordError(f"topic {topic} was created but is not accessible ({err.str()})")
            self.counts[topic] = count
        return self.counts[topic]


def _size_limit(options: SinkOptions, topic: str | None = None, topic_max: int | None = None) -> tuple[int, str]:
    """The largest record (as record_checks sizes it) the producer and, uncompressed, the topic accept (the
    ``topic`` option's, unless another topic and its max.message.bytes are given)."""
    if topic is None:
        topic, topic_max = options.topic, options.topic_max_message_bytes
    conf = options.producer_config()
    limit = int(conf.get("message.max.bytes", 1_000_000))
    name = f"the producer's message.max.bytes={limit}"
    compressed = conf.get("compression.type", conf.get("compression.codec", "none")) != "none"
    if topic_max is not None and not compressed and topic_max - TOPIC_BATCH_FRAMING < limit:
        limit = topic_max - TOPIC_BATCH_FRAMING
        name = (f"{limit} bytes (topic {topic}'s max.message.bytes={topic_max}, less {TOPIC_BATCH_FRAMING} "
                "of batch framing)")
    return limit, name


@dataclass(frozen=True)
class _Pending:
    """A batch on its way: logged (or being logged) to the WAL, not yet handed to the producer."""

    batch: pa.RecordBatch
    first: int
    stored: Future[int] | None  # the WAL store of the batch


W = TypeVar("W", bound="AtLeastOnceWriter")


class AtLeastOnceWriter:
    """Writes one partition: :meth:`start`, :meth:`write` for each Arrow batch, then :meth:`commit` (returns the
    commit message) or, on any failure, :meth:`abort`. Shaped like Spark's ``KafkaDataWriter`` and Flink's
    ``SinkWriter``; the Spark writers go through :func:`recoverable_sink.executor.task.write_partition`.

    One batch ahead: the fsynced WAL commit of batch k+1 runs on a thread while batch k is produced (LMDB
    and Arrow release the GIL); batch k+1 is produced only after its own commit returned, and once a WAL
    write failed no later batch enters the log."""

    # Whether the input's fingerprint is wanted when no WAL store hashes the records (exactly_once's markers).
    FINGERPRINT_WITHOUT_WAL = False

    def __init__(self, options: SinkOptions, plan: SchemaPlan, ident: TaskIdentity, cluster_id: str,
                 producer: SinkProducer | None = None) -> None:
        self.options = options
        self.plan = plan
        self.ident = ident
        self.cluster_id = cluster_id
        self.faults = options.faults  # the test suite's and chaos campaign's, from _test.* options; else None
        self.where = ident.where
        self.phase = Phase.NEW
        self.started = time.monotonic()
        self.max_message, self.max_message_name = _size_limit(options)
        self.log: LogOfAttempt = NoLog()
        self.delivered = DeliveredSet()  # what earlier attempts of this run got acknowledged: skipped when met again
        # What earlier runs of the write delivered on this host, in any partition: a re-run's partitions may hold
        # other rows than the failed run's partitions of the same number.
        self.earlier: EarlierRuns | NoEarlierRuns = NoEarlierRuns()
        self.resume: Send = Send()  # the resume plan this attempt follows, once started
        self.fingerprint = Fingerprint()  # of the whole input, skipped records included
        self.marker_topic = plan.topic_option
        self.position = 0  # records read from Spark
        self.logged = 0  # records handed to the WAL (the ones this attempt must send)
        self._given_producer = producer
        self.pacer: Pacer = pacer_for(options)  # rate.recordsPerSecond / rate.bytesPerSecond, if set
        self._pending: _Pending | None = None
        self._last_checkpoint = time.monotonic()

    # ---- the start --------------------------------------------------------------------------------------
    def start(self: W) -> W:
        """Take a producer, open this attempt's log and learn what earlier attempts left; then ``write``."""
        assert self.phase is Phase.NEW, f"{self.where}: started twice"
        _freeze_heap_once()
        self.producer = self._open_producer()
        try:
            self.ledger = Ledger(self.producer, self.options.scrub)
            self.partitions = _Partitions(self.producer, self.options)
            self.log = open_log(self.options, self.ident)
            self.phase = self._recover()
            if self.phase is Phase.WRITING:
                self.log.begin(self.ident, {"kind": self.ident.kind, "topic": self.plan.topic_option,
                                            "cluster_id": self.cluster_id, "guarantee": self.options.guarantee})
                self._begun()
            if self.log.priors:
                log.info("%s: found %d earlier attempt(s) in WAL %s; sending only what Kafka never acknowledged",
                         self.where, len(self.log.priors), self.log.path)
            self.message = SinkCommitMessage(
                write_id=self.ident.write_id, partition=self.ident.partition, attempt=self.ident.attempt,
                host=socket.gethostname(), wal_path=self.log.path, producer=self.producer.kind)
        except BaseException:
            self._release_after_failed_start()
            raise
        return self

    def _open_producer(self) -> SinkProducer:
        return self._given_producer if self._given_producer is not None else producers.get(self.options)

    def _recover(self) -> Phase:
        """Write; what the earlier attempts got acknowledged is read once this attempt has begun (:meth:`_begun`)."""
        return Phase.WRITING

    def _begun(self) -> None:
        """Follow the resume plan, once this attempt has begun its entry: it is begun before the earlier attempts
        are read (LMDB serialises the two), so of two attempts that overlap one always sees the other."""
        try:
            self._follow(self._planned(self.log.write_priors(self._task())))
        except BaseException:
            self.log.drop()  # nothing logged under it: no retry is to wait for this attempt
            raise

    def _task(self) -> TaskAttempt:
        """This attempt as the resume plan sees it."""
        ident = self.ident
        return TaskAttempt(write_id=ident.write_id, partition=ident.partition, run=ident.run,
                           exactly_once=self.options.exactly_once, task_attempt_id=ident.task_attempt_id,
                           micro_batch=ident.batch_id if ident.kind == "stream" else None, key=self.log.key,
                           seq=self.log.seq)

    def _evidence(self, priors: tuple[Prior, ...], waited_out: bool) -> Evidence:
        return Evidence(task=self._task(), priors=priors, waited_out=waited_out, wal=self.log.path)

    def _planned(self, priors: tuple[Prior, ...]) -> Plan:
        """The resume plan; while it says to wait for attempts still sending on this host, the priors are read again
        every 0.05 s, up to the final delivery wait."""
        deadline = time.monotonic() + final_wait_s(self.options)
        waited = False
        while True:
            plan = resume_plan.plan(self._evidence(priors, waited_out=time.monotonic() >= deadline))
            if not isinstance(plan, Wait):
                return plan
            if not waited:
                log.info("%s: waiting for %d earlier attempt(s) of this write (%s), still sending from a live "
                         "Python worker on this host, to end", self.where, len(plan.attempts),
                         ", ".join(plan.attempts))
                waited = True
            time.sleep(CHECKPOINT_EVERY_S)
            priors = self.log.write_priors(self._task())

    def _follow(self, plan: Plan) -> Phase:
        """Carry out a resume plan: what to skip by, or the stand-down or refusal (nothing sent)."""
        if isinstance(plan, StandDown):
            raise (InputCutShortError if plan.by_retry else StaleAttemptError)(plan.reason)
        if isinstance(plan, Refuse):
            raise RerunRefusedError(plan.message)
        if isinstance(plan, SkipIfCommitted):
            log.info("%s: %s: the partition is skipped if its input is the one committed (same fingerprint)",
                     self.where, plan.reason)
            return Phase.SKIPPING
        assert isinstance(plan, Send)
        if plan.overdue:
            log.warning("%s: %d earlier attempt(s) of this write still run after %.0f s; going on without knowing "
                        "what Kafka acknowledged to them since: some records may be sent twice", self.where,
                        len(plan.overdue), final_wait_s(self.options))
        if plan.unproven:
            log.warning("WAL %s: the proof of delivery of %d earlier attempt(s) of write %s went to keep "
                        "wal.proofMaxBytes, so what they delivered is not known here and is sent again",
                        self.log.path, len(plan.unproven), self.ident.write_id)
        self.resume = plan
        self.delivered = self.log.proof(plan.resume, plan.all_acknowledged)
        if plan.claim:
            self.earlier = self.log.claims(self.ident, plan.claim, all_acknowledged=self.options.exactly_once)
            log.info("%s: a re-run of write %s: %d records that other runs delivered on this host, in any "
                     "partition, are not sent again", self.where, self.ident.write_id, self.earlier.records)
        return Phase.WRITING

    def _release_after_failed_start(self) -> None:
        """Nothing was sent: the pooled producer stays in the pool, and an entry begun is removed, so that no
        retry waits for it."""
        self.log.drop()

    # ---- the data path ----------------------------------------------------------------------------------
    def write(self, raw: pa.RecordBatch) -> None:
        """Check one batch, log what must be sent, and produce the batch before it."""
        if raw.num_rows == 0:
            return
        if self.ledger.failed:
            # A drain found a record librdkafka gave up on (delivery.timeout.ms passed): this attempt cannot commit,
            # and each further drain could wait out the delivery timeout again (brokers gone: minutes an attempt).
            raise self._undelivered()
        if self.phase is Phase.SKIPPING:
            self.position += raw.num_rows
            self.message.skipped += raw.num_rows
            return
        assert self.phase is Phase.WRITING, f"{self.where}: write() while {self.phase.value}"
        batch = normalise(raw, self.plan)
        first = self.position
        self.position += batch.num_rows
        if not isinstance(self.options.errors, DeadLetterTopic):
            check_batch(batch, self.plan.topic_option, self.where, first, self.max_message, self.partitions,
                        self.max_message_name)
            self._log_and_send(batch, None)
            return
        refusals = find_refusals(batch, self.plan.topic_option, self.max_message, self.partitions,
                                 self.max_message_name)
        batch, dead = dead_letters.split(batch, refusals, self.options.errors, self.plan.topic_option,
                                         self.cluster_id, self._dead_letter_context())
        if dead is not None:
            self._check_dead_letters(dead, first)  # before any of the batch enters the WAL
        if batch.num_rows:
            self._log_and_send(batch, None)
        if dead is not None:
            for kind, n in dead.counts().items():
                self.message.dead_lettered[kind] = self.message.dead_lettered.get(kind, 0) + n
            self.message.dead_letter_topic = self.options.errors.topic
            self._log_and_send(dead.batch, dead.digests, dead.input_digests)

    def _dead_letter_context(self) -> dict[str, str]:
        """The headers that say which write and task attempt sent a dead letter."""
        return {dead_letters.H_CONNECTOR: self.ident.write_id, dead_letters.H_TASK: str(self.ident.partition),
                dead_letters.H_WRITE: self.ident.write_id, dead_letters.H_ATTEMPT: str(self.ident.attempt)}

    def _check_dead_letters(self, dead: dead_letters.DeadLetters, first: int) -> None:
        """A dead letter the dead-letter topic would refuse too fails the task, naming both refusals."""
        assert isinstance(self.options.errors, DeadLetterTopic)
        limit, name = _size_limit(self.options, self.options.errors.topic, self.options.errors.max_message_bytes)
        for refusal in find_refusals(dead.batch, None, limit, self.partitions, name):
            i = refusal.first()
            if i is not None:
                row = dead.rows[i]
                raise RecordError(
                    f"{self.where}, record {first + row}: Kafka would refuse it ({dead.kinds[i]}), and the "
                    f"dead-letter topic {self.options.errors.topic} would refuse it too: {refusal.message(i)}")

    def _log_and_send(self, batch: pa.RecordBatch, digests: bytes | None, as_input: bytes | None = None) -> None:
        """Log a checked batch (less what earlier attempts delivered) and produce the batch before it. ``digests``:
        the records' delivery identities where they are not the batch's own (dead letters), and ``as_input`` their
        identities as they came in, which the input's fingerprint counts."""
        if self.marker_topic is None:  # a topic column's first topic (the dead-letter topic's, for a dead letter)
            self.marker_topic = batch.column("topic")[0].as_py()
        # Hashed beside the WAL store, unless needed here to match a retry's input.
        if digests is None and (self.delivered or self.earlier or
                                (self.log.key is None and self.FINGERPRINT_WITHOUT_WAL)):
            digests = record_digests(batch, self.plan.topic_option, self.cluster_id)
        if digests is not None:
            self.fingerprint.add(as_input if as_input is not None else digests)
            if self.delivered or self.earlier:
                sent = self._not_delivered(split(digests))
                if not all(sent):
                    self.message.skipped += batch.num_rows - sum(sent)
                    batch = batch.filter(pa.array(sent))
                    digests = b"".join(d for d, keep in zip(split(digests), sent, strict=True) if keep)
        if batch.num_rows == 0:
            return
        for piece, piece_digests in self.pacer.pieces(batch, digests):
            for segment, segment_digests in _segments(piece, piece_digests):
                stored = self.log.store(segment, self.logged, segment_digests, self._dirty(),
                                        self.plan.topic_option, self.cluster_id, self.fingerprint)
                if self._pending is not None:
                    self._produce(self._pending)
                self._pending = _Pending(segment, self.logged, stored)
                self.logged += segment.num_rows

    def _not_delivered(self, digests: list[bytes]) -> list[bool]:
        """Per record, whether it must be sent: neither an earlier attempt of this run nor, on a re-run, an
        earlier run got it acknowledged."""
        match = self.delivered.take(digests)
        self.message.replayed += match.replayed
        skip = match.skip
        if self.earlier:
            more = iter(self.earlier.take([d for d, s in zip(digests, skip, strict=True) if not s]))
            skip = [s or next(more) for s in skip]
        return [not s for s in skip]

    def flush(self, wait_s: float, sync: bool = True) -> None:
        """Hand every written batch to the producer, wait up to ``wait_s`` for Kafka's acknowledgements and
        persist them (queued only, without ``sync``): what a retry would skip if the task died now, as Flink's
        ``SinkWriter.flush``."""
        self._produce_pending()
        self._checkpoint(wait_s, sync)

    def _produce_pending(self) -> None:
        if self._pending is not None:
            self._produce(self._pending)
            self._pending = None

    def _before_send(self) -> None:
        """Called before every batch goes to the producer."""

    def _produce(self, pending: _Pending) -> None:
        if pending.stored is not None:
            self.message.wal_bytes += pending.stored.result()
        self.pacer.wait(pending.batch)
        self._before_send()
        try:
            with _no_collection():
                self.message.published += self.ledger.send(pending.batch, self.plan.topic_option, pending.first)
        except (DeliveryError, RecordError) as exc:
            raise self._located(exc) from None
        end = pending.first + pending.batch.num_rows
        if self.faults is not None:
            self.faults.after_batch(self.ident.write_id, self.ident.partition, self.ident.attempt,
                                    self.message.skipped + end,
                                    lambda: self._checkpoint(wait_s=delivery_timeout_s(self.options)))
        if time.monotonic() - self._last_checkpoint > CHECKPOINT_EVERY_S:
            # A drain: produce nothing more until the producer's queue is empty, so that what it held is known
            # to be acknowledged or failed. Waiting only a while would let a large backlog (big values) refill
            # the queue before every drain, and no acknowledgement would be learnt until the end.
            self._checkpoint(wait_s=final_wait_s(self.options), sync=False)

    def _located(self, exc: DeliveryError | RecordError) -> DeliveryError | RecordError:
        return type(exc)(f"{self.where}: {self.options.scrub(str(exc))}")

    def _dirty(self) -> Acks:
        """The bitmaps changed since the last save, for the log to persist. Delivery callbacks run on this (the
        task's) thread, inside produce/poll/flush: no lock needed."""
        return self.ledger.take_changes() if self.log.key is not None else {}

    def _checkpoint(self, wait_s: float, sync: bool = True) -> None:
        """Persist what Kafka acknowledged so far; with ``wait_s``, drain: wait up to that long for the rest,
        persisting every ``CHECKPOINT_EVERY_S`` meanwhile (a kill during a long final flush repeats little).
        Without ``sync`` the saves are only queued: a drain in mid-partition need not wait for the disk."""
        deadline = time.monotonic() + wait_s
        while True:
            remaining = deadline - time.monotonic()
            try:
                if remaining > 0 and self.ledger.outstanding:
                    self.ledger.wait_for_acks(min(remaining, CHECKPOINT_EVERY_S))
                else:
                    self.ledger.serve()
            except FatalProducerError as exc:
                self.log.save_acks(self._dirty())  # what was served before the producer died still counts
                raise self._located(exc) from None
            self._last_checkpoint = time.monotonic()
            self.log.save_acks(self._dirty(), sync)
            if not self.ledger.outstanding or time.monotonic() >= deadline:
                return

    # ---- the end ----------------------------------------------------------------------------------------
    def commit(self) -> SinkCommitMessage:
        """Produce the last batch, wait for every acknowledgement, and leave only proof of delivery (under
        exactly_once: commit the transaction with its marker)."""
        message = self._commit_skipped() if self.phase is Phase.SKIPPING else self._commit_written()
        self.phase = Phase.COMMITTED
        return message

    def _commit_skipped(self) -> SinkCommitMessage:
        raise AssertionError("only exactly_once skips a partition")

    def _commit_written(self) -> SinkCommitMessage:
        self._produce_pending()
        self.log.mark_logged(self._dirty())
        self._checkpoint(wait_s=final_wait_s(self.options))
        ledger = self.ledger
        if ledger.failed or ledger.outstanding:
            raise self._undelivered()
        message = self.message
        message.received = self.position
        message.acknowledged = ledger.acked
        message.offsets, complete = ledger.written_offsets()
        message.offsets_complete = complete and not message.skipped
        message.diverged = self.delivered.left_over()
        self._keep_proof(message)
        message.seconds = time.monotonic() - self.started
        if self.log.priors:
            log.info("%s: done after earlier attempts: %d records, %d sent, %d skipped as already delivered, "
                     "%d re-sent that were logged but unacknowledged, %d delivered earlier but not recomputed",
                     self.where, message.received, message.published, message.skipped, message.replayed,
                     message.diverged)
        return message

    def _undelivered(self) -> DeliveryError:
        """The error of an attempt some of whose records Kafka did not acknowledge."""
        ledger = self.ledger
        problem = ledger.first_error() or f"{ledger.outstanding} records still unacknowledged at the deadline"
        return DeliveryError(
            f"{self.where}: Kafka did not acknowledge {ledger.failed + ledger.outstanding} of "
            f"{ledger.produced} records: {self.options.scrub(problem)}. They stay in WAL "
            f"{self.log.path or '(disabled)'}; re-run the write with "
            f"wal.writeId={self.ident.write_id} to send only those"
        )

    def _keep_proof(self, message: SinkCommitMessage) -> None:
        """Everything is acknowledged: this attempt's digests stay as proof, the earlier attempts' go."""
        if self.ident.retry and not self.log.priors:
            message.unproven = message.published  # a retry with nothing to skip by: some may be repeats
        # An exactly_once attempt of an earlier run is not this mode's to finish: done means committed there.
        self.log.finish([p.key for p in self.log.priors if not p.exactly_once])

    def abort(self) -> None:
        """After a failure: give records already handed over their chance to be acknowledged and persist what
        was, so a retry skips them; then release the producer so no stale delivery reaches the next task."""
        try:
            for acks in self.log.settle():
                self.ledger.give_back(acks)
            waiting = self.ledger.outstanding and self._waits_on_abort()
            self._checkpoint(wait_s=min(delivery_timeout_s(self.options), 60.0) if waiting else 0)
        except Exception as secondary:  # noqa: BLE001 - the original error is the one to report
            log.warning("%s: could not checkpoint acknowledgements after the failure: %s", self.where,
                        self.options.scrub(str(secondary)))
        finally:
            self.phase = Phase.ABORTED
            try:
                self.log.end()
            except Exception as secondary:  # noqa: BLE001 - a retry waiting for this attempt goes on at its deadline
                log.warning("%s: could not mark the attempt ended in the WAL: %s", self.where,
                            self.options.scrub(str(secondary)))
            self._release_after_abort()

    def _waits_on_abort(self) -> bool:
        """Whether records still outstanding are worth waiting for: an acknowledgement saved now is one a retry
        need not send."""
        return True

    def _release_after_abort(self) -> None:
        producers.discard(self.options)


def _segments(batch: pa.RecordBatch, digests: bytes | None) -> Iterator[tuple[pa.RecordBatch, bytes | None]]:
    """The batch in WAL segments of about ``SEGMENT_MAX_BYTES`` at most: slices of equal row counts, so a batch of
    uneven records may give a segment above it."""
    if batch.nbytes <= SEGMENT_MAX_BYTES:
        yield batch, digests
        return
    yield from slices(batch, digests, max(1, batch.num_rows * SEGMENT_MAX_BYTES // batch.nbytes))


_frozen: list[bool] = []


def _freeze_heap_once() -> None:
    """Leave the worker's long-lived heap (pyspark, pyarrow, pandas and their modules) out of every later
    cyclic collection: collect once, then freeze what is left (once per Python worker, which runs many tasks).
    Without it each full collection during a task scans that whole heap again."""
    if not _frozen:
        gc.collect()
        gc.freeze()
        _frozen.append(True)


@contextmanager
def _no_collection() -> Iterator[None]:
    """No cyclic garbage collection while a batch's per-record objects are made and handed over: they hold no
    cycles, yet their header tuples and lists would trigger collections that scan them all. Whatever cycles
    appear meanwhile are collected once it is re-enabled."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
