"""The producer interface (executor): what the writers, the transactions and replay ask of a Kafka producer. Two
implementations stand behind it: :mod:`recoverable_sink.producer.native` (the ``_produce`` C extension) and
:mod:`recoverable_sink.producer.confluent` (confluent-kafka's ``Producer``). librdkafka does the retrying
(until ``delivery.timeout.ms``), the idempotent ordering and the murmur2 partitioning in both.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import pyarrow as pa

from recoverable_sink.producer.ledger import Ledger


class SinkProducer(Protocol):
    """A librdkafka producer whose delivery reports go to ``ledger`` (set by the task using it for its duration:
    producers are reused by the tasks a Python worker runs, one at a time): failures by record, successes as the
    written offsets."""

    kind: str  # "native" or "confluent": named in the commit message and the worker's log
    ledger: Ledger | None

    def send_segment(self, batch: pa.RecordBatch, topic: str | None, seg_first: int, skip: list[bool] | None,
                     ledger: Ledger, scrub: Callable[[str], str]) -> int:
        """Hand one WAL segment's records (a normalised batch) over in order through
        :meth:`Ledger.handing_over`, except those marked in ``skip`` (already delivered: booked as acknowledged);
        returns how many were handed over. Blocks (serving reports) while librdkafka's queue is full: nothing is
        dropped. A refused record raises :func:`~recoverable_sink.producer.failures.refused`'s error kind; the
        records before it stay handed over."""
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
