"""The native producer (the ``_produce`` extension): Arrow buffers into librdkafka, failures by position.

No broker here: librdkafka's in-process mock cluster (``test.mock.num.brokers``) stands in for the happy path,
and an address nothing listens on for the failure path. What lands in a real topic, field by field, is checked
against a real broker in tests/integration (both producers, the same tests)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from recoverable_sink.errors import RecordError
from recoverable_sink.producer import native as native_producer
from recoverable_sink.producer.arguments import producer_columns
from recoverable_sink.producer.ledger import Ledger
from recoverable_sink.producer.native import NativeProducer

pytestmark = pytest.mark.skipif(native_producer.native_module() is None,
                                reason="the _produce extension is not built here (no C compiler at install)")

HEADERS = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))


def _mock(**conf: str) -> NativeProducer:
    return NativeProducer({"bootstrap.servers": "mock", "test.mock.num.brokers": "1", "enable.idempotence": "true",
                           "acks": "all", **conf})


def _batch(n: int, start: int = 0) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({"key": [b"k%d" % (i % 7) for i in range(start, start + n)],
                                       "value": [b"v%d" % i for i in range(start, start + n)]})


def test_every_row_handed_over_is_acknowledged_at_the_drain() -> None:
    producer = _mock()
    ledger = Ledger(producer)
    for first in (0, 500, 1000):
        assert ledger.send(_batch(500, first), "t", first) == 500
    ledger.wait_for_acks(30)
    assert ledger.produced == ledger.acked == 1500 and ledger.failed == 0
    books = ledger.take_changes()
    assert [bytes(books[f]) for f in (0, 500, 1000)] == [b"\x01" * 500] * 3


def test_skipped_rows_count_as_acknowledged_and_the_rest_are_sent() -> None:
    producer = _mock()
    ledger = Ledger(producer)
    skip = [i % 3 == 0 for i in range(30)]
    assert ledger.send(_batch(30), "t", 0, skip) == 20
    ledger.wait_for_acks(30)
    assert ledger.produced == ledger.acked == 20
    assert bytes(ledger.take_changes()[0]) == b"\x01" * 30


def test_a_segment_whose_rows_were_all_delivered_earlier_sends_nothing() -> None:
    producer = _mock()
    ledger = Ledger(producer)
    assert ledger.send(_batch(4), "t", 0, [True] * 4) == 0
    assert bytes(ledger.take_changes()[0]) == b"\x01" * 4 and ledger.produced == 0


def test_a_failure_report_names_the_exact_row_that_failed() -> None:
    """Nothing listens on port 1: every record times out, and each report names its own segment and row."""
    producer = NativeProducer({"bootstrap.servers": "127.0.0.1:1", "message.timeout.ms": "300",
                               "enable.idempotence": "true", "acks": "all", "log_level": "0"})
    ledger = Ledger(producer)
    skip = [i in (1, 4) for i in range(6)]
    ledger.send(_batch(6), "t", 0, skip)
    ledger.send(_batch(3, 6), "t", 6)
    ledger.drain(10)
    assert ledger.failed == 7 and ledger.outstanding == 0
    # The skipped rows were delivered earlier; every row that was sent failed, and no other.
    books = ledger.take_changes()
    assert list(books[0]) == [0, 1, 0, 0, 1, 0]
    assert list(books[6]) == [0, 0, 0]
    assert "_MSG_TIMED_OUT" in (ledger.first_error() or "")


def test_a_record_over_message_max_bytes_is_refused_by_position_and_the_rows_before_it_go_out() -> None:
    producer = _mock(**{"message.max.bytes": "1000"})
    ledger = Ledger(producer)
    batch = pa.RecordBatch.from_pydict({"value": [b"a", b"b", b"c" * 5000, b"d"]})
    with pytest.raises(RecordError, match="record 12 to topic t was refused by the producer: MSG_SIZE_TOO_LARGE"):
        ledger.send(batch, "t", 10)
    assert ledger.produced == 2
    ledger.wait_for_acks(30)
    assert list(ledger.take_changes()[10]) == [1, 1, 0, 0]


def test_a_batch_larger_than_the_producers_queue_waits_for_room_and_hands_every_row_over() -> None:
    """A full queue refuses a row; the send waits for room and goes on instead of stopping there: every row is
    handed over, none fails, and the drain finds them all acknowledged."""
    producer = _mock(**{"queue.buffering.max.messages": "300"})
    ledger = Ledger(producer)
    assert ledger.send(_batch(2500), "t", 0) == 2500
    assert ledger.send(_batch(700, 2500).slice(100), "t", 2600) == 600
    ledger.wait_for_acks(30)
    assert ledger.produced == ledger.acked == 3100 and ledger.failed == 0
    books = ledger.take_changes()
    assert bytes(books[0]) == b"\x01" * 2500 and bytes(books[2600]) == b"\x01" * 600


def test_every_column_shape_is_accepted_sliced_or_not() -> None:
    """Nulls, empty values, string and binary, partitions, timestamps, headers, and a batch that is a slice of a
    larger one (Arrow offsets that do not start at 0) all go out."""
    batch = pa.RecordBatch.from_pydict({
        "key": pa.array(["a", None, "", "d", "e"], pa.string()),
        "value": pa.array([b"1", b"", None, b"4", b"5"]),
        "partition": pa.array([0, None, 0, 0, 0], pa.int32()),
        "timestamp": pa.array([1_700_000_000_000, None, 1, 2, 3], pa.int64()),
        "headers": pa.array([[("h", b"x"), ("n", None)], None, [], [("h", b"")], None], HEADERS),
    })
    producer = _mock()
    ledger = Ledger(producer)
    assert ledger.send(batch, "t", 0) == 5
    assert ledger.send(batch.slice(2), "t", 5) == 3
    ledger.wait_for_acks(30)
    assert ledger.acked == 8 and ledger.failed == 0


def test_rows_without_any_header_in_arrow_javas_layout_go_out() -> None:
    """Spark's Arrow (Java) writes an empty vector with a 0-byte offsets buffer: header children of length 0
    whose offsets are empty are valid Arrow, and nothing is read from them."""
    empty = [None, pa.py_buffer(b""), pa.py_buffer(b"")]
    items = pa.StructArray.from_arrays([pa.Array.from_buffers(pa.string(), 0, empty),
                                        pa.Array.from_buffers(pa.binary(), 0, empty)], names=["key", "value"])
    headers = pa.ListArray.from_arrays(pa.array([0, 0, 0], pa.int32()), items, mask=pa.array([False, True]))
    headers.validate(full=True)
    batch = pa.RecordBatch.from_arrays([pa.array([b"a", b"b"]), headers], names=["value", "headers"])
    producer = _mock()
    ledger = Ledger(producer)
    assert ledger.send(batch, "t", 0) == 2
    ledger.wait_for_acks(30)
    assert ledger.acked == 2


def test_offsets_out_of_order_are_refused_before_anything_is_sent() -> None:
    """A WAL segment is read back without Arrow's full validation: an offset out of order (which Arrow's shallow
    validation lets through) must not make the loop read outside the data buffer."""
    producer = _mock()
    offsets = pa.py_buffer(pa.array([0, 3, 1, 4], pa.int32()).buffers()[1])
    value = pa.Array.from_buffers(pa.binary(), 3, [None, offsets, pa.py_buffer(b"abcd")])
    with pytest.raises(ValueError, match="value: offsets out of order or outside its data"):
        producer._p.send("t", 1, value, None, None, None, None, None)
    assert len(producer) == 0


def test_a_column_of_another_length_or_type_is_refused_naming_it_before_anything_is_sent() -> None:
    producer = _mock()
    before = pa.total_allocated_bytes()
    value, key, *rest = producer_columns(_batch(4))
    with pytest.raises(ValueError, match="key: 3 rows where the batch has 4"):
        producer._p.send("t", 1, value, key.slice(1), *rest)
    with pytest.raises(TypeError, match="partition: Arrow format 'l' is not int32"):
        producer._p.send("t", 1, value, key, None, pa.array([0, 1, 2, 3], pa.int64()), None, None)
    with pytest.raises(TypeError, match="headers: Arrow format 'z' is not a list of structs"):
        producer._p.send("t", 1, value, key, None, None, None, key)
    with pytest.raises(TypeError, match="value: not an Arrow array"):
        producer._p.send("t", 1, [b"a"], None, None, None, None, None)
    del value, key, rest
    assert len(producer) == 0 and pa.total_allocated_bytes() == before  # nothing queued, nothing kept


def test_every_column_is_taken_as_arrow_gives_it_large_and_string_types_included() -> None:
    """64-bit offsets and strings go out as they are, header keys and values included (no cast), and header
    items that start inside their arrays (a sliced struct) are read from there."""
    items = pa.array([("x", b"0"), ("h", b"x"), ("g", None)],
                     pa.struct([("key", pa.large_string()), ("value", pa.large_binary())]))
    batch = pa.RecordBatch.from_pydict({
        "key": pa.array(["a", None, "c"], pa.large_string()),
        "value": pa.array([b"1", None, b"333"], pa.large_binary()),
        "headers": pa.ListArray.from_arrays(pa.array([0, 1, 1, 2], pa.int32()), items.slice(1)),
    })
    columns = producer_columns(batch)
    assert columns[0].type == pa.large_binary() and columns[5].type == batch.schema.field("headers").type
    producer = _mock()
    ledger = Ledger(producer)
    assert ledger.send(batch.slice(1), "t", 0) == 2
    ledger.wait_for_acks(30)
    assert ledger.acked == 2 and ledger.failed == 0


def test_a_drain_sends_what_linger_ms_would_still_hold_back() -> None:
    """A drain waits for the queue to empty; it must not wait out linger.ms to do so (a minute here)."""
    producer = _mock(**{"linger.ms": "60000"})
    ledger = Ledger(producer)
    ledger.send(_batch(50), "t", 0)
    ledger.drain(20)
    assert ledger.acked == 50 and len(producer) == 0


def test_a_flush_that_cannot_empty_the_queue_returns_at_its_deadline_with_what_is_left() -> None:
    nobody = NativeProducer({"bootstrap.servers": "127.0.0.1:1", "message.timeout.ms": "60000", "log_level": "0"})
    ledger = Ledger(nobody)
    ledger.send(_batch(5), "t", 0)
    assert nobody.flush(0) == 5
    assert nobody.flush(0.2) == 5
    assert ledger.failed == 0 and ledger.outstanding == 5


def test_a_bad_setting_is_a_kafka_exception_naming_it() -> None:
    from confluent_kafka import KafkaException

    with pytest.raises(KafkaException, match="no.such.setting"):
        NativeProducer({"bootstrap.servers": "mock", "no.such.setting": "1"})


def test_waiting_for_a_broker_says_whether_one_answered() -> None:
    assert _mock().connect(10) is None
    nobody = NativeProducer({"bootstrap.servers": "127.0.0.1:1", "log_level": "0"})
    assert nobody.connect(0.3) is not None  # a transport failure or a time-out


def test_each_sends_values_are_kept_while_queued_and_let_go_once_the_queue_is_empty() -> None:
    """Values are handed to librdkafka in place (no copy): the producer keeps each send's value column while
    librdkafka may still read it, and lets go of them all once a drain found its queue empty."""
    producer = _mock(**{"linger.ms": "200"})
    ledger = Ledger(producer)
    before = pa.total_allocated_bytes()
    size = _batch(100).column("value").nbytes + _batch(100, 100).column("value").nbytes  # keys are copied
    ledger.send(_batch(100), "t", 0)  # no reference kept here
    ledger.send(_batch(100, 100), "t", 100)
    assert len(producer) > 0 and pa.total_allocated_bytes() - before >= size
    ledger.wait_for_acks(30)
    assert ledger.acked == 200 and pa.total_allocated_bytes() == before


def test_after_a_purge_the_values_are_kept_until_the_producer_is_closed() -> None:
    """A purge destroys in-flight records while their request may still be written from their values: those are
    kept however empty the queue, until the librdkafka handle itself is destroyed."""
    producer = _mock(**{"linger.ms": "200"})
    ledger = Ledger(producer)
    before, size = pa.total_allocated_bytes(), _batch(100).column("value").nbytes
    ledger.send(_batch(100), "t", 0)
    producer.purge()
    producer.flush(10)
    assert len(producer) == 0 and pa.total_allocated_bytes() - before >= size
    producer._p.close()
    assert pa.total_allocated_bytes() == before
