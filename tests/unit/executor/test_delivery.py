"""The delivery modes on their own: what each of the five steps asks of the partition's transaction (exactly_once) or
of the pooled producer (at_least_once), with a transaction that records its calls. The model
(test_writer_model.py) drives both through the partition writer; this says what each step means."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from recoverable_sink.contract import TaskIdentity
from recoverable_sink.errors import DeliveryError, FatalProducerError
from recoverable_sink.executor import delivery
from recoverable_sink.executor.delivery import AtLeastOnce, Commit, Transactional
from recoverable_sink.options import parse_options
from recoverable_sink.producer.marker import Marker

OPTIONS = parse_options({"kafka.bootstrap.servers": "127.0.0.1:1", "topic": "t", "delivery.guarantee": "exactly_once"})
IDENT = TaskIdentity("w", 2, 0, run="r1")
MARKER = Marker(write_id="w", topic="t", records=10, attempts=("a0",), run="r0", partition=2)


@dataclass
class RecordingTransaction:
    """A partition's transaction that does what it is told and writes down each call."""

    found: Marker | None = None
    latest_batch: int | None = None
    stuck: str | None = None
    producer: object | None = None
    marker: Marker | None = None
    in_transaction: bool = False
    calls: list[str] = field(default_factory=list)

    def open(self, topic: str | None) -> Marker | None:
        self.calls.append(f"open {topic}")
        self.producer = object()
        self.in_transaction = self.found is None  # a committed partition's attempt opens no transaction
        return self.found

    def begin(self) -> None:
        self.calls.append("begin")
        self.in_transaction = True

    def sending(self) -> None:
        self.calls.append("sending")

    def timed_out(self) -> str | None:
        return self.stuck

    def commit(self, marker: Marker, timeout_s: float) -> None:
        self.calls.append(f"commit {marker.records} within {timeout_s}")
        self.in_transaction = False

    def abort(self) -> None:
        self.calls.append("abort")
        self.in_transaction = False

    def close(self) -> None:
        self.calls.append("close")


def transactional(txn: RecordingTransaction, markers=None) -> Transactional:
    return Transactional(OPTIONS, IDENT, 12.5, txn, markers)


def opened(txn: RecordingTransaction, sends: int = 0) -> Transactional:
    """The mode opened on ``txn``, then told ``sends`` times that records are about to be sent."""
    mode = transactional(txn)
    mode.open("t")
    for _ in range(sends):
        mode.before_send()
    return mode


def test_opening_hands_over_the_transactions_producer_the_partitions_marker_and_its_latest_micro_batch():
    txn = RecordingTransaction(found=MARKER, latest_batch=7)
    opened = transactional(txn).open("t")
    assert (opened.producer, opened.own_marker, opened.latest_micro_batch) == (txn.producer, MARKER, 7)
    assert txn.calls == ["open t"]


def test_sending_begins_a_transaction_only_where_opening_began_none():
    fresh = RecordingTransaction()
    opened(fresh, sends=2)
    assert fresh.calls == ["open t", "sending", "sending"]
    committed = RecordingTransaction(found=MARKER)  # the partition is committed: an attempt that sends what it lacks
    opened(committed, sends=2)
    assert committed.calls == ["open t", "begin", "sending", "sending"]


def test_finishing_commits_with_the_marker_within_the_commit_wait_then_closes():
    txn = RecordingTransaction()
    assert opened(txn, sends=1).finish(Commit(MARKER, produced=True)) is True
    assert txn.calls[-2:] == ["commit 10 within 12.5", "close"]


@pytest.mark.parametrize("commit", [Commit(None, produced=True), Commit(MARKER, produced=False)])
def test_finishing_an_attempt_that_sent_nothing_aborts_and_commits_no_new_marker(commit):
    txn = RecordingTransaction()
    assert opened(txn).finish(commit) is False
    assert "abort" in txn.calls and not any(c.startswith("commit") for c in txn.calls)


def test_finishing_a_skipped_partition_only_closes():
    txn = RecordingTransaction(found=MARKER)
    assert opened(txn).finish(None) is False
    assert txn.calls == ["open t", "close"]


def test_an_abort_aborts_the_transaction_whatever_kafka_acknowledged():
    txn = RecordingTransaction()
    mode = opened(txn, sends=1)
    mode.abort()
    assert txn.calls[-1] == "abort" and mode.waits_on_abort is False


def test_a_fatal_error_is_located_as_a_deadline_where_one_passed_else_as_fencing():
    fatal = FatalProducerError("fenced")
    assert "fenced this one" in transactional(RecordingTransaction()).locate_error(fatal)
    stuck = RecordingTransaction(stuck=" commit_transaction did not return within 17 s ")
    assert transactional(stuck).locate_error(fatal) == "; commit_transaction did not return within 17 s"
    assert transactional(RecordingTransaction()).locate_error(DeliveryError("timed out")) == ""


def test_other_partitions_markers_are_read_one_partition_at_a_time():
    read: list[tuple[int, str | None]] = []

    def reader(partition: int, topic: str | None) -> tuple[Marker, ...]:
        read.append((partition, topic))
        return (MARKER,) if partition == 1 else ()

    assert transactional(RecordingTransaction(), reader).markers([0, 1], "t") == {0: (), 1: (MARKER,)}
    assert read == [(0, "t"), (1, "t")]


def test_the_marker_group_read_keeps_only_this_writes_markers_for_this_topic(monkeypatch):
    seen: list[str] = []

    def read_markers(options, group, topics, fail):
        seen.append(group)
        return [MARKER, Marker(write_id="other", topic="t", records=1, attempts=()),
                Marker(write_id="w", topic="u", records=2, attempts=()),
                Marker(write_id="w", topic=None, records=3, attempts=())]  # an older marker, without a topic

    monkeypatch.setattr(delivery, "read_markers", read_markers)
    mode = transactional(RecordingTransaction())
    assert [m.records for m in mode.markers([1], "t")[1]] == [10, 3]
    assert [m.records for m in mode.markers([1], None)[1]] == [10, 2, 3]
    assert seen[0].endswith("w-1")  # partition 1's group, named as its transactional id


def test_at_least_once_counts_at_once_and_keeps_a_given_producer():
    given = object()
    mode = AtLeastOnce(OPTIONS, given)  # type: ignore[arg-type]
    assert mode.open("t").producer is given and mode.open("t").own_marker is None
    assert mode.markers([0, 1], "t") == {}
    mode.before_send()
    assert mode.finish(Commit(MARKER, produced=True)) is True and mode.finish(None) is True
    assert mode.locate_error(FatalProducerError("x")) == ""
    mode.abort()  # a given producer is the caller's: not dropped from the pool
    assert mode.waits_on_abort is True and mode.exactly_once is False
