"""The producer interface (executor): what the writers, the transactions and replay ask of a Kafka producer, and
how a librdkafka error becomes the sink's error kind. Two implementations stand behind it:
:mod:`recoverable_sink.producer.native` (the ``_produce`` C extension) and
:mod:`recoverable_sink.producer.confluent` (confluent-kafka's ``Producer``). librdkafka does the retrying
(until ``delivery.timeout.ms``), the idempotent ordering and the murmur2 partitioning in both.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Protocol

import pyarrow as pa
from confluent_kafka import KafkaError, KafkaException

from recoverable_sink.errors import DeliveryError, FatalProducerError, RecordError
from recoverable_sink.producer.tracker import DeliveryTracker


class SinkProducer(Protocol):
    """A librdkafka producer whose only delivery reports are failures, handed to ``tracker`` (set by the task
    using it for its duration: producers are reused by the tasks a Python worker runs, one at a time)."""

    kind: str  # "native" or "confluent": named in the commit message and the worker's log
    tracker: DeliveryTracker | None

    def send_segment(self, batch: pa.RecordBatch, topic: str | None, seg_first: int, skip: list[bool] | None,
                     tracker: DeliveryTracker, scrub: Callable[[str], str]) -> int:
        """Hand one WAL segment's records (a normalised batch) over in order, except those marked in ``skip``
        (already delivered: recorded as acknowledged); returns how many were handed over. Blocks (serving
        reports) while librdkafka's queue is full: nothing is dropped. A refused record raises
        :func:`refused`'s error kind; the records before it stay handed over."""
        ...

    def poll(self, timeout: float = 0) -> int: ...

    def flush(self, timeout: float = -1) -> int: ...

    def __len__(self) -> int: ...

    def purge(self) -> None: ...

    def connect(self, timeout_s: float, topic: str | None = None) -> str | None:
        """Wait until a broker answers a metadata request (about ``topic`` where given): None, or why not.

        A transactional producer looks for its coordinator when ``init_transactions()`` is called, and librdkafka
        retries that search only after 500 ms if no broker was connected yet, which a new producer never is."""
        ...

    def partition_count(self, topic: str, timeout_s: float) -> tuple[int, str | None]:
        """A topic's partition count from the cluster's metadata: (count, None), or (-1, why not)."""
        ...

    # exactly_once: the transaction calls, with confluent-kafka's names and errors (KafkaException).
    def init_transactions(self, timeout_s: float) -> None: ...

    def begin_transaction(self) -> None: ...

    def send_marker(self, group: str, topic: str, partition: int, offset: int, metadata: str,
                    timeout_s: float) -> None:
        """The commit marker: ``group``'s offset of (topic, partition), inside the open transaction."""
        ...

    def commit_transaction(self, timeout_s: float) -> None: ...

    def abort_transaction(self, timeout_s: float) -> None: ...


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
             scrub: Callable[[str], str], tracker: DeliveryTracker | None = None) -> Exception:
    err = exc.args[0]
    where = f"record {position} to topic {topic}" + (f" partition {partition}" if partition >= 0 else "")
    if err.code() == KafkaError._STATE:
        # A transaction that an earlier delivery failure made abortable refuses every later record: that failure
        # is the cause, not this record.
        cause = tracker.first_error() if tracker is not None else None
        return DeliveryError(f"the transaction stopped taking records after an earlier error"
                             f"{' (the first failed delivery: ' + scrub(cause) + ')' if cause else ''}: "
                             f"{err.name()}: {scrub(err.str())}; {where} is not at fault")
    if err.code() in (KafkaError.MSG_SIZE_TOO_LARGE, KafkaError._UNKNOWN_PARTITION, KafkaError._UNKNOWN_TOPIC,
                      KafkaError._INVALID_ARG):
        return RecordError(f"{where} was refused by the producer: {err.name()}: {scrub(err.str())}")
    if err.fatal() or err.code() in (KafkaError._FATAL, KafkaError._FENCED):
        return FatalProducerError(f"{where} could not be queued: fatal producer error: {err.name()}: "
                                  f"{scrub(err.str())}")
    return DeliveryError(f"{where} could not be queued: {err.name()}: {scrub(err.str())}")
