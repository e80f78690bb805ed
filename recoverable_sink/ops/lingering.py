"""Lingering transactions (operator tool, used by the CLI): the exactly_once transactions a job left open when it
died, found by their ``transactional.id.prefix``, and aborted.

An open transaction holds back every ``read_committed`` reader of the partitions it wrote to (the last stable
offset stops at its first record) until the brokers abort it after ``transaction.timeout.ms``, or a producer
with the same transactional id starts. The sink's retries do the latter by themselves; a job that is not
re-run leaves the wait. librdkafka has no ListTransactions call, so the coordinators' own log,
``__transaction_state``, is read instead (the principal needs DESCRIBE and READ on that internal topic); aborting
is what a retry does: ``init_transactions`` with the same id, which fences the old producer and aborts.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, Producer, TopicPartition

from recoverable_sink._logging import get_logger
from recoverable_sink.errors import RecoverableSinkError

log = get_logger("lingering")

TRANSACTION_LOG = "__transaction_state"
# The coordinator's transaction states, as stored in its log (TransactionLogValue's status byte).
STATES = {0: "Empty", 1: "Ongoing", 2: "PrepareCommit", 3: "PrepareAbort", 4: "CompleteCommit",
          5: "CompleteAbort", 6: "Dead", 7: "PrepareEpochFence"}


@dataclass(frozen=True)
class TransactionStatus:
    transactional_id: str
    state: str
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    started_ms: int | None = None  # when the current transaction began (epoch ms), where the record says
    updated_ms: int | None = None

    def age_s(self, now_ms: int) -> float | None:
        return None if self.started_ms is None or self.started_ms < 0 else (now_ms - self.started_ms) / 1000


def parse_key(key: bytes) -> str | None:
    """The transactional id of a ``__transaction_state`` key (version int16, then an int16-length string)."""
    if len(key) < 4:
        return None
    length = int.from_bytes(key[2:4], "big", signed=True)
    return key[4:4 + length].decode("utf-8", "replace") if length >= 0 else None


def _uvarint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, at
        shift += 7


def _times(value: bytes) -> tuple[int | None, int | None]:
    """(last update, start) in epoch ms, after the record's partition list: version 0 has fixed-width arrays
    and strings, version 1 compact ones and tagged fields. None where the record is not of either shape."""
    try:
        version, at = int.from_bytes(value[0:2], "big"), 17
        if version == 0:
            count = int.from_bytes(value[at:at + 4], "big", signed=True)
            at += 4
            for _ in range(max(count, 0)):
                at += 2 + int.from_bytes(value[at:at + 2], "big")  # topic
                at += 4 + 4 * int.from_bytes(value[at:at + 4], "big")  # partition ids
        elif version == 1:
            count, at = _uvarint(value, at)
            for _ in range(max(count - 1, 0)):
                length, at = _uvarint(value, at)
                at += length - 1  # topic
                ids, at = _uvarint(value, at)
                at += 4 * (ids - 1)
                tags, at = _uvarint(value, at)
                for _ in range(tags):
                    _, at = _uvarint(value, at)
                    size, at = _uvarint(value, at)
                    at += size
        else:
            return None, None
        updated = int.from_bytes(value[at:at + 8], "big", signed=True)
        started = int.from_bytes(value[at + 8:at + 16], "big", signed=True)
        return (updated, started) if len(value) >= at + 16 else (None, None)
    except IndexError:
        return None, None


def parse_value(tid: str, value: bytes) -> TransactionStatus:
    """A TransactionLogValue: version int16, producer id int64, producer epoch int16, timeout int32, status
    int8 (the same in versions 0 and 1), then the partitions and the last update and start times.

    >>> parse_value("t", bytes.fromhex("0000" "0000000000000007" "0002" "0000ea60" "01" "00000000")
    ...             + (5).to_bytes(8, "big") + (3).to_bytes(8, "big"))
    TransactionStatus(transactional_id='t', state='Ongoing', producer_id=7, producer_epoch=2, timeout_ms=60000, \
started_ms=3, updated_ms=5)
    """
    if len(value) < 17:
        raise ValueError(f"{TRANSACTION_LOG} record of {tid} is too short ({len(value)} bytes)")
    updated, started = _times(value)
    return TransactionStatus(tid, STATES.get(value[16], f"unknown({value[16]})"),
                             int.from_bytes(value[2:10], "big", signed=True),
                             int.from_bytes(value[10:12], "big", signed=True),
                             int.from_bytes(value[12:16], "big", signed=True), started, updated)


def transactions(client: dict[str, str], prefix: str, timeout_s: float = 30) -> list[TransactionStatus]:
    """The newest state of every transactional id starting with ``prefix`` (expired ids left out)."""
    consumer = Consumer({**client, "group.id": f"recoverable-kafka-wal-{time.time_ns()}",
                         "enable.auto.commit": "false", "isolation.level": "read_uncommitted",
                         "enable.partition.eof": "false"})
    try:
        meta = consumer.list_topics(TRANSACTION_LOG, timeout=timeout_s).topics.get(TRANSACTION_LOG)
        if meta is None or meta.error is not None or not meta.partitions:
            return []  # no transactional producer has run on this cluster (or the topic is not visible)
        ends = {}
        for p in meta.partitions:
            _, high = consumer.get_watermark_offsets(TopicPartition(TRANSACTION_LOG, p), timeout=timeout_s)
            ends[p] = high
        consumer.assign([TopicPartition(TRANSACTION_LOG, p, OFFSET_BEGINNING) for p, end in ends.items() if end])
        pending = {p for p, end in ends.items() if end}
        latest: dict[str, TransactionStatus | None] = {}
        deadline = time.monotonic() + timeout_s
        while pending:
            if time.monotonic() > deadline:
                raise RecoverableSinkError(f"{TRANSACTION_LOG} was not read to its end within {timeout_s:.0f} s")
            msg = consumer.poll(0.2)
            if msg is None:
                continue
            if msg.error() is not None:
                raise RecoverableSinkError(f"reading {TRANSACTION_LOG}: {msg.error()} (the principal needs "
                                           "DESCRIBE and READ on it)")
            tid = parse_key(msg.key() or b"")
            if tid is not None and tid.startswith(prefix):
                value = msg.value()
                latest[tid] = parse_value(tid, value) if value is not None else None  # None: expired
            offset, partition = msg.offset(), msg.partition()
            assert offset is not None and partition is not None, "a record read from a partition has both"
            if offset + 1 >= ends[partition]:
                pending.discard(partition)
        return sorted((s for s in latest.values() if s is not None), key=lambda s: s.transactional_id)
    except KafkaException as exc:
        raise RecoverableSinkError(f"reading {TRANSACTION_LOG}: {exc}") from None
    finally:
        consumer.close()


def abort(client: dict[str, str], transactional_id: str, timeout_s: float = 60) -> None:
    """Abort the open transaction of ``transactional_id`` (and fence its producer, should it still run)."""
    producer = Producer({**client, "transactional.id": transactional_id})
    try:
        producer.init_transactions(timeout_s)
    except KafkaException as exc:
        raise RecoverableSinkError(f"aborting the transaction of {transactional_id}: {exc}") from None
    finally:
        producer.flush(0)
