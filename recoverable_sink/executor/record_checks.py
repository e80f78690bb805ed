"""Records Kafka would refuse, rejected before any of a batch enters the WAL (executor): the one home of record
validation. Null topics, negative or out-of-range partitions, null header keys, timestamps before the epoch, and
records larger than the producer or the topic takes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from recoverable_sink.errors import RecordError, UnknownTopicError

# librdkafka refuses a record when this plus its key, value and serialised headers exceed message.max.bytes
# (RD_KAFKAP_MESSAGE_V2_MAX_OVERHEAD: the largest varints of length, timestamp and offset deltas, key and value
# lengths and header count, plus the attributes byte).
_RECORD_OVERHEAD = 36
# A broker refuses a record batch larger than the topic's max.message.bytes. A batch of one record is at least
# its key, value and headers plus 68 bytes (61 of v2 batch header, 7 of the smallest record framing), so a
# record whose _RECORD_OVERHEAD-based size exceeds max.message.bytes - 32 is refused by the broker for sure.
TOPIC_BATCH_FRAMING = 61 + 7 - _RECORD_OVERHEAD


def _first(mask: pa.Array) -> int | None:
    """Index of the first true value of a boolean array, or None."""
    if not pc.any(mask).as_py():
        return None
    index: int = pc.index(mask, True).as_py()
    return index


@dataclass(frozen=True)
class Refusal:
    """Records of a batch that Kafka would refuse for one reason: ``kind`` names the reason as a class (what a
    dead-letter record's headers and the write's summary count), ``stage`` is Kafka Connect's name for where it
    showed, ``rows`` the records (a boolean mask), ``message(row)`` the sentence that names one of them."""

    kind: str
    stage: str
    rows: pa.Array
    message: Callable[[int], str]

    def first(self) -> int | None:
        return _first(self.rows)


_PRODUCE = "KAFKA_PRODUCE"


class Destinations(Protocol):
    """What the checks ask about a record's destination topic, once per topic (a task's answers are the cluster's:
    :class:`recoverable_sink.executor.partition_writer.TaskDestinations`)."""

    def partitions(self, topic: str) -> int:
        """The topic's partition count; raises :class:`UnknownTopicError` for a topic that does not exist."""
        ...

    def limit(self, topic: str) -> tuple[int, str]:
        """The largest record (as sized here) the producer and the topic accept, and where that limit comes from."""
        ...


@dataclass(frozen=True)
class Fixed:
    """The same answers for every topic (tests, benchmarks, the doctests)."""

    count: int = 1
    max_message_bytes: int = 1_000_000

    def partitions(self, topic: str) -> int:
        return self.count

    def limit(self, topic: str) -> tuple[int, str]:
        return self.max_message_bytes, f"the producer's message.max.bytes={self.max_message_bytes}"


def check_batch(batch: pa.RecordBatch, topic_option: str | None, where: str, first_position: int,
                destinations: Destinations) -> None:
    """Reject a normalised batch holding a record Kafka would refuse, before any of it enters the WAL: the first
    refusal :func:`find_refusals` finds, named with its record's position.

    >>> b = pa.RecordBatch.from_pydict({"value": [b"x"], "partition": pa.array([-1], pa.int32())})
    >>> check_batch(b, "t", "partition 0", 10, Fixed(3, 1000))
    Traceback (most recent call last):
    ...
    recoverable_sink.errors.RecordError: partition 0, record 10: partition -1 is negative
    """
    for refusal in find_refusals(batch, topic_option, destinations):
        row = refusal.first()
        if row is not None:
            raise RecordError(f"{where}, record {first_position + row}: {refusal.message(row)}")


def find_refusals(batch: pa.RecordBatch, topic_option: str | None, destinations: Destinations) -> list[Refusal]:
    """Every reason Kafka would refuse records of a normalised batch, in the order they are checked, each with the
    records it refuses (a record may appear under several).

    What depends on a record's destination (the partitions it has, the largest record it takes) is its own topic's,
    whether the topic comes from the option or a column; ``destinations`` answers once per topic. The partition count
    is asked only where the batch routes by a topic column or names explicit partitions (the topic option's is the
    driver's to check)."""
    names = batch.schema.names
    found: list[Refusal] = []

    def add(kind: str, rows: pa.Array, message: Callable[[int], str], stage: str = _PRODUCE) -> None:
        rows = pc.fill_null(rows, False)
        if pc.any(rows).as_py():
            found.append(Refusal(kind, stage, rows, message))

    topics = batch.column("topic") if "topic" in names else None
    if topics is not None:
        add("NullTopic", pc.is_null(topics),
            lambda row: "topic is null and no topic option is set; fill the topic column or set the topic option")
    parts = batch.column("partition") if "partition" in names else None
    if parts is not None:
        add("NegativePartition", pc.less(parts, 0), lambda row: f"partition {parts[row].as_py()} is negative")
    if "headers" in names:
        headers = batch.column("headers")
        flat = pc.list_flatten(headers)
        if len(flat):
            null_key = pc.fill_null(pc.is_null(pc.struct_field(flat, "key")), False)
            if pc.any(null_key).as_py():
                rows = np.zeros(batch.num_rows, dtype=bool)
                rows[pc.filter(pc.list_parent_indices(headers), null_key).to_numpy()] = True
                add("NullHeaderKey", pa.array(rows),
                    lambda row: "a header has a null key; Kafka header keys must be strings")
    if "timestamp" in names:
        stamps = batch.column("timestamp")
        add("TimestampBeforeEpoch", pc.less(stamps, 1), lambda row: (
            f"timestamp {stamps[row].as_py()} ms is not after 1970-01-01T00:00:00Z; librdkafka reads 0 as \"now\" "
            "and Kafka refuses earlier times, so it cannot be sent as it is: use null (the producer stamps the "
            "record) or a later time"))
    distinct: list[str] = ([topic_option] if topic_option is not None else []) if topics is None else \
        [t for t in pc.unique(topics).to_pylist() if t is not None]
    masks = {t: pa.array(np.ones(batch.num_rows, dtype=bool)) if topics is None else pc.equal(topics, t)
             for t in distinct}
    bound = _largest_record_bound(batch)
    size: pa.Array | None = None
    for topic, in_topic in masks.items():
        limit, limit_name = destinations.limit(topic)
        if bound > limit:
            size = _record_sizes(batch) if size is None else size
            add("RecordTooLarge", pc.and_(pc.greater(size, limit), in_topic), _too_large(batch, size, limit_name))
    if topics is None and parts is None:
        return found  # the topic option was checked on the driver
    for topic, in_topic in masks.items():
        try:
            count = destinations.partitions(topic)
        except UnknownTopicError as exc:
            if topics is None:
                raise  # the topic option's own topic (checked on the driver) is gone: no record is at fault
            add("UnknownTopic", in_topic, _said(str(exc)))
            continue
        if parts is not None:
            add("PartitionOutOfRange", pc.and_(pc.greater_equal(parts, count), in_topic),
                _out_of_range(parts, topic, count))
    return found


# Messages made by a function rather than a lambda in the loop: called later, each keeps its own values.
def _said(text: str) -> Callable[[int], str]:
    return lambda row: text


def _too_large(batch: pa.RecordBatch, size: pa.Array, limit: str) -> Callable[[int], str]:
    what = "key+value+headers" if "headers" in batch.schema.names else "key+value"
    return lambda row: (f"{what} with the record framing is {size[row].as_py()} bytes, more than {limit}; raise "
                        "kafka.message.max.bytes and the topic's max.message.bytes, or make the record smaller")


def _out_of_range(parts: pa.Array, topic: str, count: int) -> Callable[[int], str]:
    return lambda row: (f"partition {parts[row].as_py()} is out of range for topic {topic}, which has {count} "
                        f"partitions (0..{count - 1}); fix the partition column or drop it")


def _largest_record_bound(batch: pa.RecordBatch) -> int:
    """No record of the batch is larger than this (as :func:`_record_sizes` counts): the longest key and value,
    and as many of the longest header as the most headers a record has. Sizing every record's headers costs a
    visible share of a worker's CPU (docs/performance.md, "Records sized only near the limit"); this bound takes a
    few Arrow passes and clears an ordinary batch at once, so the exact sizes are left for batches near the
    limit."""
    names = batch.schema.names
    bound = _RECORD_OVERHEAD + _longest(batch.column("value"))
    if "key" in names:
        bound += _longest(batch.column("key"))
    if "headers" in names:
        headers = batch.column("headers")
        items = headers.flatten()
        most = pc.max(pc.list_value_length(headers)).as_py() or 0
        # A header: its key and value (a null value has none), each after a varint length of at most 5 bytes.
        bound += most * (_longest(pc.struct_field(items, "key")) + _longest(pc.struct_field(items, "value")) + 10)
    return bound


def _longest(column: pa.Array) -> int:
    return pc.max(pc.binary_length(column.cast(pa.binary()))).as_py() or 0


def _record_sizes(batch: pa.RecordBatch) -> pa.Array:
    """Each record's size as librdkafka counts it against message.max.bytes."""
    names = batch.schema.names
    size = pc.add(pc.fill_null(pc.binary_length(batch.column("value").cast(pa.binary())), 0), _RECORD_OVERHEAD)
    if "key" in names:
        size = pc.add(size, pc.fill_null(pc.binary_length(batch.column("key").cast(pa.binary())), 0))
    if "headers" not in names:
        return size
    headers = batch.column("headers")
    items = headers.values  # the whole child array; the offsets below index into it
    key_len = pc.fill_null(pc.binary_length(pc.struct_field(items, "key").cast(pa.binary())), 0).to_numpy()
    value_len = pc.fill_null(pc.binary_length(pc.struct_field(items, "value")), -1).to_numpy()
    # Each header: its key and value, each preceded by a zigzag varint length (a null value is length -1).
    item_size = np.maximum(key_len, 0) + np.maximum(value_len, 0) + _varint_size(key_len) + _varint_size(value_len)
    running = np.concatenate(([0], np.cumsum(item_size, dtype=np.int64)))
    offsets = headers.offsets.to_numpy()
    per_record = np.where(headers.is_valid().to_numpy(zero_copy_only=False),
                          running[offsets[1:]] - running[offsets[:-1]], 0)
    return pc.add(size, pa.array(per_record, pa.int64()))


def _varint_size(n: np.ndarray) -> np.ndarray:
    zigzag = np.where(n >= 0, 2 * n, -2 * n - 1)
    size = np.ones(n.shape, dtype=np.int64)
    for k in range(1, 5):
        size += zigzag >= 1 << (7 * k)
    return size
