"""The ledger (executor): the one keeper of what Kafka acknowledged to one task attempt, by WAL segment. The writer
(and replay) sends a segment's records through it (:meth:`Ledger.send`) and drains through it; it takes the
producer's reports (:meth:`~recoverable_sink.producer.protocol.SinkProducer.take_reports`) and gives back the
changed books to persist. It knows the producer; the producer never knows it.

Acknowledgements are learnt at **drains**: once the producer's queue is empty, every record handed over since the
last drain is acknowledged, except those a failure report named (by the send's slot and the record's index in it).
The task drains every checkpoint interval and at its end, so it knows at its checkpoints as much as a per-record
report would have told, without a Python call per record. Success reports only feed the written offsets.
"""

from __future__ import annotations

import itertools
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa
from confluent_kafka import KafkaException

from recoverable_sink.identity import AckBitmaps
from recoverable_sink.offsets import OffsetRange, WrittenOffsets
from recoverable_sink.options import SinkOptions
from recoverable_sink.producer.failures import fatal_errors, refused
from recoverable_sink.producer.protocol import SinkProducer
from recoverable_sink.producer.reports import Failure, Reports, Stopped

_DEFAULT_DELIVERY_TIMEOUT_MS = 300_000  # librdkafka's default message.timeout.ms

# Send slots are unique in the process, so a report of a pooled producer's earlier task can never name a record of
# this one.
_SLOTS = itertools.count(1)


def delivery_timeout_s(options: SinkOptions) -> float:
    """How long librdkafka tries to deliver a record before it reports it failed."""
    conf = options.producer_config()
    ms = conf.get("delivery.timeout.ms") or conf.get("message.timeout.ms") or _DEFAULT_DELIVERY_TIMEOUT_MS
    return int(ms) / 1000


@dataclass
class _Handed:
    """A segment's records handed over since the last drain: rows [0, upto) of the segment were handed over or
    skipped; ``rows`` maps the send's indexes to segment rows (None: the same)."""

    seg_first: int
    bitmap: bytearray
    upto: int
    slot: int
    rows: list[int] | None


class Ledger:
    """What Kafka acknowledged to one task attempt through ``producer``: one bitmap per WAL segment, one byte per
    record, filled at drains; and the counts and first errors the task reports. ``scrub`` takes secrets out of the
    texts of errors."""

    def __init__(self, producer: SinkProducer, scrub: Callable[[str], str] = str) -> None:
        self.producer = producer
        self.scrub = scrub
        self.produced = 0
        self.acked = 0
        self.failed = 0
        self._bitmaps: AckBitmaps = {}
        self._changed: set[int] = set()
        self._errors: list[Failure] = []
        self._window: list[_Handed] = []
        self._failed_rows: dict[int, set[int]] = {}  # by slot, the indexes that failed since the last drain
        self._written = WrittenOffsets()
        self._written_complete = True
        # Proof records (the proof topic's chunks and marker): handed over like data, never booked in the bitmaps;
        # what a drain found of them tells which are in Kafka.
        self.proof_topic: str | None = None
        self.proof_sent = 0
        self.proof_acked = 0
        self.proof_low: int | None = None  # the lowest proof-topic offset Kafka acknowledged to this attempt
        self._proof_slots: dict[int, int] = {}  # slot -> records handed over in it
        self._proof_window: list[int] = []
        self._proof_failures: list[Failure] = []
        # A pooled producer's earlier task drained it: whatever it still holds is not this attempt's.
        producer.take_reports()

    # ---- sending ----------------------------------------------------------------------------------------------
    def send(self, batch: pa.RecordBatch, topic: str | None, seg_first: int, skip: list[bool] | None = None) -> int:
        """Hand a segment's records (a normalised batch) to the producer in order, except those marked in ``skip``
        (delivered earlier: booked as acknowledged); returns how many were handed over. Blocks (serving reports)
        while librdkafka's queue is full: nothing is dropped. A record the producer refuses raises
        :func:`~recoverable_sink.producer.failures.refused`'s error kind; the records before it stay handed over
        and await the next drain like the others."""
        n = batch.num_rows
        bitmap = bytearray(n)
        self._bitmaps[seg_first] = bitmap
        rows = None
        if skip is not None and any(skip):
            bitmap[:] = bytes(skip)
            self._changed.add(seg_first)
            rows = [i for i in range(n) if not skip[i]]
        count = n if rows is None else len(rows)
        slot = next(_SLOTS)
        taken, stopped = 0, None
        try:
            if count:
                with fatal_errors():
                    try:
                        taken = self.producer.send(batch, topic, slot, rows)
                    except Stopped as stop:
                        taken, stopped = stop.index, stop
        finally:
            # Booked before any report is served (a drain learns this send's failures only once it is in the
            # window), and even when a record is refused midway: the failure path waits for those before it.
            self.produced += taken
            if taken:
                upto = n if taken == count else (taken if rows is None else rows[taken])
                self._window.append(_Handed(seg_first, bitmap, upto, slot, rows))
        if stopped is not None:
            self._stopped(stopped, seg_first + (stopped.index if rows is None else rows[stopped.index]))
        self.serve()
        return taken

    def send_proof(self, batch: pa.RecordBatch, topic: str) -> None:
        """Hand proof records (a batch of key, value and an explicit partition) to the producer, after the data handed
        over before them: a drain then says whether Kafka has them (:attr:`proof_acked`). A refusal raises."""
        self.proof_topic = topic
        slot = next(_SLOTS)
        self._proof_slots[slot] = 0
        with fatal_errors():
            try:
                taken = self.producer.send(batch, topic, slot, None)
            except Stopped as stop:
                if not isinstance(stop.cause, KafkaException):
                    raise stop.cause from None
                raise refused(stop.cause, 0, topic, stop.partition, self.scrub, None) from None
        self._proof_slots[slot] = taken
        self.proof_sent += taken
        self._proof_window.append(slot)

    @property
    def proof_outstanding(self) -> int:
        return self.proof_sent - self.proof_acked - len(self._proof_failures)

    def proof_failure(self) -> str | None:
        """The first proof record Kafka refused, as a task's error names it."""
        return self._proof_failures[0].describe() if self._proof_failures else None

    def _stopped(self, stop: Stopped, position: int) -> None:
        with fatal_errors():
            if not isinstance(stop.cause, KafkaException):
                raise stop.cause
            # A handle in a fatal state (fenced, idempotence lost) refuses every record with that error's code:
            # serving raises it as fatal, which the task reports as such, not as this record's problem.
            try:
                self.producer.poll(0)
            finally:
                self._take()  # the first failed delivery, where it is the cause
        raise refused(stop.cause, position, stop.topic, stop.partition, self.scrub, self.first_error()) from None

    # ---- draining ---------------------------------------------------------------------------------------------
    def serve(self) -> None:
        """Serve the reports that are ready, without waiting; an empty queue is a drain."""
        with fatal_errors():
            try:
                self.producer.poll(0)
            finally:
                self._take()
        if (self._window or self._proof_window) and len(self.producer) == 0:
            self._drained()

    def drain(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for the producer's queue to empty (serving reports); if it emptied, learn what
        was acknowledged."""
        with fatal_errors():
            try:
                left = self.producer.flush(timeout_s)
            finally:
                self._take()
        if left == 0:
            self._drained()

    def wait_for_acks(self, timeout_s: float) -> None:
        """Drain until every handed-over record is acknowledged or has failed, or ``timeout_s`` passed (past
        librdkafka's own delivery timeout, it reports every undelivered record as failed)."""
        deadline = time.monotonic() + timeout_s
        while self.outstanding > 0 or self.proof_outstanding > 0:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            self.drain(min(1.0, remaining))

    def _take(self) -> None:
        """Take the producer's reports into the books."""
        reports: Reports = self.producer.take_reports()
        for failure in reports.failures:
            if failure.slot in self._proof_slots:
                self._proof_failures.append(failure)
                continue
            self.failed += 1
            self._failed_rows.setdefault(failure.slot, set()).add(failure.index)
            if len(self._errors) < 20:
                self._errors.append(failure)
        for topic, partition, first, last, count in reports.written:
            if topic == self.proof_topic:
                self.proof_low = first if self.proof_low is None else min(self.proof_low, first)
                continue
            self._written.add(topic, partition, first, last, count)
        self._written_complete = self._written_complete and reports.complete

    @property
    def outstanding(self) -> int:
        """Records handed over whose fate is not known yet."""
        return self.produced - self.acked - self.failed

    def _drained(self) -> None:
        """The producer's queue is empty: every record handed over since the last drain was acknowledged unless a
        failure report named it."""
        for handed in self._window:
            bitmap = handed.bitmap
            bitmap[:handed.upto] = b"\x01" * handed.upto  # the skipped rows among them are 1 already
            for i in self._failed_rows.pop(handed.slot, ()):
                bitmap[i if handed.rows is None else handed.rows[i]] = 0
            self._changed.add(handed.seg_first)
        self._window.clear()
        self._failed_rows.clear()
        self.acked = self.produced - self.failed
        failed = Counter(f.slot for f in self._proof_failures)
        self.proof_acked += sum(self._proof_slots[slot] - failed[slot] for slot in self._proof_window)
        self._proof_window.clear()

    # ---- the books --------------------------------------------------------------------------------------------
    def written_offsets(self) -> tuple[tuple[OffsetRange, ...], bool]:
        """What Kafka acknowledged to this attempt, per topic-partition: ((topic, partition, first offset, last
        offset, records), ...) sorted, and whether every acknowledged record is counted in it."""
        entries = self._written.ranges()
        return entries, self._written_complete and sum(e[4] for e in entries) == self.acked

    def take_changes(self) -> AckBitmaps:
        """The bitmaps changed since the last call (copies, to persist); fully acknowledged segments are
        forgotten afterwards so memory stays flat in the partition size."""
        out = {first: bytearray(self._bitmaps[first]) for first in self._changed}
        for first in self._changed:
            if 0 not in self._bitmaps[first]:  # a C scan; all() makes an int per byte
                del self._bitmaps[first]
        self._changed.clear()
        return out

    def give_back(self, acks: AckBitmaps) -> None:
        """Bitmaps taken by :meth:`take_changes` whose save failed: the next call returns them again. A segment
        still booked keeps its own bitmap, which is newer (acknowledgements only add up)."""
        for first, bitmap in acks.items():
            self._bitmaps.setdefault(first, bitmap)
            self._changed.add(first)

    def first_error(self) -> str | None:
        """The first failed delivery, as the task's error names it."""
        if not self._errors:
            return None
        more = f" (and {self.failed - 1} more failed records)" if self.failed > 1 else ""
        return self._errors[0].describe() + more
