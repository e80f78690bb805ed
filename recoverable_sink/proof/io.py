"""The proof topic's reads and writes a task makes, behind one interface (:class:`ProofIO`): :class:`KafkaIO` over the
brokers; the writer's model scripts a broker behind the same interface and runs everything else as it is."""

from __future__ import annotations

import time
from typing import Protocol

from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition

from recoverable_sink.deadlines import MARGIN_S
from recoverable_sink.errors import DeliveryError
from recoverable_sink.options import KafkaProof, SinkOptions, short_lived
from recoverable_sink.proof import reader, topic
from recoverable_sink.proof.view import ProofView


class ProofIO(Protocol):
    """The proof topic as one task attempt reads and writes it."""

    topic: str

    def read_view(self, view: ProofView, starts: dict[int, int]) -> ProofView:
        """Fill ``view`` from ``starts`` (proof partition -> first offset) to the topic's end now (see
        :mod:`recoverable_sink.proof.view`)."""
        ...

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

    def read_view(self, view: ProofView, starts: dict[int, int]) -> ProofView:
        return reader.read_view(self.options, self.proof, view, starts)

    def high_watermark(self, partition: int) -> int:
        return reader.high_watermark(self.options, self.proof, partition)

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
