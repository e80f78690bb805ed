"""Consumers of the proof topic (executor and driver): kept per process, each read bounded by a deadline the sink owns;
the ends of a partition, a range of its records, and the directory of where each scope's live proof starts
(:class:`Directory`). What a read makes of the records is :mod:`.read`'s and :mod:`.view`'s."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from recoverable_sink._logging import get_logger
from recoverable_sink.options import KafkaProof, SinkOptions, client_config, short_lived
from recoverable_sink.producer.client_log import ClientLogger, RepeatSummary
from recoverable_sink.proof.format import DirectoryKey, decode_directory, parse_key

log = get_logger("proof")

Feed = Callable[[int, bytes | None, bytes | None], None]


def reader_group(options: SinkOptions) -> str:
    """The group id the proof topic's readers carry: confluent-kafka's consumers need one, though these never join or
    commit; it falls under the ``transactional.id.prefix`` groups the sink is already granted."""
    return f"{options.transactional_id_prefix}proof-reader"


def _new_consumer(options: SinkOptions, committed: bool) -> Consumer:
    # librdkafka's lines on the sink's logger, repeats summarised (with the brokers down, a line per reconnect).
    return Consumer({**short_lived({
        **client_config(options), "group.id": reader_group(options), "enable.auto.commit": "false",
        "isolation.level": "read_committed" if committed else "read_uncommitted", "enable.partition.eof": "true",
        "auto.offset.reset": "earliest", "fetch.wait.max.ms": "10"}), "logger": ClientLogger(RepeatSummary())})


_pool: dict[tuple[tuple[tuple[str, str], ...], str, bool], tuple[Consumer, threading.Lock]] = {}
_pool_lock = threading.Lock()


@contextmanager
def consumer(options: SinkOptions, committed: bool) -> Iterator[Consumer]:
    """A consumer of the proof topic, ``read_committed`` or ``read_uncommitted``, never committing: one per process
    and cluster, kept for the process's later reads (a Python worker's later tasks), since a new one's first fetch
    waits for its connections; used by one reader at a time, and left with nothing assigned."""
    key = (tuple(sorted(client_config(options).items())), reader_group(options), committed)
    with _pool_lock:
        found = _pool.get(key)
        if found is None:
            found = _pool[key] = (_new_consumer(options, committed), threading.Lock())
    c, lock = found
    with lock:
        try:
            yield c
        except BaseException:
            with _pool_lock:  # a consumer that failed mid-read is not trusted again
                _pool.pop(key, None)
            c.close()
            raise
        else:
            c.unassign()


def read_limit_s(options: SinkOptions) -> float:
    """How long one read of the proof topic may take: the delivery timeout, within 10 s .. 2 min, as the
    transaction calls."""
    from recoverable_sink.producer.ledger import delivery_timeout_s

    return min(120.0, max(10.0, delivery_timeout_s(options)))


# Answers that mean "ask again": a partition whose leader is moving or not yet elected (a topic just created).
_AGAIN = frozenset({KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE,
                    KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._TRANSPORT, KafkaError._TIMED_OUT,
                    KafkaError.REQUEST_TIMED_OUT, KafkaError._UNKNOWN_PARTITION, KafkaError._UNKNOWN_TOPIC})


def partition_ends(c: Consumer, tp: TopicPartition, deadline: float) -> tuple[int, int]:
    """(low watermark, high end) of a partition; the high end is the last stable offset for a read_committed
    consumer (librdkafka sends ListOffsets with the consumer's isolation level)."""
    while True:
        try:
            low, high = c.get_watermark_offsets(tp, timeout=max(0.1, min(5.0, deadline - time.monotonic())),
                                                cached=False)
            return int(low), int(high)
        except KafkaException as exc:
            err = exc.args[0]
            if time.monotonic() >= deadline or not (err.retriable() or err.code() in _AGAIN):
                raise
            time.sleep(0.05)


def read_range(c: Consumer, topic: str, partition: int, start: int, end: int, deadline: float, feed: Feed) -> None:
    """Feed every record of [start, end) to ``feed`` (offset, key, value); what compaction or retention removed is
    simply absent."""
    if end <= start:
        return
    tp = TopicPartition(topic, partition, start)
    c.assign([tp])
    while time.monotonic() < deadline:
        # consume() waits out its timeout unless it fills the batch: short, since a read ends at a known offset (a
        # re-run's partition reads after each claim; half a second each was most of a re-run's time).
        for m in c.consume(1000, timeout=max(0.01, min(0.05, deadline - time.monotonic()))):
            err = m.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    continue
                if err.code() == KafkaError.GROUP_AUTHORIZATION_FAILED:
                    # The coordinator lookup librdkafka makes for any consumer's group.id: these readers never use
                    # the group (assigned partitions, absolute offsets, no commits), so its ACL is not needed.
                    continue
                raise KafkaException(err)
            offset = m.offset()
            if offset is None:
                continue
            if offset >= end:
                c.unassign()
                return
            feed(offset, m.key(), m.value())
            if offset + 1 >= end:
                c.unassign()
                return
        position = c.position([TopicPartition(topic, partition)])[0].offset
        if position >= end:
            c.unassign()
            return
    raise TimeoutError(f"reading partition {partition} of proof topic {topic} up to offset {end}")


def high_watermark(options: SinkOptions, proof: KafkaProof, partition: int) -> int:
    """Where the next record of a proof partition will go (read_uncommitted: the high watermark)."""
    with consumer(options, committed=False) as c:
        return partition_ends(c, TopicPartition(proof.topic, partition), time.monotonic() + read_limit_s(options))[1]


class Directory:
    """Where each scope's live proof starts (partition 0 of the proof topic, compacted): read in full once per process
    and topic, then only what was written since (:meth:`lookup`)."""

    def __init__(self, options: SinkOptions, proof: KafkaProof) -> None:
        self.options = options
        self.proof = proof
        self.entries: dict[str, dict[int, int]] = {}
        self.position = 0
        self.lock = threading.Lock()

    def lookup(self, scope: str) -> dict[int, int] | None:
        """The scope's entry as the directory now holds it (None: none)."""
        with self.lock:
            deadline = time.monotonic() + read_limit_s(self.options)
            with consumer(self.options, committed=False) as c:
                low, high = partition_ends(c, TopicPartition(self.proof.topic, 0), deadline)
                read_range(c, self.proof.topic, 0, max(self.position, low), high, deadline, self._feed)
                self.position = max(self.position, high)
            found = self.entries.get(scope)
            return dict(found) if found is not None else None

    def _feed(self, offset: int, raw_key: bytes | None, value: bytes | None) -> None:
        key = parse_key(raw_key)
        if not isinstance(key, DirectoryKey):
            return
        starts = decode_directory(value)
        if starts is None:
            self.entries.pop(key.scope, None)
        else:
            self.entries[key.scope] = starts


_directories: dict[tuple[tuple[tuple[str, str], ...], str], Directory] = {}
_directories_lock = threading.Lock()


def directory(options: SinkOptions, proof: KafkaProof) -> Directory:
    """The process's directory of this cluster's proof topic."""
    key = (tuple(sorted(client_config(options).items())), proof.topic)
    with _directories_lock:
        found = _directories.get(key)
        if found is None:
            found = _directories[key] = Directory(options, proof)
        return found
