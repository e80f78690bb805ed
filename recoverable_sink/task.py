"""One Spark task's write (executor): earlier attempts -> WAL -> produce -> acknowledgements -> purge.

Shared by the batch and the streaming writer; only the WAL identity differs (write id vs query/batch id).
"""

from __future__ import annotations

import os
import signal
import socket
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import Producer
from pyspark.sql.datasource import WriterCommitMessage

from recoverable_sink._logging import get_logger
from recoverable_sink.delivery import (
    DeliveryTracker,
    delivery_timeout_s,
    discard_producer,
    get_producer,
    produce,
    wait_for_acks,
)
from recoverable_sink.errors import DeliveryError, RecordError
from recoverable_sink.options import SinkOptions
from recoverable_sink.records import (
    KafkaRecords,
    SchemaPlan,
    check_batch,
    equal_by_position,
    header_key_problem,
    normalise,
    to_records,
)
from recoverable_sink.wal import AttemptInfo, Segment, Wal, open_wal

log = get_logger("task")

_FLUSH_MARGIN_S = 30.0


@dataclass
class TaskIdentity:
    """Who is writing: the WAL identity is (write id, partition, attempt)."""

    write_id: str
    partition: int
    attempt: int
    extra: dict[str, object] = field(default_factory=dict)


@dataclass
class SinkCommitMessage(WriterCommitMessage):
    """What one task reports to the driver's ``commit``."""

    write_id: str
    partition: int
    attempt: int
    host: str
    wal_path: str | None
    received: int = 0  # records in the partition
    published: int = 0  # handed to the producer by this attempt
    acknowledged: int = 0  # acknowledged by Kafka to this attempt
    skipped: int = 0  # not re-sent: an earlier attempt got the same record acknowledged
    replayed: int = 0  # re-sent: an earlier attempt accepted it but never got it acknowledged
    diverged: int = 0  # an earlier attempt's acknowledged record differs from the recomputed one; sent
    wal_bytes: int = 0
    seconds: float = 0.0


class _PriorCursor:
    """Walks one earlier attempt's segments in position order, decoding each once."""

    def __init__(self, wal: Wal, info: AttemptInfo) -> None:
        self.info = info
        self._segments: Iterator[Segment] = wal.segments(info.key)
        self._current: Segment | None = next(self._segments, None)

    def overlapping(self, first: int, end: int) -> Iterator[Segment]:
        while self._current is not None and self._current.end <= first:
            self._current = next(self._segments, None)
        seg = self._current
        while seg is not None and seg.first < end:
            yield seg
            if seg.end > end:
                return
            seg = self._current = next(self._segments, None)


class ReplayPlan:
    """Decides, position by position, what earlier attempts of the same partition already delivered."""

    def __init__(self, wal: Wal, priors: list[AttemptInfo]) -> None:
        self.cursors = [_PriorCursor(wal, p) for p in priors]

    def mask(self, first: int, batch: pa.RecordBatch) -> tuple[list[bool] | None, int, int]:
        """(skip mask or None, replayed, diverged) for records at positions [first, first + n)."""
        if not self.cursors:
            return None, 0, 0
        n = batch.num_rows
        skip = [False] * n
        seen = [False] * n
        differs = [False] * n
        for cursor in self.cursors:
            for seg in cursor.overlapping(first, first + n):
                lo, hi = max(first, seg.first), min(first + n, seg.end)
                equal = equal_by_position(seg.batch.slice(lo - seg.first, hi - lo),
                                          batch.slice(lo - first, hi - lo))
                for j in range(hi - lo):
                    i = lo - first + j
                    seen[i] = True
                    if seg.acked[lo - seg.first + j]:
                        if equal[j]:
                            skip[i] = True
                        else:
                            differs[i] = True
        diverged = sum(1 for i in range(n) if differs[i] and not skip[i])
        replayed = sum(1 for i in range(n) if seen[i] and not skip[i] and not differs[i])
        return skip, replayed, diverged


class _PartitionCheck:
    """Checks explicit partitions and topic columns against the cluster's metadata, once per topic."""

    def __init__(self, producer: Producer, where: str) -> None:
        self.producer = producer
        self.where = where
        self.counts: dict[str, int] = {}

    def partition_count(self, topic: str) -> int:
        if topic not in self.counts:
            meta = self.producer.list_topics(topic, timeout=30).topics.get(topic)
            if meta is None or meta.error is not None:
                reason = meta.error.str() if meta is not None and meta.error is not None else "no metadata"
                raise RecordError(f"{self.where}: topic {topic} does not exist or is not accessible ({reason}); "
                                  "create it first (the sink does not rely on broker auto-creation)")
            self.counts[topic] = len(meta.partitions)
        return self.counts[topic]

    def check(self, batch: pa.RecordBatch, topic: str | None, first: int) -> None:
        names = batch.schema.names
        topics = batch.column("topic") if "topic" in names else None
        distinct = [topic] if topics is None else pc.unique(topics).to_pylist()
        for t in distinct:
            count = self.partition_count(t)
            if "partition" not in names:
                continue
            parts = batch.column("partition")
            mask = pc.greater_equal(parts, count)
            if topics is not None:
                mask = pc.and_(mask, pc.equal(topics, t))
            if pc.any(mask).as_py():
                row = pc.index(mask, True).as_py()
                raise RecordError(
                    f"{self.where}, record {first + row}: partition {parts[row].as_py()} is out of range for topic "
                    f"{t}, which has {count} partitions (0..{count - 1}); fix the partition column or drop it"
                )


_wal_threads: list[ThreadPoolExecutor] = []


def _wal_thread() -> ThreadPoolExecutor:
    """The process's WAL writer thread (Python workers are reused across tasks, so is the thread)."""
    if not _wal_threads:
        _wal_threads.append(ThreadPoolExecutor(max_workers=1, thread_name_prefix="recoverable-sink-wal"))
    return _wal_threads[0]


def _wait_and_checkpoint(producer: Producer, tracker: DeliveryTracker, wal: Wal | None, attempt_key: str | None,
                         timeout_s: float) -> None:
    wait_for_acks(producer, tracker, timeout_s)
    if wal is not None and attempt_key is not None:
        wal.save_acks(attempt_key, tracker.take_dirty())


def _fault_hooks(options: SinkOptions, ident: TaskIdentity, position: int, where: str,
                 checkpoint: Callable[[], None]) -> None:
    """Fault injection for tests and the chaos campaign (``test.*`` options), at a known point: once the
    records produced so far are acknowledged and checkpointed."""
    if options.kill_after_records is not None and ident.attempt == 0 and position >= options.kill_after_records:
        checkpoint()
        log.warning("%s: test.killAfterRecords reached at %d records; killing this worker", where, position)
        os.kill(os.getpid(), signal.SIGKILL)
    marker = options.pause_file
    if options.pause_after_records is not None and marker and position >= options.pause_after_records \
            and not os.path.exists(marker):
        checkpoint()
        # The marker appears whole (link of a written file) and only once (link fails if it exists), so a
        # restarted query does not pause again and the test never reads it half-written.
        staging = f"{marker}.{os.getpid()}"
        with open(staging, "w", encoding="utf-8") as out:
            out.write(f"{ident.write_id} {ident.partition} {position} {os.getpid()}\n")
        try:
            os.link(staging, marker)
        except FileExistsError:
            return
        finally:
            os.unlink(staging)
        log.warning("%s: test.pauseAfterRecords reached at %d records; pausing for the test to kill a process",
                    where, position)
        parent, deadline = os.getppid(), time.monotonic() + 300
        while os.getppid() == parent and time.monotonic() < deadline:
            time.sleep(0.1)
        # Whoever we paused for is gone (or never came): leave without touching the WAL again.
        os._exit(1)


def write_partition(batches: Iterable[pa.RecordBatch], options: SinkOptions, plan: SchemaPlan,
                    ident: TaskIdentity) -> SinkCommitMessage:
    """Write one partition: every batch is durably in the WAL before the producer sees it; acknowledged
    positions are persisted with every batch; on success the attempt's log and the earlier attempts' it
    superseded are purged. On failure, what Kafka did not acknowledge stays in the WAL for the retry."""
    started = time.monotonic()
    where = f"partition {ident.partition} (attempt {ident.attempt}) of write {ident.write_id}"
    producer = get_producer(options)
    max_message = int(options.producer_config().get("message.max.bytes", 1_000_000))
    wal = open_wal(options.resolved_wal_path()) if options.wal_enabled else None
    priors: list[AttemptInfo] = []
    attempt_key: str | None = None
    replay: ReplayPlan | None = None
    if wal is not None:
        priors = wal.prior_attempts(ident.write_id, ident.partition)
        replay = ReplayPlan(wal, priors)
        attempt_key = wal.begin_attempt(ident.write_id, ident.partition, ident.attempt,
                                        {**ident.extra, "topic": plan.topic_option})
        if priors:
            log.info("%s: found %d earlier attempt(s) in WAL %s; re-sending only what Kafka never acknowledged",
                     where, len(priors), wal.path)
    message = SinkCommitMessage(write_id=ident.write_id, partition=ident.partition, attempt=ident.attempt,
                                host=socket.gethostname(), wal_path=wal.path if wal else None)
    tracker = DeliveryTracker()
    checker = _PartitionCheck(producer, where)
    position = 0  # records read from Spark (and handed to the WAL)
    # One batch ahead: the WAL commit (fsync) of batch k+1 runs on a thread while batch k is produced; LMDB and
    # Arrow release the GIL. Batch k+1 is produced only after its own commit returned.
    pending: tuple[pa.RecordBatch, KafkaRecords, int, Future[int] | None] | None = None
    wal_write: Future[int] | None = None

    def produce_pending() -> None:
        assert pending is not None
        batch, records, first, stored = pending
        if stored is not None:
            message.wal_bytes += stored.result()
        skip, replayed, diverged = replay.mask(first, batch) if replay else (None, 0, 0)
        message.replayed += replayed
        message.diverged += diverged
        sent = produce(producer, records, plan.topic_option, first, skip, tracker, options.scrub)
        message.published += sent
        message.skipped += batch.num_rows - sent
        _fault_hooks(options, ident, first + batch.num_rows, where,
                     lambda: _wait_and_checkpoint(producer, tracker, wal, attempt_key, delivery_timeout_s(options)))

    try:
        for raw in batches:
            if raw.num_rows == 0:
                continue
            batch = normalise(raw, plan)
            check_batch(batch, plan, where, position, max_message)
            if "partition" in batch.schema.names or plan.topic_from_column:
                checker.check(batch, plan.topic_option, position)
            records = to_records(batch)
            if records.headers is not None and (row := header_key_problem(records.headers)) is not None:
                raise RecordError(f"{where}, record {position + row}: a header has a null key; Kafka header "
                                  "keys must be strings")
            wal_write = None
            if wal is not None and attempt_key is not None:
                wal_write = _wal_thread().submit(wal.append, attempt_key, position, batch, options.wal_max_bytes,
                                                 tracker.take_dirty())
            if pending is not None:
                produce_pending()
            pending = (batch, records, position, wal_write)
            position += batch.num_rows
        if pending is not None:
            produce_pending()
            pending = None
        _wait_and_checkpoint(producer, tracker, wal, attempt_key, delivery_timeout_s(options) + _FLUSH_MARGIN_S)
        if tracker.failed or tracker.outstanding:
            problem = tracker.first_error() or f"{tracker.outstanding} records still unacknowledged at the deadline"
            raise DeliveryError(
                f"{where}: Kafka did not acknowledge {tracker.failed + tracker.outstanding} of {tracker.produced} "
                f"records: {options.scrub(problem)}. They stay in WAL "
                f"{wal.path if wal else '(disabled)'} and a retry of the write re-sends only those"
            )
    except BaseException:
        # Give records already handed over their chance to be acknowledged and persist what was, so a retry
        # skips them; then drop the producer so no stale delivery reaches the next task.
        try:
            if wal_write is not None:
                wait([wal_write])  # its outcome does not matter here; LMDB commits whole or not at all
            if tracker.outstanding:
                _wait_and_checkpoint(producer, tracker, wal, attempt_key,
                                     min(delivery_timeout_s(options), 60.0))
            elif wal is not None and attempt_key is not None:
                wal.save_acks(attempt_key, tracker.take_dirty())
        except Exception as secondary:  # noqa: BLE001 - the original error is the one to report
            log.warning("%s: could not checkpoint acknowledgements after the failure: %s", where,
                        options.scrub(str(secondary)))
        finally:
            discard_producer(options)
        raise
    message.received = position
    message.acknowledged = tracker.acked
    if wal is not None and attempt_key is not None:
        wal.purge([attempt_key, *(p.key for p in priors)])
    message.seconds = time.monotonic() - started
    if priors:
        log.info("%s: done after a retry: %d records, %d re-sent, %d skipped as already delivered, %d diverged",
                 where, position, message.published, message.skipped, message.diverged)
    return message
