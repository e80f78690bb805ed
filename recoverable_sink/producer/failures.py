"""How a librdkafka error becomes the sink's error kind (executor): a fatal producer, a record the producer
refused, or a delivery that could not be queued. Both producers and the ledger's drains raise through here."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from confluent_kafka import KafkaError, KafkaException

from recoverable_sink.errors import DeliveryError, FatalProducerError, RecordError


@contextmanager
def fatal_errors() -> Iterator[None]:
    """Turn a fatal producer error raised out of ``poll``/``flush`` into :class:`FatalProducerError`.

    confluent-kafka raises it as a KafkaException, except when a delivery callback runs in the same call
    after the error was set: Python then reports a SystemError caused by that KafkaException, or (seen with
    failure-only reports, a fenced transactional producer) a SystemError that ``flush`` "returned NULL
    without setting an exception"."""
    try:
        yield
    except (KafkaException, SystemError) as exc:
        cause = exc if isinstance(exc, KafkaException) else exc.__cause__
        if not isinstance(cause, KafkaException):
            raise FatalProducerError(f"fatal producer error: the client failed without naming it ({exc})") from None
        err = cause.args[0]
        raise FatalProducerError(f"fatal producer error: {err.name()}: {err.str()}") from None


def refused(exc: KafkaException, position: int, topic: str | None, partition: int,
            scrub: Callable[[str], str], first_failure: str | None = None) -> Exception:
    """The error for a record the producer would not queue; ``first_failure`` is the first failed delivery so
    far (:meth:`Ledger.first_error`), the cause when a transaction stopped taking records."""
    err = exc.args[0]
    where = f"record {position} to topic {topic}" + (f" partition {partition}" if partition >= 0 else "")
    if err.code() == KafkaError._STATE:
        # A transaction that an earlier delivery failure made abortable refuses every later record: that failure
        # is the cause, not this record.
        return DeliveryError(f"the transaction stopped taking records after an earlier error"
                             f"{' (the first failed delivery: ' + scrub(first_failure) + ')' if first_failure else ''}"
                             f": {err.name()}: {scrub(err.str())}; {where} is not at fault")
    if err.code() in (KafkaError.MSG_SIZE_TOO_LARGE, KafkaError._UNKNOWN_PARTITION, KafkaError._UNKNOWN_TOPIC,
                      KafkaError._INVALID_ARG):
        return RecordError(f"{where} was refused by the producer: {err.name()}: {scrub(err.str())}")
    if err.fatal() or err.code() in (KafkaError._FATAL, KafkaError._FENCED):
        return FatalProducerError(f"{where} could not be queued: fatal producer error: {err.name()}: "
                                  f"{scrub(err.str())}")
    return DeliveryError(f"{where} could not be queued: {err.name()}: {scrub(err.str())}")
