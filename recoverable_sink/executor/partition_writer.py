"""The partition writer (executor): one task attempt's records through the WAL to Kafka, under either delivery mode.

The protocol, per (write id, partition):
1. :meth:`PartitionWriter.start` begins the attempt's entry in the host's WAL, gathers the evidence of earlier attempts
   (:mod:`~recoverable_sink.executor.evidence`), opens the delivery mode (:mod:`~recoverable_sink.executor.delivery`)
   and follows the resume plan (:mod:`~recoverable_sink.executor.resume_plan`): what to skip by, or a wait, a
   stand-down, a skipped committed partition or a refusal.
2. :meth:`~PartitionWriter.write` normalises and checks each input batch; records already delivered are skipped (as a
   multiset), the rest are logged to the WAL (fsynced, with their digests) before the producer sees them.
3. What Kafka acknowledged is learnt at drains and checkpointed to the WAL; a fully acknowledged segment keeps only its
   digests.
4. :meth:`~PartitionWriter.commit`: once the whole partition is logged the attempt is ``logged``; once Kafka
   acknowledged everything, the mode finishes it (exactly_once: commits the transaction with the marker) and it is
   ``done``, keeping only digests as proof of delivery. On any failure, :meth:`~PartitionWriter.abort`.

Nothing here needs Spark: the tests and the model drive it with plain Arrow batches, a scripted producer, a scripted
transaction and a temporary WAL.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

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
from recoverable_sink.executor import dead_letters
from recoverable_sink.executor.attempt_log import Acks, LogOfAttempt, Stored
from recoverable_sink.executor.delivery import Commit, DeliveryMode
from recoverable_sink.executor.evidence import Gatherer
from recoverable_sink.executor.normalise import normalise
from recoverable_sink.executor.pacing import Pacer, pacer_for
from recoverable_sink.executor.proof import Claims, NoClaims, NoProofTopic, ProofTopic, WalClaims, delivered
from recoverable_sink.executor.record_checks import TOPIC_BATCH_FRAMING, check_batch, find_refusals
from recoverable_sink.executor.resume_plan import (
    Evidence,
    Plan,
    Refuse,
    Send,
    SkipIfCommitted,
    StandDown,
    TaskAttempt,
    Wait,
    attempt_name,
    finishing,
    judge_skipped,
    plan,
)
from recoverable_sink.identity import DeliveredSet, Fingerprint, record_digests, slices, split
from recoverable_sink.options import DeadLetterTopic, KafkaProof, SinkOptions
from recoverable_sink.producer.ledger import Ledger, delivery_timeout_s
from recoverable_sink.producer.marker import Marker
from recoverable_sink.producer.protocol import SinkProducer
from recoverable_sink.producer.topics import create_as_brokers_would, max_message_bytes, says_missing
from recoverable_sink.proof.format import ChunkSegment, acked_digests
from recoverable_sink.wal import attempt as wal_attempt

log = get_logger("writer")

_FLUSH_MARGIN_S = 30.0  # past librdkafka's own delivery timeout, which reports every undelivered record

# A drain this often, so that acknowledgements reach the WAL and a hard kill repeats little; how often was chosen
# by measurement (docs/performance.md, "Checkpoint interval").
CHECKPOINT_EVERY_S = 0.05
# ... and once this many records were handed over since the last, so that the kill window is a number of records
# whatever the rate (docs/guarantees.md: a kill repeats at most the last two drain windows). A WAL segment holds no
# more, so a window is at most one segment past the limit.
CHECKPOINT_MAX_RECORDS = 10_000

# A WAL segment (one LMDB value and transaction, one hand-over to the producer) holds about this many bytes of
# Arrow data at most, not a whole batch of 10,000 large records (100 MB at 10 KB): docs/performance.md, "Segments
# of about 8 MiB".
SEGMENT_MAX_BYTES = 8 * 2**20


class Clock(Protocol):
    """The writer's time: how long it has waited, and waiting. Only deadlines and the checkpoint interval read it;
    nothing kept, skipped or sent depends on it."""

    def monotonic(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...


class SystemClock:
    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


class Phase(Enum):
    """Where a writer is. ``SKIPPING``: a committed transaction already holds the partition (exactly_once), so the
    input is only counted and fingerprinted."""

    NEW = "new"
    WRITING = "writing"
    SKIPPING = "skipping"
    COMMITTED = "committed"
    ABORTED = "aborted"


def final_wait_s(options: SinkOptions) -> float:
    """How long the end of a task waits for the last acknowledgements."""
    timeout = delivery_timeout_s(options)
    return timeout + min(_FLUSH_MARGIN_S, max(1.0, timeout))


class TaskDestinations:
    """What this task's checks know of the topics it writes to, asked once per topic for the task
    (:class:`~recoverable_sink.executor.record_checks.Destinations`): the partition count, from the cluster's metadata
    (a topic column's missing topic created as the brokers would auto-create it, unless topic.mustExist), and the
    largest record it takes, from the producer's message.max.bytes and, uncompressed, the topic's max.message.bytes
    (the topic option's and the dead-letter topic's read on the driver, a topic column's here)."""

    def __init__(self, producer: SinkProducer, options: SinkOptions,
                 topic_max: Callable[[str], int | None] | None = None) -> None:
        self.producer = producer
        self.options = options
        self.counts: dict[str, int] = {}
        self.limits: dict[str, tuple[int, str]] = {}
        self._topic_max = topic_max or (lambda topic: max_message_bytes(options, topic, 30))

    def partitions(self, topic: str) -> int:
        if topic not in self.counts:
            count, err = self.producer.partition_count(topic, 30)
            if err is not None:
                if not says_missing(err):
                    # Not an answer that the topic is missing (a time-out, no authorisation): the task fails.
                    raise RecordError(f"topic {topic}'s metadata could not be read ({err.str()}): check the brokers "
                                      "and that this principal may DESCRIBE and WRITE the topic")
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

    def limit(self, topic: str) -> tuple[int, str]:
        if topic not in self.limits:
            options = self.options
            dead = options.errors
            if topic == options.topic:
                topic_max = options.topic_max_message_bytes
            elif isinstance(dead, DeadLetterTopic) and topic == dead.topic:
                topic_max = dead.max_message_bytes
            else:
                topic_max = self._topic_max(topic)
            self.limits[topic] = _size_limit(options, topic, topic_max)
        return self.limits[topic]


def _size_limit(options: SinkOptions, topic: str, topic_max: int | None) -> tuple[int, str]:
    """The largest record (as record_checks sizes it) the producer and, uncompressed, ``topic`` (whose
    max.message.bytes is ``topic_max``, None where unknown) accept."""
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
    stored: Future[Stored] | None  # the WAL store of the batch
    digests: bytes | None  # its records' digests, where known before the store


class PartitionWriter:
    """Writes one partition: :meth:`start`, :meth:`write` for each Arrow batch, then :meth:`commit` (returns the
    commit message) or, on any failure, :meth:`abort`. Shaped like Spark's ``KafkaDataWriter`` and Flink's
    ``SinkWriter``; the Spark writers go through :func:`recoverable_sink.executor.task.write_partition`.

    One batch ahead: the fsynced WAL commit of batch k+1 runs on a thread while batch k is produced (LMDB and Arrow
    release the GIL); batch k+1 is produced only after its own commit returned, and once a WAL write failed no later
    batch enters the log."""

    def __init__(self, options: SinkOptions, plan: SchemaPlan, ident: TaskIdentity, cluster_id: str,
                 mode: DeliveryMode, log: LogOfAttempt, proof: ProofTopic | None = None,
                 clock: Clock | None = None, topic_max: Callable[[str], int | None] | None = None) -> None:
        self.options = options
        self.plan = plan
        self.ident = ident
        self.cluster_id = cluster_id
        self.mode = mode
        self.log = log
        self.proof: ProofTopic = proof if proof is not None else NoProofTopic()
        self.clock: Clock = clock if clock is not None else SystemClock()
        self.faults = options.faults  # the test suite's and chaos campaign's, from _test.* options; else None
        self.where = ident.where
        self.phase = Phase.NEW
        self.started = self.clock.monotonic()
        self._topic_max = topic_max
        self.delivered = DeliveredSet()  # what earlier attempts of this run got acknowledged: skipped when met again
        # What other runs of the write delivered, in any partition: a re-run's partitions may hold other rows than the
        # failed run's partitions of the same number.
        self.earlier: Claims = NoClaims()
        self.resume: Send | SkipIfCommitted = Send()  # the resume plan this attempt follows, once started
        self.fingerprint = Fingerprint()  # of the whole input, skipped records included
        self.marker_topic = plan.topic_option
        self.position = 0  # records read from Spark
        self.logged = 0  # records handed to the WAL (the ones this attempt must send)
        self.priors_found = 0  # earlier attempts of this write found here or in Kafka
        self.pacer: Pacer = pacer_for(options)  # rate.recordsPerSecond / rate.bytesPerSecond, if set
        self._pending: _Pending | None = None
        self._last_checkpoint = self.clock.monotonic()
        self._since_drain = 0  # records handed over since the last drain
        self._opened = False
        self._evidence = Evidence(task=self._task())
        # The proof topic's side of this attempt: the digests of segments handed over whose acknowledgements are yet
        # to be written there (at_least_once), and how many chunks this attempt wrote (their keys' numbers).
        self._segment_digests: dict[int, bytes] = {}
        self._chunks = 0

    # ---- the start --------------------------------------------------------------------------------------
    def start(self) -> PartitionWriter:
        """Begin this attempt's entry, learn what earlier attempts left, open the mode and follow the plan; then
        ``write``."""
        assert self.phase is Phase.NEW, f"{self.where}: started twice"
        _freeze_heap_once()
        try:
            # Begun before the earlier attempts are read (LMDB serialises the two), so of two attempts that overlap one
            # always sees the other.
            self.log.begin(self.ident, {"kind": self.ident.kind, "topic": self.plan.topic_option,
                                        "cluster_id": self.cluster_id, "guarantee": self.options.guarantee})
            gather = Gatherer(self._task, self.log, self.proof, self.mode.markers, self.plan.topic_option,
                              self.ident.query_id if self.ident.kind == "stream" else None, self.cluster_id,
                              fail_on_expired=not isinstance(self.options.proof, KafkaProof)
                              or self.options.proof.fail_on_expired)
            # A zombie stands down on what this host's WAL holds, before its producer fences anyone.
            self._follow_early(plan(gather.local()))
            opened = self.mode.open(self.plan.topic_option)
            self._opened = True
            self.producer = opened.producer
            self.ledger = Ledger(self.producer, self.options.scrub)
            self.destinations = TaskDestinations(self.producer, self.options, self._topic_max)
            self.phase = self._follow(self._planned(gather, opened.own_marker, opened.latest_micro_batch))
            self.message = SinkCommitMessage(
                write_id=self.ident.write_id, partition=self.ident.partition, attempt=self.ident.attempt,
                host=wal_attempt.host.name(), wal_path=self.log.path, producer=self.producer.kind)
        except BaseException:
            self._release_after_failed_start()
            raise
        return self

    def _task(self) -> TaskAttempt:
        """This attempt as the resume plan sees it."""
        ident = self.ident
        return TaskAttempt(write_id=ident.write_id, partition=ident.partition, run=ident.run,
                           exactly_once=self.mode.exactly_once, task_attempt_id=ident.task_attempt_id,
                           micro_batch=ident.batch_id if ident.kind == "stream" else None, key=self.log.key,
                           seq=self.log.seq)

    def _planned(self, gather: Gatherer, marker: Marker | None, marker_batch: int | None) -> Plan:
        """The resume plan; while it says to wait for attempts still sending on this host, the WAL is read again every
        ``CHECKPOINT_EVERY_S``, up to the final delivery wait."""
        deadline = self.clock.monotonic() + final_wait_s(self.options)
        waited = False
        reread = True  # the WAL again: opening the mode may have waited, and others may have finished meanwhile
        while True:
            evidence = gather.full(marker, marker_batch, waited_out=self.clock.monotonic() >= deadline,
                                   reread=reread)
            self.priors_found = len(evidence.priors)
            self._evidence = evidence
            found = plan(evidence)
            if not isinstance(found, Wait):
                return found
            if not waited:
                log.info("%s: waiting for %d earlier attempt(s) of this write (%s), still sending from a live "
                         "Python worker on this host, to end", self.where, len(found.attempts),
                         ", ".join(found.attempts))
                waited = True
            self.clock.sleep(CHECKPOINT_EVERY_S)
            reread = True

    def _follow_early(self, early: Plan) -> None:
        if isinstance(early, StandDown):
            raise (InputCutShortError if early.by_retry else StaleAttemptError)(early.reason)

    def _follow(self, found: Plan) -> Phase:
        """Carry out a resume plan: what to skip by, or the stand-down or refusal (nothing sent)."""
        if isinstance(found, StandDown):
            raise (InputCutShortError if found.by_retry else StaleAttemptError)(found.reason)
        assert not isinstance(found, Wait)
        if isinstance(found, Refuse):
            raise RerunRefusedError(found.message)
        if isinstance(found, SkipIfCommitted):
            log.info("%s: %s: the partition is skipped if its input is the one committed (same fingerprint)",
                     self.where, found.reason)
            self.resume = found
            return Phase.SKIPPING
        if found.overdue:
            log.warning("%s: %d earlier attempt(s) of this write still run after %.0f s; going on without knowing "
                        "what Kafka acknowledged to them since: some records may be sent twice", self.where,
                        len(found.overdue), final_wait_s(self.options))
        if found.unproven:
            log.warning("WAL %s: the proof of delivery of %d earlier attempt(s) of write %s is gone (wal.proofMaxBytes "
                        "took this host's copy and the proof topic holds none), so what they delivered is not known "
                        "here and is sent again", self.log.path, len(found.unproven), self.ident.write_id)
        if self._evidence.proof_expired:
            log.warning("%s: the proof topic %s's retention deleted part of write %s's proof of delivery "
                        "(proof.retentionHours), so records earlier runs delivered may be sent again", self.where,
                        self.proof.topic, self.ident.write_id)
        if self.priors_found:
            log.info("%s: found %d earlier attempt(s) of this write (WAL %s%s); sending only what Kafka does not hold",
                     self.where, self.priors_found, self.log.path,
                     f", proof topic {self.proof.topic}" if self.proof.topic else "")
        self.resume = found
        self.delivered = delivered(found.resume, self.log.wal, self.proof)
        if found.claim:
            self.earlier = self._claims(found)
            log.info("%s: a re-run of write %s: %d records that other runs delivered, in any partition, are not sent "
                     "again", self.where, self.ident.write_id, self.earlier.records)
        return Phase.WRITING

    def _claims(self, found: Send) -> Claims:
        proven = delivered(found.claim, self.log.wal, self.proof)
        if not proven or self.ident.run is None:
            return NoClaims()
        if self.proof.topic is not None:  # of the run's partitions on any host, one counts each delivered copy
            return self.proof.claims(proven)
        if self.log.wal is None:
            return NoClaims()
        return WalClaims(self.log.wal, self.ident.write_id, self.ident.run, self.ident.partition, proven)

    def _release_after_failed_start(self) -> None:
        """Nothing was sent: the entry begun is removed, so that no retry waits for it, and the mode let go."""
        self.log.drop()
        if self._opened:
            self.mode.abort()

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
            # Only counted, and fingerprinted: the end checks it is the input the marker's transactions committed.
            self.fingerprint.add(record_digests(normalise(raw, self.plan), self.plan.topic_option, self.cluster_id))
            self.position += raw.num_rows
            self.message.skipped += raw.num_rows
            return
        assert self.phase is Phase.WRITING, f"{self.where}: write() while {self.phase.value}"
        batch = normalise(raw, self.plan)
        first = self.position
        self.position += batch.num_rows
        if not isinstance(self.options.errors, DeadLetterTopic):
            check_batch(batch, self.plan.topic_option, self.where, first, self.destinations)
            self._log_and_send(batch, None)
            return
        refusals = find_refusals(batch, self.plan.topic_option, self.destinations)
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
        for refusal in find_refusals(dead.batch, None, self.destinations):
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
        # Hashed beside the WAL store, unless needed here to match a retry's input (or there is no WAL store).
        if digests is None and (self.delivered or self.earlier or (self.log.key is None and (
                self.mode.exactly_once or self.proof.topic is not None))):
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
                self._pending = _Pending(segment, self.logged, stored, segment_digests)
                self.logged += segment.num_rows

    def _not_delivered(self, digests: list[bytes]) -> list[bool]:
        """Per record, whether it must be sent: neither an earlier attempt of this run nor, on a re-run, another run
        got it delivered."""
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

    def _produce(self, pending: _Pending) -> None:
        digests = pending.digests
        if pending.stored is not None:
            stored = pending.stored.result()
            self.message.wal_bytes += stored.payload
            digests = stored.digests
        self.pacer.wait(pending.batch)
        self.mode.before_send()
        try:
            with _no_collection():
                self.message.published += self.ledger.send(pending.batch, self.plan.topic_option, pending.first)
            if self.proof.topic is not None and digests is not None:
                n = pending.batch.num_rows
                if self.mode.exactly_once:  # inside the transaction: visible with the segment's records or not at all
                    self._send_chunk([ChunkSegment(pending.first, n, b"\x01" * n, digests)], last=False)
                else:
                    self._segment_digests[pending.first] = digests
        except (DeliveryError, RecordError) as exc:
            raise self._located(exc) from None
        end = pending.first + pending.batch.num_rows
        if self.faults is not None:
            self.faults.after_batch(self.ident.write_id, self.ident.partition, self.ident.attempt,
                                    self.message.skipped + end,
                                    lambda: self._checkpoint(wait_s=delivery_timeout_s(self.options)))
        self._since_drain += pending.batch.num_rows
        if self._since_drain >= CHECKPOINT_MAX_RECORDS or \
                self.clock.monotonic() - self._last_checkpoint > CHECKPOINT_EVERY_S:
            # A drain: produce nothing more until the producer's queue is empty, so that what it held is known
            # to be acknowledged or failed. Waiting only a while would let a large backlog (big values) refill
            # the queue before every drain, and no acknowledgement would be learnt until the end.
            self._checkpoint(wait_s=final_wait_s(self.options), sync=False)

    def _located(self, exc: DeliveryError | RecordError) -> DeliveryError | RecordError:
        return type(exc)(f"{self.where}: {self.options.scrub(str(exc))}{self.mode.locate_error(exc)}")

    def _dirty(self) -> Acks:
        """The bitmaps changed since the last save, for the log to persist; at_least_once, what they say Kafka
        acknowledged goes to the proof topic too (a retry on another host then skips it). Delivery callbacks run on
        this (the task's) thread, inside produce/poll/flush: no lock needed."""
        if self.log.key is None and self.proof.topic is None:
            return {}
        changes = self.ledger.take_changes()
        if self.proof.topic is not None and not self.mode.exactly_once and changes:
            self._publish(changes)
        return changes if self.log.key is not None else {}

    def _publish(self, changes: Acks) -> None:
        """One proof chunk for the segments whose acknowledgements changed: their bitmaps and the digests of what they
        say Kafka acknowledged."""
        segments = []
        for first, bitmap in sorted(changes.items()):
            digests = self._segment_digests.get(first)
            if digests is None:
                continue
            acked = bytes(bitmap)
            segments.append(ChunkSegment(first, len(acked), acked, acked_digests(digests, acked)))
            if 0 not in acked:
                del self._segment_digests[first]
        if segments:
            self._send_chunk(segments, last=False)

    def _send_chunk(self, segments: list[ChunkSegment], last: bool) -> None:
        name = attempt_name(self.log.key) if self.log.key is not None else self._anonymous_name
        self.mode.before_send()
        for batch in self.proof.chunk_batches(name, self._chunks, segments, last, self.mode.exactly_once):
            self.ledger.send_proof(batch, self.proof.topic or "")
            self._chunks += batch.num_rows

    @property
    def _anonymous_name(self) -> str:
        """An attempt's name without a WAL entry (wal.enabled=false): its task attempt, unique in its run."""
        return f"nowal-{self.ident.task_attempt_id if self.ident.task_attempt_id is not None else self.ident.attempt}"

    def _checkpoint(self, wait_s: float, sync: bool = True) -> None:
        """Persist what Kafka acknowledged so far; with ``wait_s``, drain: wait up to that long for the rest,
        persisting every ``CHECKPOINT_EVERY_S`` meanwhile (a kill during a long final flush repeats little).
        Without ``sync`` the saves are only queued and the proof chunk this drain publishes is not waited for: a drain
        in mid-partition need not wait for the disk or the proof topic. The next drain's wait covers both, so a kill
        leaves at most two drain windows unproven, on this host and in Kafka alike."""
        deadline = self.clock.monotonic() + wait_s
        while True:
            remaining = deadline - self.clock.monotonic()
            waiting = self.ledger.outstanding or self.ledger.proof_outstanding
            try:
                if remaining > 0 and waiting:
                    self.ledger.wait_for_acks(min(remaining, CHECKPOINT_EVERY_S))
                else:
                    self.ledger.serve()
            except FatalProducerError as exc:
                self.log.save_acks(self._dirty())  # what was served before the producer died still counts
                raise self._located(exc) from None
            self._last_checkpoint = self.clock.monotonic()
            if not self.ledger.outstanding:
                self._since_drain = 0
            self.log.save_acks(self._dirty(), sync)
            if not (self.ledger.outstanding or (sync and self.ledger.proof_outstanding)) or \
                    self.clock.monotonic() >= deadline:
                return
            if self.ledger.failed and not self.ledger.outstanding:
                # A record failed for good (brokers gone, as a rule): the attempt fails, and its last proof chunk
                # would only wait out the delivery timeout once more. A retry repeats what that chunk held.
                return

    # ---- the end ----------------------------------------------------------------------------------------
    def commit(self) -> SinkCommitMessage:
        """Produce the last batch, wait for every acknowledgement, and leave only proof of delivery (under
        exactly_once: commit the transaction with its marker)."""
        message = self._commit_skipped() if self.phase is Phase.SKIPPING else self._commit_written()
        self.phase = Phase.COMMITTED
        return message

    def _undelivered(self) -> DeliveryError:
        """The error of an attempt some of whose records Kafka did not acknowledge."""
        ledger = self.ledger
        problem = ledger.first_error() or f"{ledger.outstanding} records still unacknowledged at the deadline"
        return DeliveryError(
            f"{self.where}: Kafka did not acknowledge {ledger.failed + ledger.outstanding} of "
            f"{ledger.produced} records: {self.options.scrub(problem)}. They stay in WAL "
            f"{self.log.path or '(disabled)'}; re-run the write with "
            f"wal.writeId={self.ident.write_id} to send only those")

    def _commit_skipped(self) -> SinkCommitMessage:
        """A committed transaction holds the partition: nothing was sent. Its input must be the one committed (the
        marker's fingerprint; its count, for a marker without one), or part of the partition would be lost or
        repeated."""
        assert isinstance(self.resume, SkipIfCommitted)
        self.mode.finish(None)
        refusal = judge_skipped(self._task(), self.resume.marker, self.fingerprint, self.position, self.log.path,
                                self._evidence.proof_expired)
        if refusal is not None:
            raise RerunRefusedError(refusal.message)
        self.log.apply(finishing(self._task(), self._evidence.priors, self.resume, sent=False))
        self._report_proof(self.message)
        self.message.received = self.position
        self.message.committed_before = True
        self.message.offsets_complete = False  # an earlier attempt's transaction wrote them, this one knows not where
        self.message.seconds = self.clock.monotonic() - self.started
        return self.message

    def _commit_written(self) -> SinkCommitMessage:
        if self.ledger.failed:
            # Every batch reached the WAL (logged: replay may send it), but librdkafka gave a record up: hand over
            # nothing more, since each further drain could wait out the delivery timeout again.
            self.log.mark_logged(self._dirty())
            raise self._undelivered()
        self._produce_pending()
        self.log.mark_logged(self._dirty())
        self._release_older()
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
        resume = self.resume
        assert isinstance(resume, Send)
        if self.ident.retry and not resume.resume and not self.mode.exactly_once:
            message.unproven = message.published  # a retry with nothing to skip by: some may be repeats
        names = [h.name for h in resume.holders]
        if self.log.key is not None:
            names.append(attempt_name(self.log.key))
        marker = Marker(write_id=self.ident.write_id, partition=self.ident.partition, topic=self.marker_topic,
                        records=resume.committed_records + ledger.acked, attempts=tuple(names), run=self.ident.run,
                        fingerprint=self.fingerprint, wal=self.log.path) if self.marker_topic is not None else None
        produced = ledger.produced > 0
        if self.proof.topic is not None:
            if not self.mode.exactly_once:
                self._send_chunk([], last=True)  # its last checkpoint: everything it logged is acknowledged
            elif marker is not None and produced:
                self.mode.before_send()
                self.ledger.send_proof(self.proof.marker_batch(marker), self.proof.topic)
            self._checkpoint(wait_s=final_wait_s(self.options))
            unwritten = ledger.proof_failure()
            if unwritten is None and ledger.proof_outstanding:
                unwritten = f"{ledger.proof_outstanding} proof records unacknowledged at the deadline"
            if unwritten is not None:
                raise DeliveryError(f"{self.where}: its proof of delivery could not be written to the proof topic "
                                    f"{self.proof.topic} ({self.options.scrub(unwritten)}), so a retry or re-run on "
                                    "another host could not tell what this attempt delivered; check that this "
                                    "principal may WRITE it (or set proof.kafka=false)")
        sent = self.mode.finish(Commit(marker=marker, produced=produced))
        if self.proof.topic is not None and (sent or not self.mode.exactly_once):
            self.log.publish()
        if self.mode.exactly_once and (resume.holders or self.earlier):
            message.committed_before = True
            log.info("%s: earlier transactions committed %d records of this partition's input; this one sent the "
                     "%d they lacked%s", self.where, message.skipped, ledger.acked,
                     f" ({message.diverged} committed earlier are no longer in the input)" if message.diverged else "")
        self.log.apply(finishing(self._task(), self._evidence.priors, resume, sent))
        self._report_proof(message)
        message.seconds = self.clock.monotonic() - self.started
        if self.priors_found and not self.mode.exactly_once:
            log.info("%s: done after earlier attempts: %d records, %d sent, %d skipped as already delivered, "
                     "%d re-sent that were logged but unacknowledged, %d delivered earlier but not recomputed",
                     self.where, message.received, message.published, message.skipped, message.replayed,
                     message.diverged)
        return message

    def _release_older(self) -> None:
        """A micro-batch's task releases its partition's proof of the query's earlier micro-batches (Spark started
        this one only once they were in the query's commit log): tombstones, in this attempt's transaction under
        exactly_once."""
        older = self.proof.older_keys(self.ident.partition)
        if older and self.proof.topic is not None:
            self.mode.before_send()
            self.ledger.send_proof(pa.RecordBatch.from_pydict({
                "key": pa.array(older, pa.binary()), "value": pa.nulls(len(older), pa.binary()),
                "partition": pa.array([self.proof.partition] * len(older), pa.int32())}), self.proof.topic)

    def _report_proof(self, message: SinkCommitMessage) -> None:
        """What the driver's release of the write needs to know of the proof topic."""
        if self.proof.topic is None:
            return
        message.proof_topic = self.proof.topic
        message.proof_partition = self.proof.partition
        lows = [o for o in (self.ledger.proof_low, self.proof.low()) if o is not None]
        message.proof_low = min(lows) if lows else None
        name = attempt_name(self.log.key) if self.log.key is not None else self._anonymous_name
        chunks = [(name, self.ident.run or "-", self.mode.exactly_once, self._chunks)] if self._chunks else []
        message.proof_chunks = (*chunks, *self.proof.chunks_known(self.ident.partition))
        message.proof_read_records, message.proof_read_bytes, message.proof_read_seconds = self.proof.read_cost()

    def abort(self) -> None:
        """After a failure: give records already handed over their chance to be acknowledged and persist what
        was, so a retry skips them; then release the producer so no stale delivery reaches the next task."""
        try:
            for acks in self.log.settle():
                self.ledger.give_back(acks)
            # at_least_once: what Kafka acknowledged stays delivered, so its last proof chunk is worth the wait too (a
            # retry on another host skips by it).
            waiting = self.mode.waits_on_abort and (self.ledger.outstanding or self.ledger.proof_outstanding)
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
            self.mode.abort()


def _segments(batch: pa.RecordBatch, digests: bytes | None) -> Iterator[tuple[pa.RecordBatch, bytes | None]]:
    """The batch in WAL segments of about ``SEGMENT_MAX_BYTES`` and at most ``CHECKPOINT_MAX_RECORDS`` records: slices
    of equal row counts, so a batch of uneven records may give a segment above the bytes."""
    if batch.nbytes <= SEGMENT_MAX_BYTES and batch.num_rows <= CHECKPOINT_MAX_RECORDS:
        yield batch, digests
        return
    rows = max(1, batch.num_rows * SEGMENT_MAX_BYTES // max(1, batch.nbytes))
    yield from slices(batch, digests, min(rows, CHECKPOINT_MAX_RECORDS))


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
