"""The ledger (executor): the one keeper of what Kafka acknowledged to one task attempt, by WAL segment. Producers
hand segments over through it (:meth:`Ledger.handing_over`) and report failed deliveries to it; the writer drains
through it and takes the changed books to persist.

Acknowledgements are learnt at **drains**: once the producer's queue is empty, every record handed over since the
last drain is acknowledged, except those a failure report named, by position (the native producer's message
opaque) or by content (confluent-kafka's reports). The task drains every checkpoint interval and at its end, so
it knows at its checkpoints as much as a per-record report would have told, without a Python call per record.
Success reports only feed the written offsets (:meth:`Ledger.on_written`, folded per topic-partition in C by the
native producer).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Protocol

from confluent_kafka import KafkaError, Message

from recoverable_sink.identity import AckBitmaps
from recoverable_sink.offsets import OffsetRange, WrittenOffsets
from recoverable_sink.options import SinkOptions
from recoverable_sink.producer.arguments import KafkaRecords
from recoverable_sink.producer.failures import fatal_errors

_DEFAULT_DELIVERY_TIMEOUT_MS = 300_000  # librdkafka's default message.timeout.ms


def delivery_timeout_s(options: SinkOptions) -> float:
    """How long librdkafka tries to deliver a record before it reports it failed."""
    conf = options.producer_config()
    ms = conf.get("delivery.timeout.ms") or conf.get("message.timeout.ms") or _DEFAULT_DELIVERY_TIMEOUT_MS
    return int(ms) / 1000


class _Queue(Protocol):
    """What a drain asks of a producer: serve its reports, wait for its queue, say how much it holds."""

    def poll(self, timeout: float = 0) -> int: ...

    def flush(self, timeout: float = -1) -> int: ...

    def __len__(self) -> int: ...


@dataclass
class Handover:
    """One segment's records on their way to a producer: which rows go (``rows``; None: all ``n``), the slot their
    native opaques carry, and how many the producer took (``taken``, set by the producer as it goes)."""

    seg_first: int
    n: int
    rows: list[int] | None
    slot: int
    taken: int = 0

    @property
    def count(self) -> int:
        """Records to hand over."""
        return self.n if self.rows is None else len(self.rows)

    def row(self, i: int) -> int:
        """The segment row of the ``i``-th record handed over."""
        return i if self.rows is None else self.rows[i]

    def position(self, i: int) -> int:
        """The attempt position of the ``i``-th record handed over (how errors name a record)."""
        return self.seg_first + self.row(i)

    @property
    def upto(self) -> int:
        """Rows [0, upto) of the segment were handed over or skipped (fewer than all when one was refused)."""
        return self.n if self.taken == self.count else self.row(self.taken)


@dataclass
class _Handed:
    """A segment's records handed over since the last drain, and how to tell which of them failed."""

    seg_first: int
    bitmap: bytearray
    upto: int
    topic: str | None  # the topic of records without a topic of their own
    records: Callable[[], KafkaRecords] | None  # confluent: the records again, to match failure reports by content
    slot: int
    rows: list[int] | None


@dataclass
class Ledger:
    """What Kafka acknowledged to one task attempt: one bitmap per WAL segment, one byte per record, filled at
    drains; and the counts and first errors the task reports."""

    produced: int = 0
    acked: int = 0
    failed: int = 0
    _bitmaps: AckBitmaps = field(default_factory=dict)
    _changed: set[int] = field(default_factory=set)
    _errors: list[tuple[str, int, KafkaError]] = field(default_factory=list)
    _window: list[_Handed] = field(default_factory=list)
    _failures: Counter[tuple[str | None, bytes | None, bytes | None]] = field(default_factory=Counter)
    _failed_rows: dict[int, list[int]] = field(default_factory=dict)  # native: by slot, the rows that failed
    _slots: int = 0
    # From success reports: per (topic, partition), the first and last offset acknowledged and how many records.
    _written: WrittenOffsets = field(default_factory=WrittenOffsets)
    _written_complete: bool = True

    # ---- what producers do ------------------------------------------------------------------------------
    @contextmanager
    def handing_over(self, seg_first: int, n: int, skip: list[bool] | None, topic: str | None,
                     records: Callable[[], KafkaRecords] | None = None) -> Iterator[Handover]:
        """Book a segment of ``n`` records, those marked in ``skip`` (delivered earlier) as acknowledged, while a
        producer hands the rest over; on exit, however it ends, what it took (``Handover.taken``) awaits the next
        drain. ``records`` gives the records again where failure reports name records by content."""
        bitmap = bytearray(n)
        self._bitmaps[seg_first] = bitmap
        rows = None
        if skip is not None and any(skip):
            for i in range(n):
                if skip[i]:
                    bitmap[i] = 1
            self._changed.add(seg_first)
            rows = [i for i in range(n) if not skip[i]]
        self._slots += 1
        handover = Handover(seg_first, n, rows, self._slots)
        try:
            yield handover
        finally:
            # Booked even when a record is refused midway: the failure path waits for those before it.
            self.produced += handover.taken
            if handover.taken:
                self._window.append(_Handed(seg_first, bitmap, handover.upto, topic, records, handover.slot, rows))

    def on_failure(self, err: KafkaError, msg: Message) -> None:
        """confluent-kafka's failure report, matched to records by content at the next drain."""
        self.failed += 1
        self._failures[(msg.topic(), msg.key(), msg.value())] += 1
        if len(self._errors) < 20:
            self._errors.append((msg.topic(), msg.partition(), err))

    def on_failures_at(self, failures: list[tuple[int, int, int, str | None]]) -> None:
        """The native producer's failure reports: (opaque = slot << 32 | row, error code, partition, topic)."""
        for opaque, code, partition, topic in failures:
            self.failed += 1
            self._failed_rows.setdefault(opaque >> 32, []).append(opaque & 0xFFFFFFFF)
            if len(self._errors) < 20:
                self._errors.append((topic or "?", partition, KafkaError(code)))

    def on_written(self, entries: list[tuple[str, int, int, int, int]], complete: bool) -> None:
        """The native producer's acknowledged offsets, folded per topic-partition in C: (topic, partition, first,
        last, records); ``complete`` False when C could not note some of them."""
        for topic, partition, first, last, count in entries:
            self._written.add(topic, partition, first, last, count)
        self._written_complete = self._written_complete and complete

    def on_acknowledged(self, topic: str, partition: int, offset: int) -> None:
        """confluent-kafka's success report of one record."""
        self._written.add(topic, partition, offset, offset, 1)

    def written_offsets(self) -> tuple[tuple[OffsetRange, ...], bool]:
        """What Kafka acknowledged to this attempt, per topic-partition: ((topic, partition, first offset, last
        offset, records), ...) sorted, and whether every acknowledged record is counted in it."""
        entries = self._written.ranges()
        return entries, self._written_complete and sum(e[4] for e in entries) == self.acked

    # ---- what the writer does ---------------------------------------------------------------------------
    def serve(self, producer: _Queue) -> None:
        """Serve the reports that are ready, without waiting; an empty queue is a drain."""
        with fatal_errors():
            producer.poll(0)
        if self._window and len(producer) == 0:
            self._drained()

    def drain(self, producer: _Queue, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for the producer's queue to empty (serving failure reports); if it emptied,
        learn what was acknowledged."""
        with fatal_errors():
            left = producer.flush(timeout_s)
        if left == 0:
            self._drained()

    def wait_for_acks(self, producer: _Queue, timeout_s: float) -> None:
        """Drain until every handed-over record is acknowledged or has failed, or ``timeout_s`` passed (past
        librdkafka's own delivery timeout, it reports every undelivered record as failed)."""
        deadline = time.monotonic() + timeout_s
        while self.outstanding > 0:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            self.drain(producer, min(1.0, remaining))

    @property
    def outstanding(self) -> int:
        """Records handed over whose fate is not known yet."""
        return self.produced - self.acked - self.failed

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
        topic, partition, err = self._errors[0]
        more = f" (and {self.failed - 1} more failed records)" if self.failed > 1 else ""
        if err.code() == KafkaError._MSG_TIMED_OUT:
            kind = "not acknowledged within delivery.timeout.ms; the broker may or may not have stored it"
        elif err.fatal():
            kind = "fatal producer error"
        else:
            kind = "retriable, retries exhausted" if err.retriable() else "permanent"
        where = f"partition {partition}" if partition is not None and partition >= 0 else "partition not yet assigned"
        return f"topic {topic} {where}: {err.name()} ({kind}): {err.str()}{more}"

    def _drained(self) -> None:
        """The producer's queue is empty: every record handed over since the last drain was acknowledged unless a
        failure report named it (by content: every record of that content then counts as failed, possibly one
        more copy sent again, never one lost)."""
        for handed in self._window:
            bitmap = handed.bitmap
            if self._failures and handed.records is not None:
                records = handed.records()
                n = len(records)
                rows = zip(records.topics or [handed.topic] * n, records.keys or [None] * n, records.values,
                           strict=True)
                for i, (t, k, v) in enumerate(rows):
                    if i >= handed.upto:
                        break
                    if (t, _b(k), _b(v)) not in self._failures:
                        bitmap[i] = 1
            else:
                bitmap[:handed.upto] = b"\x01" * handed.upto
                for i in self._failed_rows.pop(handed.slot, ()):
                    bitmap[i if handed.rows is None else handed.rows[i]] = 0
            self._changed.add(handed.seg_first)
        self._window.clear()
        self._failures.clear()
        self._failed_rows.clear()
        self.acked = self.produced - self.failed


def _b(data: object) -> bytes | None:
    """A field as the producer sent it (str is sent as UTF-8)."""
    return data.encode() if isinstance(data, str) else data  # type: ignore[return-value]
