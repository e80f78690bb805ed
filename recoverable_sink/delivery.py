"""The Kafka producer side of a task (executor): one cached librdkafka producer per configuration and
process, per-record delivery tracking, and error classification.

librdkafka does the retrying (retriable errors are retried until ``delivery.timeout.ms``), the idempotent
ordering and the murmur2 partitioning; this module only records which records Kafka acknowledged.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

from confluent_kafka import KafkaError, KafkaException, Producer

from recoverable_sink._logging import get_logger
from recoverable_sink.errors import DeliveryError, RecordError
from recoverable_sink.options import SinkOptions
from recoverable_sink.records import KafkaRecords

log = get_logger("delivery")

_producers: dict[tuple[tuple[str, str], ...], Producer] = {}
_DEFAULT_DELIVERY_TIMEOUT_MS = 300_000  # librdkafka's default message.timeout.ms


def get_producer(options: SinkOptions) -> Producer:
    """The process's producer for this configuration; Python workers are reused across tasks, so the
    connection set-up is paid once per worker, not once per task."""
    producer = _producers.get(options.producer_items)
    if producer is None:
        try:
            producer = Producer(options.producer_config())
        except KafkaException as exc:
            raise DeliveryError(f"cannot create the Kafka producer: {options.scrub(str(exc))}") from None
        _producers[options.producer_items] = producer
    return producer


def discard_producer(options: SinkOptions) -> None:
    """Drop a producer after a failure so the next task starts with an empty queue and a fresh state."""
    producer = _producers.pop(options.producer_items, None)
    if producer is not None:
        try:
            producer.purge()
            producer.flush(0)
        except (KafkaException, RuntimeError):
            pass


def delivery_timeout_s(options: SinkOptions) -> float:
    conf = options.producer_config()
    ms = conf.get("delivery.timeout.ms") or conf.get("message.timeout.ms") or _DEFAULT_DELIVERY_TIMEOUT_MS
    return int(ms) / 1000


@dataclass
class DeliveryTracker:
    """What Kafka acknowledged, by segment: one bitmap per segment, one byte per record."""

    bitmaps: dict[int, bytearray] = field(default_factory=dict)
    dirty: set[int] = field(default_factory=set)
    produced: int = 0
    acked: int = 0
    failed: int = 0
    errors: list[tuple[str, int, KafkaError]] = field(default_factory=list)

    def on_delivery(self, seg_first: int, bitmap: bytearray, index: int, err: KafkaError | None,
                    msg: object) -> None:
        if err is None:
            bitmap[index] = 1
            self.acked += 1
            self.dirty.add(seg_first)
        else:
            self.failed += 1
            if len(self.errors) < 20:
                self.errors.append((msg.topic(), msg.partition(), err))  # type: ignore[attr-defined]

    @property
    def outstanding(self) -> int:
        return self.produced - self.acked - self.failed

    def take_dirty(self) -> dict[int, bytearray]:
        """Bitmaps changed since the last call (copies, to persist); fully acknowledged segments are
        forgotten afterwards so memory stays flat in the partition size."""
        out = {first: bytearray(self.bitmaps[first]) for first in self.dirty}
        for first in self.dirty:
            if all(self.bitmaps[first]):
                del self.bitmaps[first]
        self.dirty.clear()
        return out

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


def _refused(exc: KafkaException, position: int, topic: str | None, partition: int | None,
             scrub: Callable[[str], str]) -> Exception:
    err = exc.args[0]
    where = f"record {position} to topic {topic}" + (f" partition {partition}" if partition is not None else "")
    if err.code() in (KafkaError.MSG_SIZE_TOO_LARGE, KafkaError._UNKNOWN_PARTITION, KafkaError._UNKNOWN_TOPIC,
                      KafkaError._INVALID_ARG):
        return RecordError(f"{where} was refused by the producer: {err.name()}: {scrub(err.str())}")
    return DeliveryError(f"{where} could not be queued: {err.name()}: {scrub(err.str())}")


def produce(producer: Producer, records: KafkaRecords, topic: str | None, seg_first: int,
            skip: list[bool] | None, tracker: DeliveryTracker, scrub: Callable[[str], str]) -> int:
    """Hand one segment's records to the producer, except those marked in ``skip`` (already delivered by
    an earlier attempt), which are recorded as acknowledged. Returns how many were handed over.

    Blocks (serving delivery reports) while librdkafka's local queue is full: nothing is dropped. This is
    the hot loop of the sink: one ``produce`` call and one small callback object per record."""
    n = len(records)
    bitmap = bytearray(n)
    tracker.bitmaps[seg_first] = bitmap
    if skip is not None:
        for i in range(n):
            if skip[i]:
                bitmap[i] = 1
        tracker.dirty.add(seg_first)
    callback, send, poll = tracker.on_delivery, producer.produce, producer.poll
    values = records.values
    keys = records.keys if records.keys is not None else [None] * n
    topics = records.topics if records.topics is not None else [topic] * n
    simple = records.partitions is None and records.headers is None and records.timestamps is None
    sent = 0
    try:
        for i in range(n):
            if skip is not None and skip[i]:
                continue
            on_delivery = partial(callback, seg_first, bitmap, i)
            if simple:
                # Positional arguments: topic, value, key, partition, callback (cheaper than keywords).
                while True:
                    try:
                        send(topics[i], values[i], keys[i], -1, on_delivery)
                        break
                    except BufferError:
                        poll(0.05)  # local queue full: serve delivery reports, then try again
                    except KafkaException as exc:
                        raise _refused(exc, seg_first + i, topics[i], None, scrub) from None
            else:
                kwargs: dict[str, object] = {}
                partition = records.partitions[i] if records.partitions is not None else None
                if partition is not None:
                    kwargs["partition"] = partition
                if records.headers is not None and records.headers[i]:
                    kwargs["headers"] = records.headers[i]
                if records.timestamps is not None and records.timestamps[i] is not None:
                    kwargs["timestamp"] = records.timestamps[i]
                while True:
                    try:
                        send(topics[i], values[i], keys[i], on_delivery=on_delivery, **kwargs)
                        break
                    except BufferError:
                        poll(0.05)
                    except KafkaException as exc:
                        raise _refused(exc, seg_first + i, topics[i], partition, scrub) from None
            sent += 1
    finally:
        # Counted even when a record is refused midway: the failure path waits for these acknowledgements.
        tracker.produced += sent
    poll(0)
    return sent


def wait_for_acks(producer: Producer, tracker: DeliveryTracker, timeout_s: float) -> None:
    """Flush until every handed-over record is acknowledged or has failed, with a deadline past
    librdkafka's own delivery timeout (after which it reports every undelivered record as failed)."""
    deadline = time.monotonic() + timeout_s
    while tracker.outstanding > 0:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        producer.flush(min(1.0, remaining))
