"""What a producer hands back (executor): its delivery reports, and why it stopped handing records over.

Reports flow one way. A producer keeps them from its client's callbacks until the ledger takes them
(:meth:`~recoverable_sink.producer.protocol.SinkProducer.take_reports`); the producer never sees the ledger. A
record is named by the *slot* the ledger gave its send and its index among the records handed over in that send.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from confluent_kafka import KafkaError

from recoverable_sink.offsets import OffsetRange


@dataclass(frozen=True)
class Failure:
    """One record librdkafka reported undelivered: the ``index``-th record handed over in send ``slot``."""

    slot: int
    index: int
    error: KafkaError
    topic: str | None
    partition: int

    def describe(self) -> str:
        """The failure as a task's error names it (without the count of further failures)."""
        err = self.error
        if err.code() == KafkaError._MSG_TIMED_OUT:
            kind = "not acknowledged within delivery.timeout.ms; the broker may or may not have stored it"
        elif err.fatal():
            kind = "fatal producer error"
        else:
            kind = "retriable, retries exhausted" if err.retriable() else "permanent"
        where = f"partition {self.partition}" if self.partition >= 0 else "partition not yet assigned"
        return f"topic {self.topic or '?'} {where}: {err.name()} ({kind}): {err.str()}"


@dataclass
class Reports:
    """The reports a producer collected since they were last taken: failed records, and the offsets Kafka
    acknowledged per topic-partition (``complete`` False when some acknowledged records could not be noted)."""

    failures: list[Failure] = field(default_factory=list)
    written: list[OffsetRange] = field(default_factory=list)
    complete: bool = True


class Stopped(Exception):  # noqa: N818 - a signal between producer and ledger, not an error the user sees
    """A producer stopped handing a send's records over at its ``index``-th record (the ones before it were
    handed over; it and those after it were not) because of ``cause``: a ``KafkaException`` when librdkafka
    refused that record, else whatever else stopped the sending. ``topic`` and ``partition`` name the record."""

    def __init__(self, index: int, cause: BaseException, topic: str | None = None, partition: int = -1) -> None:
        super().__init__(index, cause)
        self.index = index
        self.cause = cause
        self.topic = topic
        self.partition = partition
