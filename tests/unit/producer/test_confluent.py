"""The confluent-kafka producer: how it calls ``Producer.produce`` (only as many positional arguments as the records
set, each record's own values in the right place, librdkafka's defaults for the rest), and how its content-named
failure reports become the ledger's positions."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import KafkaError, Message

from recoverable_sink.errors import RecordError
from recoverable_sink.producer.ledger import Ledger
from tests.unit.fakes import FakeProducer, Sent, sink_producer


class _Counting(FakeProducer):
    """Records how many positional arguments each call had."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.arities: list[int] = []

    def produce(self, *args: Any) -> None:  # type: ignore[override]
        self.arities.append(len(args))
        super().produce(*args)


HEADERS = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))


def _batch(**columns: pa.Array) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({"value": pa.array([b"v0", b"v1"]), **columns})


@pytest.mark.parametrize(("columns", "arity", "expected"), [
    ({}, 2, [Sent("t", b"v0", None, -1, 0, None), Sent("t", b"v1", None, -1, 0, None)]),
    ({"key": pa.array([b"k", None])}, 3,
     [Sent("t", b"v0", b"k", -1, 0, None), Sent("t", b"v1", None, -1, 0, None)]),
    ({"partition": pa.array([2, None], pa.int32())}, 4,
     [Sent("t", b"v0", None, 2, 0, None), Sent("t", b"v1", None, -1, 0, None)]),
    ({"timestamp": pa.array([None, 7], pa.int64())}, 7,
     [Sent("t", b"v0", None, -1, 0, None), Sent("t", b"v1", None, -1, 7, None)]),
    ({"headers": pa.array([[("h", b"1")], None], HEADERS), "topic": pa.array(["a", "b"])}, 8,
     [Sent("a", b"v0", None, -1, 0, [("h", b"1")]), Sent("b", b"v1", None, -1, 0, None)]),
])
def test_produce_is_called_with_the_arguments_the_records_set_and_without_the_defaults_after_them(
        columns: dict[str, pa.Array], arity: int, expected: list[Sent]) -> None:
    fake = _Counting()
    assert Ledger(sink_producer(fake)).send(_batch(**columns), "t", 0) == 2
    assert fake.delivered + fake.queue == expected
    assert fake.arities == [arity, arity]


def test_a_refused_record_without_a_partition_column_is_named_by_position_and_topic() -> None:
    ledger = Ledger(sink_producer(FakeProducer(refuse=b"v1")))
    with pytest.raises(RecordError, match="^record 11 to topic t was refused") as info:
        ledger.send(_batch(key=pa.array([b"k", b"k"])), "t", 10)
    assert "partition" not in str(info.value)


def test_a_full_producer_queue_holds_the_rest_back_and_every_record_goes_out_once_in_order() -> None:
    values = [b"%d" % i for i in range(10)]
    fake = FakeProducer(queue_max=3)  # poll() empties the queue: room comes back while the send waits
    skip = [i in (1, 6) for i in range(10)]
    assert Ledger(sink_producer(fake)).send(pa.RecordBatch.from_pydict({"value": values}), "t", 0, skip) == 8
    fake.flush()
    assert fake.values() == [v for v, s in zip(values, skip, strict=True) if not s]


@pytest.mark.parametrize("skip", [None, [False, True, False, False, False]], ids=["all", "one-skipped"])
def test_a_record_the_producer_refuses_midway_is_named_and_only_those_before_it_count_as_handed_over(skip):
    fake = FakeProducer(refuse=b"d", ack_budget=0)
    ledger = Ledger(sink_producer(fake))
    batch = pa.RecordBatch.from_pydict({"value": [b"a", b"b", b"c", b"d", b"e"]})
    with pytest.raises(RecordError, match=r"record 13 to topic t was refused by the producer: MSG_SIZE_TOO_LARGE"):
        ledger.send(batch, "t", 10, skip)
    assert ledger.produced == (3 if skip is None else 2)
    fake.ack_budget = None
    ledger.drain(1)
    assert bytes(ledger.take_changes()[10]) == b"\1\1\1\0\0"  # skipped or acknowledged; the refused and later not


def test_a_failure_named_by_content_fails_every_record_of_that_content_handed_over_since_the_queue_was_empty():
    """confluent-kafka's reports carry no record number: a failed record's content fails each record handed over
    with that content (one may be sent again; none is lost), and each once however many reports name it."""
    timed_out = KafkaError(KafkaError._MSG_TIMED_OUT)
    fake = FakeProducer(ack_budget=0)
    ledger = Ledger(sink_producer(fake))
    ledger.send(pa.RecordBatch.from_pydict({"value": [b"a", b"b", b"c", b"b"]}), "t", 0)
    ledger.send(pa.RecordBatch.from_pydict({"value": [b"b", b"d"]}), "t", 4, [True, False])
    failing = [s for s in fake.queue if s.value == b"b"]
    for sent in failing:  # the two records of content b"b" fail, each reported
        fake.queue.remove(sent)
        fake.on_delivery(timed_out, _msg(sent))
    fake.ack_budget = None
    ledger.drain(1)
    books = ledger.take_changes()
    assert (bytes(books[0]), bytes(books[4])) == (b"\1\0\1\0", b"\1\1")
    assert (ledger.acked, ledger.failed, ledger.outstanding) == (3, 2, 0)
    assert "_MSG_TIMED_OUT" in (ledger.first_error() or "")


def _msg(sent: Sent) -> Any:
    from tests.unit.fakes import _Msg

    return _Msg(sent)


def test_a_failure_report_that_names_no_record_sent_fails_every_record_since_the_queue_was_empty():
    fake = FakeProducer(ack_budget=0)
    ledger = Ledger(sink_producer(fake))
    ledger.send(pa.RecordBatch.from_pydict({"value": [b"a", b"b"]}), "t", 0)
    fake.on_delivery(KafkaError(KafkaError._MSG_TIMED_OUT), _msg(Sent("t", b"never sent", None, 0, 0, None)))
    fake.queue.clear()
    ledger.drain(1)
    assert (bytes(ledger.take_changes()[0]), ledger.failed) == (b"\0\0", 2)


def test_reports_without_an_offset_or_a_partition_leave_the_offsets_partial_and_name_no_partition():
    """confluent-kafka's Message gives None for an offset librdkafka did not have (RD_KAFKA_OFFSET_INVALID) and for
    a partition never assigned: the written offsets are marked partial, as the C loop marks them, and a failure names
    no partition, rather than either ending in a TypeError."""
    fake = FakeProducer(ack_budget=0)
    producer = sink_producer(fake)
    producer.send(pa.RecordBatch.from_pydict({"value": [b"a", b"b"]}), "t", 0, None)
    fake.on_delivery(None, Message(topic="t", partition=0, offset=5, value=b"a"))
    fake.on_delivery(None, Message(topic="t", partition=0, offset=-1001, value=b"a"))
    fake.on_delivery(KafkaError(KafkaError._MSG_TIMED_OUT), Message(topic="t", partition=-1, value=b"b"))
    reports = producer.take_reports()
    assert (reports.written, reports.complete) == ([("t", 0, 5, 5, 1)], False)
    assert [(f.index, f.partition) for f in reports.failures] == [(1, -1)]
    assert "partition not yet assigned" in reports.failures[0].describe()
    assert producer.take_reports().complete is True  # partial figures are a take's, not the producer's for ever
