"""The proof topic's reads and writes a task makes, behind one interface (:class:`ProofIO`): :class:`KafkaIO` over the
brokers; the writer's model scripts a broker behind the same interface and runs everything else as it is (the
reading algorithm, :mod:`.read`, included)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol, TypeVar

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from recoverable_sink._logging import get_logger
from recoverable_sink.deadlines import MARGIN_S
from recoverable_sink.errors import DeliveryError
from recoverable_sink.options import KafkaProof, SinkOptions, short_lived
from recoverable_sink.proof import reader, topic
from recoverable_sink.proof.read import Feed, Reads
from recoverable_sink.proof.view import ProofView

log = get_logger("proof")
T = TypeVar("T")


class ProofIO(Reads, Protocol):
    """The proof topic as one task attempt reads and writes it."""

    def high_watermark(self, partition: int) -> int: ...

    def lookup(self, scope: str) -> dict[int, int] | None:
        """The scope's directory entry (None: none)."""
        ...

    def produce(self, records: list[tuple[int, bytes, bytes | None]], what: str) -> None:
        """Write records (partition, key, value; None: a tombstone), acknowledged, outside any transaction."""
        ...

    def claim(self, partition: int, key: bytes, value: bytes) -> None: ...

    def read_since(self, view: ProofView, partition: int, position: int) -> int: ...

    def read_limit_s(self) -> float: ...


class KafkaIO:
    """The proof topic on the brokers, each call under a deadline the sink owns."""

    def __init__(self, options: SinkOptions, proof: KafkaProof) -> None:
        self.options = options
        self.proof = proof
        self.topic = proof.topic
        self._producer: Producer | None = None

    def high_watermark(self, partition: int) -> int:
        return reader.high_watermark(self.options, self.proof, partition)

    def ends(self, partition: int) -> tuple[int, int]:
        return self._bounded(lambda c, deadline: reader.partition_ends(c, TopicPartition(self.topic, partition),
                                                                      deadline), committed=False)

    def stable(self, partition: int) -> int:
        return self._bounded(lambda c, deadline: reader.partition_ends(c, TopicPartition(self.topic, partition),
                                                                      deadline)[1], committed=True)

    def read(self, partition: int, start: int, end: int, committed: bool, feed: Feed) -> None:
        self._bounded(lambda c, deadline: reader.read_range(c, self.topic, partition, start, end, deadline, feed),
                      committed=committed)

    def key_at(self, partition: int, offset: int) -> bytes | None:
        found: list[bytes | None] = []

        def first(_offset: int, key: bytes | None, _value: bytes | None) -> None:
            if not found:
                found.append(key)

        self._bounded(lambda c, deadline: reader.read_range(c, self.topic, partition, offset, offset + 1, deadline,
                                                            first), committed=False)
        return found[0] if found else None

    def fence(self, transactional_id: str) -> None:
        """A transactional producer of that id, made and closed: its init_transactions aborts the open transaction
        (or completes a commit under way), within the delivery timeout's bound."""
        from recoverable_sink.deadlines import within
        from recoverable_sink.producer.ledger import delivery_timeout_s

        limit = min(120.0, max(10.0, delivery_timeout_s(self.options)))
        conf = short_lived({**self.options.producer_config(), "transactional.id": transactional_id})
        producer = Producer(conf)
        try:
            within(lambda: producer.init_transactions(limit), f"fencing {transactional_id}", limit,
                   f"{limit:.0f} s, from kafka.delivery.timeout.ms",
                   f"the transaction coordinator of {transactional_id}", handle=producer)
            log.info("fenced %s, whose open transaction held back the proof topic's readers", transactional_id)
        except KafkaException as exc:
            raise DeliveryError(f"fencing {transactional_id}, whose open transaction holds back the proof topic: "
                                f"{self.options.scrub(str(exc))}") from None
        finally:
            producer.flush(0)

    def _bounded(self, call: Callable[[Consumer, float], T], committed: bool) -> T:
        limit = self.read_limit_s()
        try:
            with reader.consumer(self.options, committed=committed) as c:
                return call(c, time.monotonic() + limit)
        except (KafkaException, TimeoutError) as exc:
            raise DeliveryError(f"the proof topic {self.topic} could not be read within {limit:.0f} s (from "
                                f"kafka.delivery.timeout.ms): {self.options.scrub(str(exc))}; check that the brokers "
                                "are up and that this principal may READ it") from None

    def lookup(self, scope: str) -> dict[int, int] | None:
        return reader.directory(self.options, self.proof).lookup(scope)

    def produce(self, records: list[tuple[int, bytes, bytes | None]], what: str) -> None:
        topic.produce(self.options, self.proof, records, what)

    def claim(self, partition: int, key: bytes, value: bytes) -> None:
        from recoverable_sink.producer.ledger import delivery_timeout_s

        if self._producer is None:
            conf = short_lived({**self.options.producer_config(), "linger.ms": "0"})
            conf.pop("transactional.id", None)
            self._producer = Producer(conf)
        producer = self._producer
        failed: list[KafkaError] = []
        producer.produce(self.topic, value=value, key=key, partition=partition,
                         on_delivery=lambda err, _m: failed.append(err) if err is not None else None)
        limit = delivery_timeout_s(self.options) + MARGIN_S
        deadline = time.monotonic() + limit
        while len(producer) and time.monotonic() < deadline:
            producer.flush(min(1.0, max(0.0, deadline - time.monotonic())))
        if failed or len(producer):
            producer.purge()
            cause = failed[0].str() if failed else f"not acknowledged within {limit:.0f} s"
            raise DeliveryError(f"a claim on delivered records could not be written to the proof topic {self.topic}: "
                                f"{self.options.scrub(cause)}")

    def read_since(self, view: ProofView, partition: int, position: int) -> int:
        limit = self.read_limit_s()
        deadline = time.monotonic() + limit
        try:
            with reader.consumer(self.options, committed=False) as c:
                _low, high = reader.partition_ends(c, TopicPartition(self.topic, partition), deadline)
                reader.read_range(c, self.topic, partition, position, high, deadline, view.first_pass)
                return max(position, high)
        except (KafkaException, TimeoutError) as exc:
            raise DeliveryError(f"the proof topic {self.topic} could not be read: "
                                f"{self.options.scrub(str(exc))}") from None

    def read_limit_s(self) -> float:
        return reader.read_limit_s(self.options)
