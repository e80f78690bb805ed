"""The ledger: what it books as acknowledged from a producer's reports, through its public calls only. The
producer here is scripted (it queues what it is sent and reports what the test says), standing for librdkafka's
two clients, whose own tests (test_native.py, test_confluent.py) and the integration tests hold them to it."""

from __future__ import annotations

import pyarrow as pa
import pytest
from confluent_kafka import KafkaError, KafkaException

from recoverable_sink.errors import DeliveryError, FatalProducerError, RecordError
from recoverable_sink.producer.ledger import Ledger
from recoverable_sink.producer.reports import Failure, Reports, Stopped


class Scripted:
    """A producer that queues each send's records and empties its queue when told (``deliver``); reports wait in
    ``pending`` until the ledger takes them."""

    kind = "scripted"

    def __init__(self) -> None:
        self.queued = 0
        self.sends: list[tuple[int, list[int] | None, int]] = []  # (slot, rows, records handed over)
        self.pending = Reports()
        self.stop_at: tuple[int, BaseException] | None = None
        self.fatal = False
        self.after_send: list = []  # called once each after a send, as a report served meanwhile would be

    def send(self, batch: pa.RecordBatch, topic: str | None, slot: int, rows: list[int] | None) -> int:
        count = batch.num_rows if rows is None else len(rows)
        if self.stop_at is not None:
            index, cause = self.stop_at
            self.sends.append((slot, rows, index))
            self.queued += index
            raise Stopped(index, cause, topic, 3)
        self.sends.append((slot, rows, count))
        self.queued += count
        while self.after_send:
            self.after_send.pop(0)()
        return count

    def deliver(self, fail: list[tuple[int, int]] = (), written: list[tuple[str, int, int, int, int]] = ()) -> None:
        """The queue empties: the (send number, index) pairs in ``fail`` failed, the rest was acknowledged."""
        for send, index in fail:
            slot = self.sends[send][0]
            self.pending.failures.append(Failure(slot, index, KafkaError(KafkaError._MSG_TIMED_OUT), "t", 0))
        self.pending.written.extend(written)
        self.queued = 0

    def take_reports(self) -> Reports:
        out, self.pending = self.pending, Reports()
        return out

    def poll(self, timeout: float = 0) -> int:
        if self.fatal:
            raise KafkaException(KafkaError(KafkaError._FENCED, "fenced", fatal=True))
        return 0

    def flush(self, timeout: float = -1) -> int:
        self.poll()
        return self.queued

    def __len__(self) -> int:
        return self.queued


def _batch(n: int) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({"value": [b"v%d" % i for i in range(n)]})


def test_nothing_counts_as_acknowledged_before_a_drain_finds_the_queue_empty():
    producer = Scripted()
    ledger = Ledger(producer)
    assert ledger.send(_batch(4), "t", 0) == 4
    ledger.drain(0)
    assert (ledger.acked, ledger.outstanding, ledger.take_changes()) == (0, 4, {})
    producer.deliver()
    ledger.drain(0)
    assert (ledger.acked, ledger.outstanding) == (4, 0)
    assert {k: bytes(v) for k, v in ledger.take_changes().items()} == {0: b"\1\1\1\1"}


def test_a_failure_clears_exactly_the_segment_row_it_names_skipped_rows_included():
    """Send indexes count only the rows handed over: with rows 1 and 3 skipped, index 1 of the send is row 2."""
    producer = Scripted()
    ledger = Ledger(producer)
    assert ledger.send(_batch(5), "t", 10, [False, True, False, True, False]) == 3
    assert ledger.send(_batch(2), "t", 15) == 2
    producer.deliver(fail=[(0, 1), (1, 0)])
    ledger.wait_for_acks(1)
    books = ledger.take_changes()
    assert (bytes(books[10]), bytes(books[15])) == (b"\1\1\0\1\1", b"\0\1")
    assert (ledger.acked, ledger.failed, ledger.outstanding) == (3, 2, 0)
    assert ledger.first_error() is not None and "_MSG_TIMED_OUT" in ledger.first_error()
    assert "(and 1 more failed records)" in ledger.first_error()


def test_reports_a_pooled_producer_kept_from_an_earlier_task_are_not_this_attempts():
    producer = Scripted()
    earlier = Ledger(producer)
    earlier.send(_batch(2), "t", 0)
    producer.deliver(fail=[(0, 0)], written=[("t", 0, 5, 5, 1)])  # reported after that task stopped taking
    ledger = Ledger(producer)
    ledger.send(_batch(2), "t", 0)
    producer.deliver()
    ledger.drain(0)
    assert (ledger.acked, ledger.failed) == (2, 0)
    assert ledger.written_offsets() == ((), False)  # two acknowledged, none of them reported with an offset


def test_written_offsets_are_complete_only_when_every_acknowledged_record_is_counted_in_them():
    producer = Scripted()
    ledger = Ledger(producer)
    ledger.send(_batch(3), "t", 0)
    producer.deliver(written=[("t", 1, 7, 8, 2), ("t", 0, 3, 3, 1)])
    ledger.drain(0)
    assert ledger.written_offsets() == ((("t", 0, 3, 3, 1), ("t", 1, 7, 8, 2)), True)


def test_a_refused_record_is_named_by_its_position_and_the_records_before_it_await_the_drain():
    producer = Scripted()
    producer.stop_at = (2, KafkaException(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE, "too large")))
    ledger = Ledger(producer, scrub=lambda text: text.replace("large", "<scrubbed>"))
    with pytest.raises(RecordError, match=r"^record 102 to topic t partition 3 was refused by the producer: "
                                          r"MSG_SIZE_TOO_LARGE: too <scrubbed>$"):
        ledger.send(_batch(5), "t", 100)
    assert ledger.produced == 2
    producer.deliver()
    ledger.drain(0)
    assert bytes(ledger.take_changes()[100]) == b"\1\1\0\0\0"


def test_a_transaction_that_stopped_taking_records_names_the_first_failed_delivery_not_the_record():
    producer = Scripted()
    ledger = Ledger(producer)
    ledger.send(_batch(1), "t", 0)
    producer.deliver(fail=[(0, 0)])
    ledger.drain(0)
    producer.stop_at = (0, KafkaException(KafkaError(KafkaError._STATE, "abortable")))
    with pytest.raises(DeliveryError, match=r"the first failed delivery: topic t partition 0: _MSG_TIMED_OUT.*"
                                            r"record 1 to topic t partition 3 is not at fault"):
        ledger.send(_batch(1), "t", 1)


def test_a_fatal_producer_is_reported_as_fatal_whether_it_shows_at_a_refusal_or_at_a_drain():
    producer = Scripted()
    ledger = Ledger(producer)
    producer.fatal = True
    producer.stop_at = (0, KafkaException(KafkaError(KafkaError._FENCED, "fenced", fatal=True)))
    with pytest.raises(FatalProducerError, match="_FENCED"):
        ledger.send(_batch(1), "t", 0)
    with pytest.raises(FatalProducerError, match="_FENCED"):
        ledger.drain(0)


def test_a_fully_acknowledged_segment_is_forgotten_once_taken_and_a_failed_save_gives_it_back():
    producer = Scripted()
    ledger = Ledger(producer)
    ledger.send(_batch(2), "t", 0)
    producer.deliver()
    ledger.drain(0)
    taken = ledger.take_changes()
    assert ledger.take_changes() == {}
    ledger.give_back(taken)  # the WAL could not save them
    assert {k: bytes(v) for k, v in ledger.take_changes().items()} == {0: b"\1\1"}


def test_a_failure_reported_while_its_own_send_returns_is_not_lost_to_a_drain_at_that_moment():
    """Earlier records are in flight; the queue empties and this send's first record fails before the send is
    booked: the drain that follows must still find that failure."""
    producer = Scripted()
    ledger = Ledger(producer)
    ledger.send(_batch(2), "t", 0)
    producer.after_send.append(lambda: producer.deliver(fail=[(1, 0)]))
    ledger.send(_batch(3), "t", 2)
    books = ledger.take_changes()
    assert (bytes(books[0]), bytes(books[2])) == (b"\1\1", b"\0\1\1")
    assert (ledger.acked, ledger.failed, ledger.outstanding) == (4, 1, 0)
