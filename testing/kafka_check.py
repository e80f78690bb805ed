"""An independent reader of what landed in a topic: a plain confluent-kafka consumer that knows nothing of
``recoverable_sink`` (so a bug there cannot hide itself here). It reads every partition up to the end offsets
taken when it starts, so it stops on a condition, not on an idle timeout."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition


def _consumer(bootstrap: str, group_prefix: str, isolation: str = "read_committed") -> Consumer:
    return Consumer({
        "bootstrap.servers": bootstrap,
        "isolation.level": isolation,  # librdkafka's default too; read_uncommitted also shows aborted records
        "group.id": f"{group_prefix}-{uuid.uuid4().hex}",  # a fresh group: no committed offsets to resume from
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "enable.partition.eof": False,
    })


# A partition's leader answers these until it can serve offsets: just after an election, a new leader's high
# watermark has not caught up (OFFSET_NOT_AVAILABLE, KIP-207), which a chaos scenario's broker kill brings about.
_NOT_YET = (KafkaError.OFFSET_NOT_AVAILABLE, KafkaError.LEADER_NOT_AVAILABLE, KafkaError.NOT_LEADER_FOR_PARTITION)


def _watermarks(consumer: Consumer, topic: str, partition: int, timeout_s: float) -> tuple[int, int]:
    """(low, high) of one partition, asked again while its leader is not ready, until ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return consumer.get_watermark_offsets(TopicPartition(topic, partition),
                                                  timeout=max(0.1, deadline - time.monotonic()))
        except KafkaException as exc:
            err = exc.args[0]
            if not (err.retriable() or err.code() in _NOT_YET) or time.monotonic() >= deadline:
                raise
            time.sleep(0.1)


def end_offsets(bootstrap: str, topic: str, timeout_s: float = 10) -> dict[int, int]:
    """Each partition's high watermark (the offset the next record will get)."""
    consumer = _consumer(bootstrap, "ends")
    try:
        meta = consumer.list_topics(topic, timeout=timeout_s).topics[topic]
        if meta.error is not None:
            raise RuntimeError(f"topic {topic}: {meta.error}")
        return {p: _watermarks(consumer, topic, p, timeout_s)[1] for p in sorted(meta.partitions)}
    finally:
        consumer.close()


def count_topic(bootstrap: str, topic: str, timeout_s: float = 10) -> int:
    """Records in a topic by its offsets (no data read): cheap, for progress checks."""
    consumer = _consumer(bootstrap, "count")
    try:
        meta = consumer.list_topics(topic, timeout=timeout_s).topics[topic]
        total = 0
        for p in meta.partitions:
            low, high = _watermarks(consumer, topic, p, timeout_s)
            total += high - low
        return total
    finally:
        consumer.close()


def read_topic(bootstrap: str, topic: str, timeout_s: float = 60, expected: int | None = None,
               isolation: str = "read_committed") -> list[dict[str, Any]]:
    """Every record of ``topic``, as dicts with key, value (bytes or None), topic, partition, offset,
    timestamp (ms) and headers (list of (str, bytes | None) or None).

    The end of each partition is its high watermark read at the start. With ``expected``, first waits (up to
    ``timeout_s``) until the watermarks add up to at least that many records, then reads whatever is there:
    the caller compares counts. Raises TimeoutError if a partition cannot be read to its end in time."""
    return [{"key": msg.key(), "value": msg.value(), "topic": msg.topic(), "partition": msg.partition(),
             "offset": msg.offset(), "timestamp": msg.timestamp()[1], "headers": msg.headers()}
            for msg in _messages(bootstrap, topic, timeout_s, expected, isolation)]


def count_records(bootstrap: str, topic: str, timeout_s: float = 300, isolation: str = "read_committed") -> int:
    """How many records a consumer with ``isolation`` reads from ``topic``: unlike :func:`count_topic`, not
    counting transaction markers, nor (read_committed) aborted records."""
    return sum(1 for _ in _messages(bootstrap, topic, timeout_s, None, isolation))


def _messages(bootstrap: str, topic: str, timeout_s: float, expected: int | None, isolation: str) -> Iterator[Any]:
    deadline = time.monotonic() + timeout_s
    ends = end_offsets(bootstrap, topic)
    while expected is not None and sum(ends.values()) < expected and time.monotonic() < deadline:
        time.sleep(0.2)
        ends = end_offsets(bootstrap, topic)

    consumer = _consumer(bootstrap, "check", isolation)
    try:
        todo = {p for p, end in ends.items() if end > 0}
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in sorted(todo)])
        while todo:
            if time.monotonic() > deadline:
                raise TimeoutError(f"topic {topic}: partitions {sorted(todo)} not read to their end "
                                   f"{ {p: ends[p] for p in todo} } in {timeout_s}s")
            for msg in consumer.consume(10_000, timeout=0.5):
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        continue
                    raise RuntimeError(f"topic {topic}: {err.str()}")
                if msg.offset() >= ends[msg.partition()]:
                    continue  # written after we took the end offsets: not ours to count
                yield msg
            # The position, not the last record's offset: a transaction marker can be a partition's last offset
            # and is never delivered as a record.
            for tp in consumer.position([TopicPartition(topic, p) for p in todo]):
                if tp.offset >= ends[tp.partition]:
                    todo.discard(tp.partition)
    finally:
        consumer.close()


def _named_in_internal_topic(bootstrap: str, topic: str, prefix: str, timeout_s: float) -> set[str]:
    """Names starting with ``prefix`` that an internal, compacted topic still holds: each key of
    ``__transaction_state`` and ``__consumer_offsets`` is a version int16, then the name as an int16-length
    string; a name whose newest record is a tombstone is gone."""
    consumer = _consumer(bootstrap, "internal", "read_uncommitted")
    try:
        meta = consumer.list_topics(topic, timeout=timeout_s).topics.get(topic)
        if meta is None or meta.error is not None:
            return set()  # nothing was ever written there on this cluster
        ends = {p: _watermarks(consumer, topic, p, timeout_s)[1] for p in meta.partitions}
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p, end in ends.items() if end > 0])
        live: dict[str, bool] = {}
        done = {p for p, end in ends.items() if end == 0}
        deadline = time.monotonic() + timeout_s
        while len(done) < len(ends):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{topic} not read to its end in {timeout_s} s")
            msg = consumer.poll(0.2)
            if msg is None:  # transaction markers end __consumer_offsets' partitions unseen: ask the position
                positions = consumer.position([TopicPartition(topic, p) for p in ends if p not in done])
                done.update(tp.partition for tp in positions if tp.offset >= ends[tp.partition])
                continue
            if msg.error() is not None:
                continue
            key = msg.key() or b""
            name = key[4:4 + int.from_bytes(key[2:4], "big")].decode("utf-8", "replace")
            if name.startswith(prefix):
                live[name] = msg.value() is not None
            if msg.offset() + 1 >= ends[msg.partition()]:
                done.add(msg.partition())
        return {name for name, alive in live.items() if alive}
    finally:
        consumer.close()


def transactional_ids(bootstrap: str, prefix: str, timeout_s: float = 30) -> set[str]:
    """The transactional ids starting with ``prefix`` that the transaction coordinators still keep."""
    return _named_in_internal_topic(bootstrap, "__transaction_state", prefix, timeout_s)


def consumer_groups(bootstrap: str, prefix: str, timeout_s: float = 30) -> set[str]:
    """The consumer groups (the sink's commit markers among them) starting with ``prefix`` that still hold
    offsets or metadata. Read from ``__consumer_offsets``: ListGroups leaves out a group that only ever had
    offsets committed in a transaction, as the sink's markers."""
    return _named_in_internal_topic(bootstrap, "__consumer_offsets", prefix, timeout_s)
