"""One Spark task's write (executor): earlier attempts -> WAL -> produce -> acknowledgements -> proof.

Shared by the batch and the streaming writer; only the identity differs (write id vs query/batch id).
:class:`PartitionWriter` needs no Spark: a test drives it with plain Arrow batches.

The protocol, per (write id, partition):
1. A new attempt reads what earlier attempts on this host logged: the digests of the records Kafka
   acknowledged to them (see :mod:`recoverable_sink.identity`).
2. Each input batch is normalised and checked; records whose digest matches an acknowledged one are skipped
   (as a multiset), the rest are logged to the WAL (fsynced, with their digests) before the producer sees them.
3. Delivery callbacks fill per-segment bitmaps, checkpointed with every WAL transaction and on a short timer;
   a fully acknowledged segment keeps only its digests.
4. Once the whole partition is logged the attempt is ``logged``; once Kafka acknowledged everything it is
   ``done`` and keeps only digests, as proof of delivery until the write is certainly committed.
"""

from __future__ import annotations

import gc
import socket
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass

import pyarrow as pa

from recoverable_sink._faults import FaultPlan
from recoverable_sink._logging import get_logger
from recoverable_sink.contract import SinkCommitMessage, TaskIdentity
from recoverable_sink.delivery import (
    DeliveryTracker,
    NativeProducer,
    SinkProducer,
    delivery_timeout_s,
    partition_count,
    producers,
    send_batch,
    serve,
    wait_for_acks,
)
from recoverable_sink.errors import DeliveryError, FatalProducerError, InputCutShortError, RecordError
from recoverable_sink.identity import DeliveredSet, record_digests, split
from recoverable_sink.options import SinkOptions
from recoverable_sink.records import TOPIC_BATCH_FRAMING, SchemaPlan, check_batch, normalise
from recoverable_sink.spark_input import InputEnd
from recoverable_sink.transactions import PartitionTransaction
from recoverable_sink.wal import LOGGED, AttemptInfo, Wal, open_wal, sweep_now_and_then

log = get_logger("task")

_FLUSH_MARGIN_S = 30.0  # past librdkafka's own delivery timeout, which reports every undelivered record


def _final_wait_s(options: SinkOptions) -> float:
    timeout = delivery_timeout_s(options)
    return timeout + min(_FLUSH_MARGIN_S, max(1.0, timeout))


# A drain this often: acknowledgements reach the WAL, so a hard kill repeats little. Draining every 0.1 s rather
# than 0.5 made whole writes faster in Spark (bench.ab, two tasks sharing 2 cores with the JVM and the broker:
# 100 B 7-9%, 1 KB 7%, 10 KB 15%) although one producer alone gains nothing from it: fewer records are
# outstanding in librdkafka at any time. Once a drain no longer waited out librdkafka's 10 ms poll slice
# (_produce.c, flush_finely), every 0.05 s was faster again (100 B on four partitions: 0.98-1.00x Spark's sink
# in four sessions against 0.85-0.97x at 0.1 s; every 0.025 s 0.93-0.98x).
_CHECKPOINT_EVERY_S = 0.05

_threads: dict[str, ThreadPoolExecutor] = {}


def _thread(name: str) -> ThreadPoolExecutor:
    """One of the process's helper threads: "wal" writes the WAL, "hash" hashes digests (Python workers are
    reused across tasks, so are the threads)."""
    if name not in _threads:
        _threads[name] = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"recoverable-sink-{name}")
    return _threads[name]


class _Partitions:
    """Partition counts of the topics a batch names, from the cluster's metadata, asked once per topic."""

    def __init__(self, producer: SinkProducer, where: str) -> None:
        self.producer = producer
        self.where = where
        self.counts: dict[str, int] = {}

    def __call__(self, topic: str) -> int:
        if topic not in self.counts:
            count, reason = partition_count(self.producer, topic, 30)
            if reason is not None:
                raise RecordError(f"{self.where}: topic {topic} does not exist or is not accessible ({reason}); "
                                  "create it first (the sink does not rely on broker auto-creation)")
            self.counts[topic] = count
        return self.counts[topic]


def _size_limit(options: SinkOptions) -> tuple[int, str]:
    """The largest record (as records.check_batch sizes it) the producer and, uncompressed, the topic accept."""
    conf = options.producer_config()
    limit = int(conf.get("message.max.bytes", 1_000_000))
    name = f"the producer's message.max.bytes={limit}"
    topic_max = options.topic_max_message_bytes
    compressed = conf.get("compression.type", conf.get("compression.codec", "none")) != "none"
    if topic_max is not None and not compressed and topic_max - TOPIC_BATCH_FRAMING < limit:
        limit = topic_max - TOPIC_BATCH_FRAMING
        name = (f"{limit} bytes (topic {options.topic}'s max.message.bytes={topic_max}, less {TOPIC_BATCH_FRAMING} "
                "of batch framing)")
    return limit, name


@dataclass(frozen=True)
class _Pending:
    """A batch on its way: logged (or being logged) to the WAL, not yet handed to the producer."""

    batch: pa.RecordBatch
    first: int
    stored: Future[int] | None


class PartitionWriter:
    """Writes one partition: ``write(batch)`` for each Arrow batch, then ``commit()`` (returns the commit
    message) or, on any failure, ``abort()``. Shaped like Spark's ``KafkaDataWriter`` and Flink's
    ``SinkWriter``; the Spark writers call :func:`write_partition`.

    One batch ahead: the fsynced WAL commit of batch k+1 runs on a thread while batch k is produced (LMDB
    and Arrow release the GIL); batch k+1 is produced only after its own commit returned, and once a WAL
    write failed no later batch enters the log."""

    def __init__(self, options: SinkOptions, plan: SchemaPlan, ident: TaskIdentity, cluster_id: str,
                 faults: FaultPlan | None = None, producer: SinkProducer | None = None) -> None:
        self.options = options
        self.plan = plan
        self.ident = ident
        self.cluster_id = cluster_id
        self.faults = faults
        self.where = ident.where
        self.started = time.monotonic()
        _freeze_heap_once()
        # exactly_once: this partition's own transactional producer; open() fences every earlier attempt, on
        # any host, and says whether one of them already committed the partition (then nothing is sent).
        self.txn: PartitionTransaction | None = None
        self.committed_before = False
        self.committed: list[AttemptInfo] = []  # exactly_once: the attempts whose transactions hold records
        if options.exactly_once:
            self.txn = PartitionTransaction(options, ident.write_id, ident.partition, self.where,
                                           ident.transaction_scope)
            self.committed_before = self.txn.open(plan.topic_option)
            assert self.txn.producer is not None
            self.producer = self.txn.producer
        else:
            self.producer = producer if producer is not None else producers.get(options)
        try:
            self._prepare(options, plan, ident, cluster_id)
        except BaseException:
            if self.txn is not None:  # no transaction of this attempt stays open behind a failed start
                self.txn.abort()
            raise

    def _prepare(self, options: SinkOptions, plan: SchemaPlan, ident: TaskIdentity, cluster_id: str) -> None:
        """The rest of the start, once the producer is there: the WAL, earlier attempts, this attempt's log."""
        self.max_message, self.max_message_name = _size_limit(options)
        self.partitions = _Partitions(self.producer, self.where)
        self.tracker = DeliveryTracker()
        self.producer.tracker = self.tracker  # its failure reports come here
        self.position = 0  # records read from Spark
        self.logged = 0  # records handed to the WAL (the ones this attempt must send)
        self._pending: _Pending | None = None
        self._last_store: Future[int] | None = None
        self._last_wal_job: Future[object] | None = None  # the newest store or acknowledgement save queued
        self._wal_failed: BaseException | None = None
        self._save_failed: BaseException | None = None
        # Bitmaps taken from the tracker whose write failed (a refused batch carries them too): the tracker forgets
        # a fully acknowledged segment once its bitmap is taken, so abort gives them back to be saved again.
        self._unsaved: list[dict[int, bytearray]] = []
        self._last_checkpoint = time.monotonic()
        self.wal: Wal | None = open_wal(options.resolved_wal_path()) if options.wal_enabled else None
        self.priors: list[AttemptInfo] = []
        self.delivered = DeliveredSet()
        self.attempt_key: str | None = None
        self.marker_topic = plan.topic_option
        if self.wal is not None:
            sweep_now_and_then(self.wal, options.retention_seconds)
            self.priors = self.wal.prior_attempts(ident.write_id, ident.partition)
            if not options.exactly_once:
                self.delivered = self.wal.delivered(self.priors)
            elif self.committed_before:
                self._resume_after_committed()
            if not self.committed_before:
                self.attempt_key = self.wal.begin_attempt(
                    ident.write_id, ident.partition, ident.attempt,
                    {**ident.extra, "kind": ident.kind, "topic": plan.topic_option, "cluster_id": cluster_id,
                     "guarantee": options.guarantee})
            if self.priors:
                log.info("%s: found %d earlier attempt(s) in WAL %s; sending only what Kafka never acknowledged",
                         self.where, len(self.priors), self.wal.path)
        native = isinstance(self.producer, NativeProducer)
        self.message = SinkCommitMessage(write_id=ident.write_id, partition=ident.partition, attempt=ident.attempt,
                                         host=socket.gethostname(), wal_path=self.wal.path if self.wal else None,
                                         producer="native" if native else "confluent")

    def _resume_after_committed(self) -> None:
        """exactly_once, a marker found: under transactions an earlier attempt's records count only if its
        transaction committed, which the marker tells. If this WAL holds the digests of every attempt the
        marker names, open a transaction for whatever of the recomputed partition they lack (nothing, unless an
        earlier input was cut short); otherwise stay ``committed_before`` and only check the count at the end."""
        assert self.txn is not None and self.wal is not None
        names = self.txn.committed_attempts
        by_name = {_attempt_name(p.key): p for p in self.priors}
        if not names or any(n not in by_name for n in names):
            return
        committed = [by_name[n] for n in names]
        delivered = self.wal.delivered(committed, all_acknowledged=True)
        if sum(delivered.acked.values()) != self.txn.committed_records:
            # Digests missing here (an attempt purged or swept meanwhile) would make records go out twice.
            log.warning("%s: this WAL's digests of the committed attempts do not add up to the marker's %d records; "
                        "not resuming from them", self.where, self.txn.committed_records)
            return
        self.committed, self.delivered = committed, delivered
        self.txn.begin()
        self.committed_before = False

    # ---- the data path ---------------------------------------------------------------------------------
    def write(self, raw: pa.RecordBatch) -> None:
        """Check one batch, log what must be sent, and produce the batch before it."""
        if raw.num_rows == 0:
            return
        if self.committed_before:  # an earlier attempt's transaction holds this partition already
            self.position += raw.num_rows
            self.message.skipped += raw.num_rows
            return
        batch = normalise(raw, self.plan)
        check_batch(batch, self.plan.topic_option, self.where, self.position, self.max_message, self.partitions,
                    self.max_message_name)
        self.position += batch.num_rows
        if self.marker_topic is None:
            self.marker_topic = batch.column("topic")[0].as_py()
        if self.wal is not None:
            digests: bytes | None = None  # computed on the WAL thread, unless needed here to match a retry's input
            if self.delivered:
                digests = record_digests(batch, self.plan.topic_option, self.cluster_id)
                match = self.delivered.take(split(digests))
                self.message.replayed += match.replayed
                sent = [not s for s in match.skip]
                if not all(sent):
                    self.message.skipped += batch.num_rows - sum(sent)
                    mask = pa.array(sent)
                    batch = batch.filter(mask)
                    digests = b"".join(d for d, keep in zip(split(digests), sent, strict=True) if keep)
            stored = self._log(batch, digests) if batch.num_rows else None
        else:
            stored = None
        if batch.num_rows == 0:
            return
        if self._pending is not None:
            self._produce(self._pending)
        self._pending = _Pending(batch, self.logged, stored)
        self.logged += batch.num_rows

    def _produce_pending(self) -> None:
        if self._pending is not None:
            self._produce(self._pending)
            self._pending = None

    def _log(self, batch: pa.RecordBatch, digests: bytes | None) -> Future[int]:
        assert self.wal is not None and self.attempt_key is not None
        wal, key, first = self.wal, self.attempt_key, self.logged
        acks = self._take_dirty()
        # Three stages at once, each mostly without the GIL: this batch's digests are hashed on their own thread
        # (identity.record_digests) while the WAL thread may still store the batch before, which the task thread
        # produces as soon as that commit returned, while this one is stored. Hashing on the WAL thread instead
        # made large records wait for hash and fsync in series (10 KB values: 0.69x Spark's sink against 0.79x
        # so, in two make bench runs of that shape back to back).
        hashed = _thread("hash").submit(record_digests, batch, self.plan.topic_option, self.cluster_id) \
            if digests is None else None

        def store() -> int:
            try:
                if self._wal_failed is not None:  # a refused batch lets no later batch into the log
                    raise self._wal_failed
                ids = digests if hashed is None else hashed.result()
                return wal.append(key, first, batch, ids, self.options.wal_max_bytes, acks)
            except BaseException as exc:
                self._wal_failed = self._wal_failed or exc
                if acks:
                    self._unsaved.append(acks)
                raise

        self._last_store = self._last_wal_job = _thread("wal").submit(store)
        return self._last_store

    def _produce(self, pending: _Pending) -> None:
        if pending.stored is not None:
            self.message.wal_bytes += pending.stored.result()
        if self.txn is not None:
            self.txn.sending()
        try:
            with _no_collection():
                self.message.published += send_batch(self.producer, pending.batch, self.plan.topic_option,
                                                     pending.first, None, self.tracker, self.options.scrub)
        except (DeliveryError, RecordError) as exc:
            raise self._located(exc) from None
        end = pending.first + pending.batch.num_rows
        if self.faults is not None:
            self.faults.after_batch(self.ident.write_id, self.ident.partition, self.ident.attempt,
                                    self.message.skipped + end,
                                    lambda: self._checkpoint(wait_s=delivery_timeout_s(self.options)))
        if time.monotonic() - self._last_checkpoint > _CHECKPOINT_EVERY_S:
            # A drain: produce nothing more until the producer's queue is empty, so that what it held is known
            # to be acknowledged or failed. Waiting only a while would let a large backlog (big values) refill
            # the queue before every drain, and no acknowledgement would be learnt until the end.
            self._checkpoint(wait_s=_final_wait_s(self.options), sync=False)

    def _located(self, exc: DeliveryError | RecordError) -> DeliveryError | RecordError:
        hint = ""
        if self.txn is not None and isinstance(exc, FatalProducerError):
            timed_out = self.txn.timed_out()
            hint = (f"; {timed_out.strip()}" if timed_out else
                    "; under exactly_once this most often means another attempt of this partition (a retry or "
                    "a speculative copy) fenced this one: its transaction is aborted and the other attempt's "
                    "data is the one that counts")
        return type(exc)(f"{self.where}: {self.options.scrub(str(exc))}{hint}")

    def _take_dirty(self) -> dict[int, bytearray]:
        # Delivery callbacks run on this (the task's) thread, inside produce/poll/flush: no lock needed.
        return self.tracker.take_dirty()

    def _save_acks(self, sync: bool = True) -> None:
        """Persist the bitmaps changed since the last save. They are queued on the WAL's one thread behind the
        stores, so a segment's bitmap is never written before the segment, nor an older bitmap after a newer
        one; with ``sync``, return once every queued WAL write is done (raising a failed save's error)."""
        if self.wal is None or self.attempt_key is None:
            return
        acks = self._take_dirty()
        if acks:
            wal, key = self.wal, self.attempt_key

            def save() -> None:
                try:
                    wal.save_acks(key, acks)
                except BaseException as exc:
                    self._save_failed = exc
                    self._wal_failed = self._wal_failed or exc  # no later batch enters the log either
                    self._unsaved.append(acks)
                    raise

            self._last_wal_job = _thread("wal").submit(save)
        if sync:
            self._wait_for_wal()

    def _wait_for_wal(self) -> None:
        """Return once every queued WAL write is done, raising a failed save's error (a failed store is reported
        where its batch is produced)."""
        if self._last_wal_job is not None:
            wait([self._last_wal_job])
        if self._save_failed is not None:
            raise self._save_failed

    def _checkpoint(self, wait_s: float, sync: bool = True) -> None:
        """Persist what Kafka acknowledged so far; with ``wait_s``, drain: wait up to that long for the rest,
        persisting every ``_CHECKPOINT_EVERY_S`` meanwhile (a kill during a long final flush repeats little).
        Without ``sync`` the saves are only queued: a drain in mid-partition need not wait for the disk."""
        deadline = time.monotonic() + wait_s
        while True:
            remaining = deadline - time.monotonic()
            try:
                if remaining > 0 and self.tracker.outstanding:
                    wait_for_acks(self.producer, self.tracker, min(remaining, _CHECKPOINT_EVERY_S))
                else:
                    serve(self.producer, self.tracker)
            except FatalProducerError as exc:
                self._save_acks()  # the acknowledgements served before the producer died still count
                raise self._located(exc) from None
            self._last_checkpoint = time.monotonic()
            self._save_acks(sync)
            if not self.tracker.outstanding or time.monotonic() >= deadline:
                return

    # ---- the end --------------------------------------------------------------------------------------
    def commit(self) -> SinkCommitMessage:
        """Produce the last batch, wait for every acknowledgement, and leave only proof of delivery (under
        exactly_once: commit the transaction with its marker)."""
        message = self._commit()
        self.producer.tracker = None  # done: the pooled producer keeps no reference to this task's batches
        return message

    def _commit(self) -> SinkCommitMessage:
        if self.committed_before:
            return self._already_committed()
        self._produce_pending()
        if self.wal is not None and self.attempt_key is not None:
            if self._last_store is not None:
                self._last_store.result()
            self._wait_for_wal()  # the queued saves land first; the bitmaps since go with the state
            acks = self._take_dirty()
            try:
                self.wal.set_state(self.attempt_key, LOGGED, acks)
            except BaseException:
                self._unsaved.append(acks)
                raise
        self._checkpoint(wait_s=_final_wait_s(self.options))
        tracker = self.tracker
        if tracker.failed or tracker.outstanding:
            problem = tracker.first_error() or f"{tracker.outstanding} records still unacknowledged at the deadline"
            raise DeliveryError(
                f"{self.where}: Kafka did not acknowledge {tracker.failed + tracker.outstanding} of "
                f"{tracker.produced} records: {self.options.scrub(problem)}. They stay in WAL "
                f"{self.wal.path if self.wal else '(disabled)'}; re-run the write with "
                f"wal.writeId={self.ident.write_id} to send only those"
            )
        message = self.message
        message.received = self.position
        message.acknowledged = tracker.acked
        message.diverged = self.delivered.left_over()
        if self.txn is None and self.ident.retry and not self.priors:
            message.unproven = message.published  # a retry with nothing to skip by: some may be repeats
        if self.txn is not None:
            self._commit_transaction(message)
        elif self.wal is not None and self.attempt_key is not None:
            self.wal.finish(self.attempt_key, [p.key for p in self.priors])
        message.seconds = time.monotonic() - self.started
        if self.priors:
            log.info("%s: done after earlier attempts: %d records, %d sent, %d skipped as already delivered, "
                     "%d re-sent that were logged but unacknowledged, %d delivered earlier but not recomputed",
                     self.where, message.received, message.published, message.skipped, message.replayed,
                     message.diverged)
        return message

    def _commit_transaction(self, message: SinkCommitMessage) -> None:
        """exactly_once: commit what this attempt sent with the marker, which then names every attempt whose
        transaction holds records of the partition. Their WAL digests stay as proof (released like
        at_least_once's); attempts whose transactions did not commit are dropped."""
        assert self.txn is not None
        tracker = self.tracker
        holders = list(self.committed)
        # Between here and commit_transaction's return a kill leaves the outcome to the next attempt's
        # init_transactions (it completes a commit under way, or aborts) and its marker read.
        if self.marker_topic is not None and tracker.produced:
            names = [_attempt_name(a.key) for a in holders]
            if self.attempt_key is not None:
                names.append(_attempt_name(self.attempt_key))
            self.txn.commit(self.marker_topic, self.txn.committed_records + tracker.acked,
                            _final_wait_s(self.options), names, self.wal.path if self.wal else None)
            self.txn.close()
            sent = True
        else:
            self.txn.abort()  # nothing was sent: no transaction, no new marker
            sent = False
        if holders:
            message.committed_before = True
            log.info("%s: earlier attempts committed %d records of this partition; this one sent the %d they "
                     "lacked%s", self.where, self.txn.committed_records, tracker.acked,
                     f" ({message.diverged} committed earlier are no longer in the input)" if message.diverged else "")
        if self.wal is None or self.attempt_key is None:
            return
        kept = {a.key for a in holders}
        dropped = [p.key for p in self.priors if p.key not in kept]
        if sent:
            self.wal.finish(self.attempt_key, [], dropped=dropped)
        else:
            self.wal.purge([self.attempt_key, *dropped])

    def _already_committed(self) -> SinkCommitMessage:
        assert self.txn is not None
        self.txn.close()
        committed = (self.txn.marker or {}).get("records")
        if isinstance(committed, int) and committed != self.position:
            # Seen in the fault campaign: a task reading a shuffle whose upstream fetch failed saw its input end
            # early, committed that part, and only then failed in the JVM. Skipping the partition would lose the
            # rest, and without per-record proof this attempt cannot tell which records those are.
            marker = self.txn.marker or {}
            proof = (f"; the digests that tell which records those are stay in WAL {marker.get('wal')} on host "
                     f"{marker.get('host')}, and a retry there sends exactly the rest") if marker.get("wal") else ""
            here = f"this host's WAL {self.wal.path} lacks their digests" if self.wal else "the WAL is disabled"
            raise DeliveryError(
                f"{self.where}: earlier attempts committed {committed} records of this partition in their "
                f"transactions, but the partition now has {self.position}: an earlier input was cut short "
                f"(an upstream failure, e.g. a shuffle fetch) or the input changed, and {here}{proof}. Not "
                "skipping the partition, which could lose records, nor re-sending it, which could repeat them: re-run "
                "the write "
                "with the same wal.writeId where that WAL is, or under a new wal.writeId (Kafka then holds the "
                "committed records twice)")
        if self.wal is not None and self.priors:
            self.wal.purge([p.key for p in self.priors])  # whatever they logged is in Kafka
        self.message.received = self.position
        self.message.committed_before = True
        self.message.seconds = time.monotonic() - self.started
        return self.message

    def abort(self) -> None:
        """After a failure: give records already handed over their chance to be acknowledged and persist what
        was, so a retry skips them; then drop the producer so no stale delivery reaches the next task."""
        try:
            if self._last_wal_job is not None:
                wait([self._last_wal_job])  # its outcome does not matter here; LMDB commits whole or not at all
            # A failed write's error is the task's (already raised); its bitmaps go out again with the rest,
            # newest first, so that a segment in two of them comes back with its later bitmap.
            self._save_failed = None
            for acks in reversed(self._unsaved):
                self.tracker.restore(acks)
            self._unsaved.clear()
            # Under exactly_once the transaction is aborted whatever was acknowledged: nothing to wait for.
            waiting = self.tracker.outstanding and self.txn is None
            self._checkpoint(wait_s=min(delivery_timeout_s(self.options), 60.0) if waiting else 0)
        except Exception as secondary:  # noqa: BLE001 - the original error is the one to report
            log.warning("%s: could not checkpoint acknowledgements after the failure: %s", self.where,
                        self.options.scrub(str(secondary)))
        finally:
            self.producer.tracker = None
            if self.txn is not None:
                self.txn.abort()  # the records stay in the WAL; a re-run under the same id sends them
            else:
                producers.discard(self.options)


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
    cycles, yet their header tuples and lists would trigger collections that scan them all (2/3 of the
    time of a batch with headers). Whatever cycles appear meanwhile are collected once it is re-enabled."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _attempt_name(attempt_key: str) -> str:
    """An attempt key without its write id and partition (unique on its own: time, attempt and a random part)."""
    return attempt_key.rsplit("/", 1)[-1]


def write_partition(batches: Iterable[pa.RecordBatch], options: SinkOptions, plan: SchemaPlan,
                    ident: TaskIdentity, cluster_id: str,
                    on_start: Callable[[PartitionWriter], None] | None = None,
                    input_end: Callable[[], InputEnd] = lambda: InputEnd.UNKNOWN) -> SinkCommitMessage:
    """Write one partition through a :class:`PartitionWriter`: commit once the input ended normally, abort on any
    failure. ``input_end`` says how the input ended (:func:`recoverable_sink.spark_input.how_input_ended` in a
    Spark task): a cut-short input is a failure, so that no part of a partition is ever committed or marked
    fully logged."""
    writer = PartitionWriter(options, plan, ident, cluster_id, options.faults)
    if on_start is not None:
        on_start(writer)
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
