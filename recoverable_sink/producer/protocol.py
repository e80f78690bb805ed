"""The producer interface (executor): what the writers, the transactions and replay ask of a Kafka producer. Two
implementations stand behind it: :mod:`recoverable_sink.producer.native` (the ``_produce`` C extension) and
:mod:`recoverable_sink.producer.confluent` (confluent-kafka's ``Producer``). librdkafka does the retrying
(until ``delivery.timeout.ms``), the idempotent ordering and the murmur2 partitioning in both.
"""

from __future__ import annotations

from typing import Protocol

import pyarrow as pa
from confluent_kafka import KafkaError

from recoverable_sink.producer.reports import Reports


class SinkProducer(Protocol):
    """A librdkafka producer that keeps its delivery reports until they are taken (:meth:`take_reports`). Producers
    are reused by the tasks a Python worker runs, one at a time; a task's
    :class:`~recoverable_sink.producer.ledger.Ledger` sends through one and drains its reports."""

    kind: str  # "native" or "confluent": named in the commit message and the worker's log

    def send(self, batch: pa.RecordBatch, topic: str | None, slot: int, rows: list[int] | None) -> int:
        """Hand the batch's records (a normalised batch; only ``rows`` of it where given) over in order, each
        tagged with ``slot`` and its index among those handed over, so a failure report names it; returns how many
        were handed over (all). Blocks (serving reports) while librdkafka's queue is full: nothing is dropped.
        Raises :class:`~recoverable_sink.producer.reports.Stopped` where it stopped before the last record."""
        ...

    def take_reports(self) -> Reports:
        """The reports collected (by ``poll``, ``flush`` and waits for room) since the last call."""
        ...

    def poll(self, timeout: float = 0) -> int: ...

    def flush(self, timeout: float = -1) -> int: ...

    def __len__(self) -> int: ...

    def purge(self) -> None: ...

    def close_logs(self) -> None:
        """Say the repeats of librdkafka's log lines not said yet (a count per kind): before the producer is
        dropped."""
        ...

    def connect(self, timeout_s: float, topic: str | None = None) -> str | None:
        """Wait until a broker answers a metadata request (about ``topic`` where given): None, or why not.

        A transactional producer looks for its coordinator when ``init_transactions()`` is called, and librdkafka
        retries that search only after 500 ms if no broker was connected yet, which a new producer never is."""
        ...

    def partition_count(self, topic: str, timeout_s: float) -> tuple[int, KafkaError | None]:
        """A topic's partition count from the cluster's metadata: (count, None), or (-1, the error)."""
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
