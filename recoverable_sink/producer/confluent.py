"""The confluent-kafka producer (executor): the sink's producer interface over a confluent-kafka ``Producer`` it
holds, one ``produce()`` call per record. It runs where the ``_produce`` extension is not built (``--py-files``, no C
compiler) or ``producer.native=false``; failure reports are matched to records by content (topic, key, value).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from operator import length_hint
from typing import Any, Protocol

import pyarrow as pa
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from recoverable_sink.offsets import WrittenOffsets
from recoverable_sink.producer.arguments import KafkaRecords, to_records
from recoverable_sink.producer.client_log import ClientLogger, RepeatSummary
from recoverable_sink.producer.reports import Failure, Reports, Stopped

FailureReport = Callable[[KafkaError | None, Message], None]  # confluent-kafka's on_delivery


class Client(Protocol):
    """What :class:`ConfluentProducer` calls on its client: confluent-kafka's ``Producer``, or a test's stand-in."""

    def produce(self, *args: Any, **kwargs: Any) -> None: ...
    def poll(self, timeout: float = ...) -> int: ...
    def flush(self, timeout: float = ...) -> int: ...
    def __len__(self) -> int: ...
    def purge(self) -> None: ...
    def list_topics(self, topic: str | None = ..., timeout: float = ...) -> Any: ...
    def init_transactions(self, timeout: float = ...) -> None: ...
    def begin_transaction(self) -> None: ...
    def send_offsets_to_transaction(self, positions: list[TopicPartition], group_metadata: Any,
                                    timeout: float = ...) -> None: ...
    def commit_transaction(self, timeout: float = ...) -> None: ...
    def abort_transaction(self, timeout: float = ...) -> None: ...


class _Inbox:
    """What the client's delivery callback left since the reports were last taken: failures by content (topic,
    key, value: confluent-kafka's reports carry no record number) and acknowledged offsets."""

    def __init__(self) -> None:
        self.failures: list[tuple[tuple[str | None, bytes | None, bytes | None], KafkaError, int]] = []
        self.written = WrittenOffsets()
        self.complete = True  # False once a record was acknowledged without an offset (the figures are partial)

    def report(self, err: KafkaError | None, msg: Message) -> None:
        topic, partition = msg.topic(), msg.partition()
        if err is not None:
            self.failures.append(((topic, msg.key(), msg.value()), err, -1 if partition is None else partition))
            return
        offset = msg.offset()  # None where librdkafka had no offset (RD_KAFKA_OFFSET_INVALID), as the C loop sees it
        if topic is None or partition is None or offset is None:
            self.complete = False
        else:
            self.written.add(topic, partition, offset, offset, 1)


@dataclass
class _Sent:
    """A send since the queue was last empty: the records it handed over (``taken``), to match reports against."""

    slot: int
    batch: pa.RecordBatch
    topic: str | None
    rows: list[int] | None
    taken: int


class ConfluentProducer:
    """The sink's producer interface over a librdkafka client it holds (``client``): confluent-kafka's ``Producer``
    (:meth:`open`), or a test's stand-in with its calls (``produce``, ``poll``, ``flush``, ``len()``, ``purge``,
    ``list_topics`` and the transaction calls). Records go to the client's own ``produce``, no Python call of ours
    between. Its reports name records by content; :meth:`take_reports` matches them to the sends since the queue
    was last empty, counting every record of a failed content as failed (possibly one more copy sent again, never
    one lost)."""

    kind = "confluent"

    def __init__(self, make_client: Callable[[FailureReport], Client], client_conf: dict[str, Any] | None = None,
                 logs: RepeatSummary | None = None) -> None:
        """``make_client(on_delivery)``: the client, made to report its deliveries to ``on_delivery``; ``logs``: where
        it sends librdkafka's lines, if anywhere."""
        # The client holds a bound method of the inbox, not of this producer: no cycle for the garbage collector.
        self._inbox = _Inbox()
        self._logs = logs
        self.client = make_client(self._inbox.report)
        self._client_conf = client_conf  # for the consumer that carries a commit marker's group metadata
        self._sent: list[_Sent] = []
        self._reported: set[tuple[int, int]] = set()  # (slot, index) already reported failed since the last drain

    @classmethod
    def open(cls, conf: dict[str, Any], client_conf: dict[str, Any] | None = None) -> ConfluentProducer:
        """confluent-kafka's producer with configuration ``conf``, reporting every delivery (a success gives its
        record's offset to the write's summary); librdkafka's log lines go to the sink's logger (served by poll), their
        repeats summarised, as the native producer's do."""
        logs = RepeatSummary()
        return cls(lambda on_delivery: Producer({**conf, "delivery.report.only.error": False,
                                                 "on_delivery": on_delivery, "logger": ClientLogger(logs)}),
                   client_conf, logs)

    def send(self, batch: pa.RecordBatch, topic: str | None, slot: int, rows: list[int] | None) -> int:
        """One ``produce`` call per record, driven from C; a refused record stops the send there."""
        records = to_records(batch)
        columns = _arguments(records, topic, rows)
        count = len(columns[1])
        try:
            _send_in_order(self.client, columns)
        except Stopped as stop:
            if stop.index:
                self._sent.append(_Sent(slot, batch, topic, rows, stop.index))
            partition = columns[3][stop.index] if len(columns) > 3 else -1
            raise Stopped(stop.index, stop.cause, columns[0][stop.index], partition) from None
        self._sent.append(_Sent(slot, batch, topic, rows, count))
        return count

    def take_reports(self) -> Reports:
        inbox = self._inbox
        reports = Reports(written=list(inbox.written.ranges()), complete=inbox.complete)
        if inbox.failures:
            reports.failures = self._match(inbox.failures)
        inbox.failures, inbox.written, inbox.complete = [], WrittenOffsets(), True
        if self._sent and len(self.client) == 0:  # every record sent so far has had its report
            self._sent.clear()
            self._reported.clear()
        return reports

    def _match(self, failed: list[tuple[tuple[str | None, bytes | None, bytes | None], KafkaError, int]]
               ) -> list[Failure]:
        """The records of the sends since the queue was last empty whose content a failure report named."""
        errors = {content: (err, partition) for content, err, partition in failed}
        out = []
        unmatched = set(errors)
        for sent in self._sent:
            records = to_records(sent.batch)
            n = len(records)
            topics: Sequence[str | None] = [sent.topic] * n if not records.topics else records.topics
            fields = list(zip(topics, records.keys or [None] * n, records.values, strict=True))
            chosen = fields if sent.rows is None else [fields[i] for i in sent.rows]
            for i, (t, k, v) in enumerate(chosen[:sent.taken]):
                found = errors.get((t, _b(k), _b(v)))
                if found is not None:
                    unmatched.discard((t, _b(k), _b(v)))
                    if (sent.slot, i) not in self._reported:
                        self._reported.add((sent.slot, i))
                        out.append(Failure(sent.slot, i, found[0], t, found[1]))
        if unmatched:  # a report naming no record sent since the queue was empty: trust none of them
            err, partition = errors[next(iter(unmatched))]
            for sent in self._sent:
                for i in range(sent.taken):
                    if (sent.slot, i) not in self._reported:
                        self._reported.add((sent.slot, i))
                        out.append(Failure(sent.slot, i, err, sent.topic, partition))
        return out

    def poll(self, timeout: float = 0) -> int:
        try:
            return self.client.poll(timeout)
        finally:
            if self._logs is not None:
                self._logs.due()

    def flush(self, timeout: float = -1) -> int:
        try:
            return self.client.flush(timeout)
        finally:
            if self._logs is not None:
                self._logs.due()

    def close_logs(self) -> None:
        if self._logs is not None:
            self._logs.flush()

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

    def partition_count(self, topic: str, timeout_s: float) -> tuple[int, KafkaError | None]:
        meta = self.client.list_topics(topic, timeout=timeout_s).topics.get(topic)
        if meta is None:
            return -1, KafkaError(KafkaError._UNKNOWN_TOPIC, "not in the cluster's metadata")
        if meta.error is not None:
            return -1, meta.error
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


def _b(data: str | bytes | None) -> bytes | None:
    """A field as the producer sent it (str is sent as UTF-8)."""
    return data.encode() if isinstance(data, str) else data


# produce()'s own defaults for its optional positional arguments: key, partition, on_delivery, callback,
# timestamp, headers.
_DEFAULTS: tuple[object, ...] = (None, -1, None, None, 0, None)


def _arguments(records: KafkaRecords, topic: str | None, rows: list[int] | None) -> list[list[Any]]:
    """``produce()``'s positional arguments, column by column (cheaper than keywords): topic, value, then key,
    partition (-1: the partitioner picks), on_delivery (None: the producer's failure report), callback (unused
    alias), timestamp (0: unset), headers; only as far as the last one the records set: each argument left out
    is one less to parse (docs/performance.md, "confluent-kafka's path"). ``rows``: the
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
    columns: list[list[Any]] = [[topic] * n if records.topics is None else records.topics, records.values]
    columns += [column if column is not None else [_DEFAULTS[i]] * n for i, column in enumerate(optional[:given])]
    if rows is not None:
        columns = [[column[i] for i in rows] for column in columns]
    return columns


def _send_in_order(producer: Client, columns: list[list[Any]]) -> None:
    """Call ``produce`` once per row of ``columns`` (its positional arguments, column by column), from C.
    When librdkafka's queue is full the row that did not fit is retried (serving reports) before any later
    row is tried, so rows are handed over in order. Raises Stopped when anything else stops it."""
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
                raise Stopped(i, exc) from None
            try:
                _send_when_room(producer, *(column[i] for column in columns))
            except BaseException as failed:
                raise Stopped(i, failed) from None


def _send_when_room(producer: Client, *record: Any) -> None:
    """librdkafka's local queue is full: serve reports until it takes the record (nothing is dropped)."""
    while True:
        producer.poll(0.05)
        try:
            producer.produce(*record)
            return
        except BufferError:
            continue
