"""A stand-in for librdkafka's producer (confluent-kafka's ``Producer``), for unit tests of the task's bookkeeping
only (no guarantee is claimed from it: the integration tests prove those on a real broker). The sink uses it as it
uses the real one, through :class:`ConfluentProducer` (:func:`sink_producer`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from recoverable_sink.producer.confluent import ConfluentProducer, FailureReport


@dataclass
class Sent:
    topic: str
    value: bytes | None
    key: bytes | None
    partition: int
    timestamp: int
    headers: list | None


class _Msg:
    def __init__(self, sent: Sent) -> None:
        self._sent = sent

    def topic(self) -> str:
        return self._sent.topic

    def partition(self) -> int:
        return self._sent.partition

    def key(self) -> bytes | None:
        return _bytes(self._sent.key)

    def value(self) -> bytes | None:
        return _bytes(self._sent.value)


def _bytes(data: str | bytes | None) -> bytes | None:
    """As librdkafka hands fields back: bytes, whatever type they were produced as."""
    return data.encode() if isinstance(data, str) else data


@dataclass
class FakeProducer:
    """confluent-kafka's ``Producer`` (librdkafka's client), faked. Queues records; ``poll``/``flush``
    acknowledge them (all, or up to ``ack_budget``) into ``delivered``, reporting failures only, as the sink's
    producers do (``delivery.report.only.error``), to ``on_delivery``. ``fail`` makes every
    delivery fail with that error instead. After ``fatal_after`` acknowledgements the producer turns fatal, the
    way confluent-kafka shows it: the first call raises a SystemError caused by the fatal KafkaException (a
    delivery callback ran with the error set), later calls the KafkaException."""

    partitions: int = 4
    ack_budget: int | None = None
    fail: KafkaError | None = None
    fatal_after: int | None = None
    fatal: bool = False
    expire: bool = False  # past ack_budget, flush reports the rest as timed out (as delivery.timeout.ms does)
    queue_max: int | None = None  # produce() raises BufferError at this many queued (librdkafka's queue full)
    refuse: bytes | None = None  # produce() refuses this value as too large
    queue: list[Sent] = field(default_factory=list)
    delivered: list[Sent] = field(default_factory=list)
    on_delivery: FailureReport | None = None  # confluent-kafka's on_delivery setting

    def produce(self, topic: str, value: bytes | None = None, key: bytes | None = None, partition: int = -1,
                on_delivery: Callable[..., Any] | None = None, callback: object = None, timestamp: int = 0,
                headers: list | None = None) -> None:
        assert on_delivery is None, "the sink relies on failure-only reports, not a per-record callback"
        if self.queue_max is not None and len(self.queue) >= self.queue_max:
            raise BufferError("Local: Queue full")
        if self.refuse is not None and value == self.refuse:
            raise KafkaException(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE, "Broker: Message size too large"))
        self.queue.append(Sent(topic, value, key, partition, timestamp, headers))

    def __len__(self) -> int:
        return len(self.queue)

    def _fatal(self) -> None:
        error = KafkaException(KafkaError(KafkaError._FENCED, "fenced by newer producer instance", fatal=True))
        if self.fatal:
            raise error
        self.fatal = True
        try:
            raise error
        except KafkaException as exc:
            raise SystemError("on_delivery returned a result with an exception set") from exc

    def _serve(self) -> int:
        if self.fatal:
            self._fatal()
        while self.queue and (self.ack_budget is None or self.ack_budget > 0):
            if self.fatal_after is not None and len(self.delivered) >= self.fatal_after:
                self._fatal()
            sent = self.queue.pop(0)
            if self.fail is not None:
                self.on_delivery(self.fail, _Msg(sent))
                continue
            if self.ack_budget is not None:
                self.ack_budget -= 1
            self.delivered.append(sent)
        return len(self.queue)

    def poll(self, timeout: float = 0) -> int:
        self._serve()
        return 0

    def flush(self, timeout: float = 0) -> int:
        left = self._serve()
        if left and self.expire:
            timed_out = KafkaError(KafkaError._MSG_TIMED_OUT, "Local: Message timed out")
            for sent in self.queue:
                self.on_delivery(timed_out, _Msg(sent))
            self.queue.clear()
        return len(self.queue)

    def purge(self) -> None:
        self.queue.clear()

    def list_topics(self, topic: str | None = None, timeout: float = 0) -> SimpleNamespace:
        meta = SimpleNamespace(partitions=dict.fromkeys(range(self.partitions)), error=None)
        return SimpleNamespace(topics={topic: meta}, cluster_id="fake-cluster")

    def values(self) -> list[bytes | None]:
        return [s.value for s in self.delivered]


def sink_producer(fake: FakeProducer) -> ConfluentProducer:
    """The sink's confluent-kafka producer over ``fake``, which reports its failed deliveries to it."""

    def made(on_failure: FailureReport) -> FakeProducer:
        fake.on_delivery = on_failure
        return fake

    return ConfluentProducer(made)
