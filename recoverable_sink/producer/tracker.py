"""What Kafka acknowledged to one task (executor), by WAL segment: one bitmap per segment, one byte per record,
filled at **drains**.

Producers report failed deliveries only (``delivery.report.only.error``): a per-record report and callback cost
more than the rest of the send path. Once the producer's queue is empty, every record handed over since the last
drain is acknowledged, except those a failure report named: by position (the native producer's message opaque)
or by content (confluent-kafka's reports).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from confluent_kafka import KafkaError, Message

from recoverable_sink.producer.arguments import KafkaRecords


@dataclass
class Handed:
    """One segment's records handed to the producer since the last drain."""

    seg_first: int
    bitmap: bytearray
    upto: int  # records [0, upto) were handed over or skipped (fewer than all when one was refused)
    topic: str | None  # the topic of records without a topic of their own
    records: Callable[[], KafkaRecords] | None  # recomputes the records, to match failure reports by content
    slot: int = 0  # native: the slot its records' opaques carry
    rows: list[int] | None = None  # native: the segment row of each record sent, when some were skipped


@dataclass
class DeliveryTracker:
    """What Kafka acknowledged, by segment: one bitmap per segment, one byte per record, filled at drains."""

    bitmaps: dict[int, bytearray] = field(default_factory=dict)
    dirty: set[int] = field(default_factory=set)
    produced: int = 0
    acked: int = 0
    failed: int = 0
    errors: list[tuple[str, int, KafkaError]] = field(default_factory=list)
    window: list[Handed] = field(default_factory=list)  # handed over since the last drain
    failures: Counter[tuple[str | None, bytes | None, bytes | None]] = field(default_factory=Counter)
    failed_rows: dict[int, list[int]] = field(default_factory=dict)  # native: by slot, the rows that failed
    slots: int = 0  # native: slots given out

    def on_failure(self, err: KafkaError, msg: Message) -> None:
        self.failed += 1
        self.failures[(msg.topic(), msg.key(), msg.value())] += 1
        if len(self.errors) < 20:
            self.errors.append((msg.topic(), msg.partition(), err))

    def on_failures_at(self, failures: list[tuple[int, int, int, str | None]]) -> None:
        """Native failure reports: (opaque = slot << 32 | row, error code, partition, topic or None)."""
        for opaque, code, partition, topic in failures:
            self.failed += 1
            self.failed_rows.setdefault(opaque >> 32, []).append(opaque & 0xFFFFFFFF)
            if len(self.errors) < 20:
                self.errors.append((topic or "?", partition, KafkaError(code)))

    def segment(self, seg_first: int, n: int, skip: list[bool] | None) -> tuple[bytearray, list[int] | None]:
        """A new segment's bitmap, its skipped records (delivered earlier) marked acknowledged, and the positions
        of the records to hand over when some are skipped (None: all of them)."""
        bitmap = bytearray(n)
        self.bitmaps[seg_first] = bitmap
        if skip is None or not any(skip):
            return bitmap, None
        for i in range(n):
            if skip[i]:
                bitmap[i] = 1
        self.dirty.add(seg_first)
        return bitmap, [i for i in range(n) if not skip[i]]

    def next_slot(self) -> int:
        self.slots += 1
        return self.slots

    def handed(self, handed: Handed, count: int) -> None:
        self.produced += count
        if count:
            self.window.append(handed)

    def drained(self) -> None:
        """The producer's queue is empty: every record handed over since the last drain was acknowledged
        unless a failure report named its content (every record of that content then counts as failed:
        possibly one more copy sent again, never one lost)."""
        for handed in self.window:
            bitmap = handed.bitmap
            if self.failures and handed.records is not None:
                records = handed.records()
                n = len(records)
                rows = zip(records.topics or [handed.topic] * n, records.keys or [None] * n, records.values,
                           strict=True)
                for i, (t, k, v) in enumerate(rows):
                    if i >= handed.upto:
                        break
                    if (t, _b(k), _b(v)) not in self.failures:
                        bitmap[i] = 1
            else:
                bitmap[:handed.upto] = b"\x01" * handed.upto
                for i in self.failed_rows.pop(handed.slot, ()):
                    bitmap[i if handed.rows is None else handed.rows[i]] = 0
            self.dirty.add(handed.seg_first)
        self.window.clear()
        self.failures.clear()
        self.failed_rows.clear()
        self.acked = self.produced - self.failed

    @property
    def outstanding(self) -> int:
        return self.produced - self.acked - self.failed

    def take_dirty(self) -> dict[int, bytearray]:
        """Bitmaps changed since the last call (copies, to persist); fully acknowledged segments are
        forgotten afterwards so memory stays flat in the partition size."""
        out = {first: bytearray(self.bitmaps[first]) for first in self.dirty}
        for first in self.dirty:
            if 0 not in self.bitmaps[first]:  # a C scan; all() makes an int per byte
                del self.bitmaps[first]
        self.dirty.clear()
        return out

    def restore(self, acks: dict[int, bytearray]) -> None:
        """Bitmaps taken by :meth:`take_dirty` whose save failed: the next call returns them again. A segment
        still tracked keeps its own bitmap, which is newer (acknowledgements only add up)."""
        for first, bitmap in acks.items():
            self.bitmaps.setdefault(first, bitmap)
            self.dirty.add(first)

    def first_error(self) -> str | None:
        if not self.errors:
            return None
        topic, partition, err = self.errors[0]
        more = f" (and {self.failed - 1} more failed records)" if self.failed > 1 else ""
        if err.code() == KafkaError._MSG_TIMED_OUT:
            kind = "not acknowledged within delivery.timeout.ms; the broker may or may not have stored it"
        elif err.fatal():
            kind = "fatal producer error"
        else:
            kind = "retriable, retries exhausted" if err.retriable() else "permanent"
        where = f"partition {partition}" if partition is not None and partition >= 0 else "partition not yet assigned"
        return f"topic {topic} {where}: {err.name()} ({kind}): {err.str()}{more}"


def _b(data: object) -> bytes | None:
    """A field as the producer sent it (str is sent as UTF-8)."""
    return data.encode() if isinstance(data, str) else data  # type: ignore[return-value]
