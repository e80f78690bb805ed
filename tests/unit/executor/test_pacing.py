"""The task's rate limit (executor/pacing.py), on a clock the test moves: how a batch is cut and when each piece may
go. What a real write takes under a limit is measured by make bench, not here."""

from __future__ import annotations

import pyarrow as pa
import pytest

from recoverable_sink.errors import OptionError
from recoverable_sink.executor.pacing import RatePacer, Unpaced, pacer_for, record_bytes
from recoverable_sink.options import parse_options

BASE = {"kafka.bootstrap.servers": "b:9092", "topic": "t"}


class Clock:
    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def values(n: int, size: int = 10) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({"value": pa.array([b"v" * size] * n, pa.binary())})


def send(pacer: RatePacer, clock: Clock, batch: pa.RecordBatch, digests: bytes | None = None) -> list[int]:
    """Hand a batch over as the writer does; the piece sizes."""
    sizes = []
    for piece, piece_digests in pacer.pieces(batch, digests):
        assert piece_digests is None or len(piece_digests) == 16 * piece.num_rows
        pacer.wait(piece)
        sizes.append(piece.num_rows)
    return sizes


def test_records_per_second_cut_a_batch_into_tenths_of_a_second_and_take_the_time_they_imply():
    clock = Clock()
    pacer = RatePacer(1000, None, clock, clock.sleep)
    batch = values(10_000)
    digests = bytes(range(16)) * 10_000
    pieces = list(pacer.pieces(batch, digests))
    assert [p.num_rows for p, _ in pieces] == [100] * 100
    assert b"".join(d for _, d in pieces) == digests
    for piece, _ in pieces:
        pacer.wait(piece)
    # The last piece goes when the 9,900 before it are due: 9.9 s after the first; the next batch waits its turn.
    assert clock.now == pytest.approx(100.0 + 9.9)
    send(pacer, clock, values(100))
    assert clock.now == pytest.approx(100.0 + 10.0)


def test_bytes_per_second_count_keys_values_and_headers():
    headers = pa.array([[{"key": "ab", "value": b"cde"}]] * 4,
                       pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())])))
    batch = pa.RecordBatch.from_arrays([pa.array([b"k"] * 4), pa.array([b"vv", None, b"", b"v"]), headers],
                                       ["key", "value", "headers"])
    assert record_bytes(batch) == 4 * 1 + 3 + 4 * 5
    assert record_bytes(batch.slice(1, 2)) == 2 + 0 + 2 * 5
    clock = Clock()
    pacer = RatePacer(None, 1000, clock, clock.sleep)  # 100 bytes a piece: ten 10-byte values
    assert send(pacer, clock, values(50)) == [10] * 5
    assert clock.now == pytest.approx(100.0 + 0.4)


def test_the_tighter_of_both_limits_holds():
    clock = Clock()
    pacer = RatePacer(10_000, 1000, clock, clock.sleep)  # bytes are the tighter: 100 records of 10 B a second
    send(pacer, clock, values(300))
    assert clock.now == pytest.approx(100.0 + 2.9)


def test_a_task_slower_than_its_limit_never_waits():
    clock = Clock()
    pacer = RatePacer(1000, None, clock, clock.sleep)
    for _ in range(5):
        send(pacer, clock, values(100))
        clock.now += 1.0  # the input takes a second for every 100 records
    assert clock.slept == []


def test_a_stalled_input_catches_up_by_a_second_s_worth_at_most():
    clock = Clock()
    pacer = RatePacer(1000, None, clock, clock.sleep)
    send(pacer, clock, values(100))
    clock.now += 30.0  # the input stalls for 30 s: 30,000 records of budget unused
    before = clock.now
    send(pacer, clock, values(3000))  # 30 pieces: a second's worth at once, then the limit's pace
    assert clock.now == pytest.approx(before + 3.0 - 1.0 - 0.1)


def test_unset_limits_leave_batches_whole_and_never_wait():
    pacer = pacer_for(parse_options(BASE))
    assert isinstance(pacer, Unpaced)
    batch = values(10_000)
    assert [(p.num_rows, d) for p, d in pacer.pieces(batch, None)] == [(10_000, None)]


@pytest.mark.parametrize(("option", "value", "message"), [
    ("rate.recordsPerSecond", "0", "must be above 0"), ("rate.recordsPerSecond", "fast", "must be a number"),
    ("rate.recordsPerSecond", "-5", "must not be negative"), ("rate.recordsPerSecond", "nan", "must be above 0"),
    ("rate.bytesPerSecond", "1x", "is not a size")])
def test_a_bad_limit_is_named_on_the_driver(option, value, message):
    with pytest.raises(OptionError, match=f"{option}={value!r}.*{message}".replace(".", r"\.").replace(r"\.*", ".*")):
        parse_options({**BASE, option: value})


def test_limits_parse_with_units():
    options = parse_options({**BASE, "rate.recordsPerSecond": "2500.5", "rate.bytesPerSecond": "10m"})
    assert (options.rate_records_per_s, options.rate_bytes_per_s) == (2500.5, 10 << 20)
    assert isinstance(pacer_for(options), RatePacer)
