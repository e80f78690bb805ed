"""The Kafka producer side of a task (executor): one cached librdkafka producer per configuration and
process, per-record delivery tracking, and error classification.

librdkafka does the retrying (retriable errors are retried until ``delivery.timeout.ms``), the idempotent
ordering and the murmur2 partitioning; this module only records which records Kafka acknowledged.
"""

from __future__ import annotations

import time
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
        kind = "fatal" if err.fatal() else ("retriable, retries exhausted" if err.retriable() else "permanent")
        return f"topic {topic} partition {partition}: {err.name()} ({kind}): {err.str()}{more}"


def produce(producer: Producer, records: KafkaRecords, topic: str | None, seg_first: int,
            skip: list[bool] | None, tracker: DeliveryTracker, scrub: object) -> int:
    """Hand one segment's records to the producer, except those marked in ``skip`` (already delivered by
    an earlier attempt), which are recorded as acknowledged. Returns how many were handed over.

    Blocks (polling delivery reports) while librdkafka's local queue is full: nothing is dropped."""
    n = len(records)
    bitmap = bytearray(n)
    tracker.bitmaps[seg_first] = bitmap
    callback = tracker.on_delivery
    send = producer.produce
    values, keys = records.values, records.keys
    topics, partitions = records.topics, records.partitions
    headers, timestamps = records.headers, records.timestamps
    sent = 0
    for i in range(n):
        if skip is not None and skip[i]:
            bitmap[i] = 1
            tracker.dirty.add(seg_first)
            continue
        kwargs: dict[str, object] = {}
        if partitions is not None and partitions[i] is not None:
            kwargs["partition"] = partitions[i]
        if headers is not None and headers[i]:
            kwargs["headers"] = headers[i]
        if timestamps is not None and timestamps[i] is not None:
            kwargs["timestamp"] = timestamps[i]
        record_topic = topics[i] if topics is not None else topic
        while True:
            try:
                send(record_topic, values[i], None if keys is None else keys[i],
                     on_delivery=partial(callback, seg_first, bitmap, i), **kwargs)
                break
            except BufferError:
                producer.poll(0.05)  # local queue full: serve delivery reports, then try again
            except KafkaException as exc:
                err = exc.args[0]
                message = f"record {seg_first + i} to topic {record_topic}" + (
                    f" partition {kwargs['partition']}" if "partition" in kwargs else "")
                text = scrub(err.str()) if callable(scrub) else err.str()
                if err.code() in (KafkaError.MSG_SIZE_TOO_LARGE, KafkaError._UNKNOWN_PARTITION,
                                  KafkaError._UNKNOWN_TOPIC, KafkaError._INVALID_ARG):
                    raise RecordError(f"{message} was refused by the producer: {err.name()}: {text}") from None
                raise DeliveryError(f"{message} could not be queued: {err.name()}: {text}") from None
        sent += 1
        tracker.produced += 1
    producer.poll(0)
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
