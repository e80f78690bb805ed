"""The confluent-kafka producer (executor): the sink's producer interface over a confluent-kafka ``Producer`` it
holds, one ``produce()`` call per record. It runs where the ``_produce`` extension is not built (``--py-files``, no C
compiler) or ``producer.native=false``; failure reports are matched to records by content (topic, key, value).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from operator import length_hint
from typing import Any

import pyarrow as pa
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from recoverable_sink._logging import get_logger
from recoverable_sink.producer.arguments import KafkaRecords, to_records
from recoverable_sink.producer.failures import fatal_errors, refused
from recoverable_sink.producer.ledger import Ledger

FailureReport = Callable[[KafkaError | None, Message], None]  # confluent-kafka's on_delivery


class ConfluentProducer:
    """The sink's producer interface over a librdkafka client it holds (``client``): confluent-kafka's ``Producer``
    (:meth:`open`), or a test's stand-in with its calls (``produce``, ``poll``, ``flush``, ``len()``, ``purge``,
    ``list_topics`` and the transaction calls). The client reports failed deliveries only, to the ledger of the task
    using this producer (``ledger``). Records go to the client's own ``produce``, no Python call of ours between."""

    kind = "confluent"

    def __init__(self, make_client: Callable[[FailureReport], Any], client_conf: dict[str, Any] | None = None) -> None:
        """``make_client(on_failure)``: the client, made to report its failed deliveries to ``on_failure``."""
        # A plain function over a one-item list: the client holds its callback, and a callback holding the
        # producer (a bound method) would make a cycle that only the garbage collector breaks.
        slot: list[Ledger | None] = [None]

        def on_failure(err: KafkaError | None, msg: Message) -> None:
            ledger = slot[0]
            if ledger is None:
                return
            if err is not None:
                ledger.on_failure(err, msg)
            else:
                ledger.on_acknowledged(msg.topic(), msg.partition(), msg.offset())

        self.client = make_client(on_failure)
        self._slot = slot
        self._client_conf = client_conf  # for the consumer that carries a commit marker's group metadata

    @classmethod
    def open(cls, conf: dict[str, Any], client_conf: dict[str, Any] | None = None) -> ConfluentProducer:
        """confluent-kafka's producer with configuration ``conf``, reporting every delivery (a success gives its
        record's offset to the write's summary); librdkafka's log lines go to the sink's logger (served by poll), as
        the native producer's do."""
        return cls(lambda on_failure: Producer({**conf, "delivery.report.only.error": False, "on_delivery": on_failure,
                                                "logger": get_logger("librdkafka")}), client_conf)

    @property
    def ledger(self) -> Ledger | None:
        return self._slot[0]

    @ledger.setter
    def ledger(self, ledger: Ledger | None) -> None:
        self._slot[0] = ledger

    def send_segment(self, batch: pa.RecordBatch, topic: str | None, seg_first: int, skip: list[bool] | None,
                     ledger: Ledger, scrub: Callable[[str], str]) -> int:
        return produce(self.client, to_records(batch), topic, seg_first, skip, ledger, scrub,
                       lambda: to_records(batch))

    def poll(self, timeout: float = 0) -> int:
        return self.client.poll(timeout)

    def flush(self, timeout: float = -1) -> int:
        return self.client.flush(timeout)

    def __len__(self) -> int:
        return len(self.client)

    def purge(self) -> None:
        self.client.purge()

    def connect(self, timeout_s: float, topic: str | None = None) -> str | None:
        try:
            self.client.list_topics(topic, timeout=timeout_s)
        except KafkaException as exc:
            return str(exc)
        return None

    def partition_count(self, topic: str, timeout_s: float) -> tuple[int, str | None]:
        meta = self.client.list_topics(topic, timeout=timeout_s).topics.get(topic)
        if meta is None or meta.error is not None:
            return -1, meta.error.str() if meta is not None and meta.error is not None else "no metadata"
        return len(meta.partitions), None

    def init_transactions(self, timeout_s: float) -> None:
        self.client.init_transactions(timeout_s)

    def begin_transaction(self) -> None:
        self.client.begin_transaction()

    def send_marker(self, group: str, topic: str, partition: int, offset: int, metadata: str,
                    timeout_s: float) -> None:
        """confluent-kafka takes a group's metadata only from a consumer (which never subscribes here)."""
        assert self._client_conf is not None, "a transactional producer is made with its client configuration"
        consumer = Consumer({**self._client_conf, "group.id": group, "enable.auto.commit": "false"})
        try:
            marker = TopicPartition(topic, partition, offset, metadata)
            self.client.send_offsets_to_transaction([marker], consumer.consumer_group_metadata(), timeout_s)
        finally:
            consumer.close()

    def commit_transaction(self, timeout_s: float) -> None:
        self.client.commit_transaction(timeout_s)

    def abort_transaction(self, timeout_s: float) -> None:
        self.client.abort_transaction(timeout_s)


# produce()'s own defaults for its optional positional arguments: key, partition, on_delivery, callback,
# timestamp, headers.
_DEFAULTS: tuple[object, ...] = (None, -1, None, None, 0, None)


def produce(producer: Producer, records: KafkaRecords, topic: str | None, seg_first: int,
            skip: list[bool] | None, ledger: Ledger, scrub: Callable[[str], str],
            recompute: Callable[[], KafkaRecords] | None = None) -> int:
    """Hand one segment's records to the producer, except those marked in ``skip`` (already delivered),
    which are booked as acknowledged. Returns how many were handed over. ``recompute`` gives the records
    again if a failure report must be matched (default: keep ``records`` until the next drain).

    Blocks (serving reports) while librdkafka's local queue is full: nothing is dropped, and records keep
    their order. This is the hot loop of the sink: one ``produce`` call per record, no per-record callback,
    and no per-record Python bytecode either (``map`` drives the calls from C, about 2x a ``for`` loop)."""
    n = len(records)
    with ledger.handing_over(seg_first, n, skip, topic, recompute or (lambda: records)) as handover:
        columns = _arguments(records, topic, handover.rows)
        with fatal_errors():
            try:
                _send_in_order(producer, columns)
                handover.taken = handover.count
            except _Stopped as stop:
                handover.taken = stop.index
                if isinstance(stop.exc, KafkaException):
                    partition = columns[3][stop.index] if len(columns) > 3 else -1
                    raise refused(stop.exc, handover.position(stop.index), columns[0][stop.index], partition, scrub,
                                  ledger.first_error()) from None
                raise stop.exc  # noqa: B904 - as it was: fatal_errors() reads a SystemError's cause
            producer.poll(0)
    return handover.taken


def _arguments(records: KafkaRecords, topic: str | None, rows: list[int] | None) -> list[list[Any]]:
    """``produce()``'s positional arguments, column by column (cheaper than keywords): topic, value, then key,
    partition (-1: the partitioner picks), on_delivery (None: the producer's failure report), callback (unused
    alias), timestamp (0: unset), headers; only as far as the last one the records set: each argument left out
    is one less to parse (topic, value and key alone make a call about 15% cheaper than all eight). ``rows``: the
    records to send, when not all."""
    n = len(records)
    optional = [
        records.keys,
        [-1 if p is None else p for p in records.partitions] if records.partitions is not None else None,
        None,
        None,
        [0 if t is None else t for t in records.timestamps] if records.timestamps is not None else None,
        records.headers,
    ]
    given = max((i + 1 for i, column in enumerate(optional) if column is not None), default=0)
    columns = [records.topics if records.topics is not None else [topic] * n, records.values]
    columns += [column if column is not None else [_DEFAULTS[i]] * n for i, column in enumerate(optional[:given])]
    if rows is not None:
        columns = [[column[i] for i in rows] for column in columns]
    return columns


class _Stopped(Exception):
    """``exc`` stopped the sending at row ``index``: the rows before it were handed over, it and later ones not."""

    def __init__(self, index: int, exc: BaseException) -> None:
        super().__init__(index)
        self.index = index
        self.exc = exc


def _send_in_order(producer: Producer, columns: list[list[Any]]) -> None:
    """Call ``produce`` once per row of ``columns`` (its positional arguments, column by column), from C.
    When librdkafka's queue is full the row that did not fit is retried (serving reports) before any later
    row is tried, so rows are handed over in order. Raises _Stopped when anything else stops it."""
    send = producer.produce
    count = len(columns[1])
    rows = [iter(column) for column in columns]
    while True:
        try:
            deque(map(send, *rows), maxlen=0)
            return
        except BaseException as exc:
            # map took row i from every column before its call failed: the rest is what the columns have left.
            i = count - length_hint(rows[1]) - 1
            if not isinstance(exc, BufferError):
                raise _Stopped(i, exc) from None
            try:
                _send_when_room(producer, *(column[i] for column in columns))
            except BaseException as failed:
                raise _Stopped(i, failed) from None


def _send_when_room(producer: Producer, *record: object) -> None:
    """librdkafka's local queue is full: serve reports until it takes the record (nothing is dropped)."""
    while True:
        producer.poll(0.05)
        try:
            producer.produce(*record)
            return
        except BufferError:
            continue
