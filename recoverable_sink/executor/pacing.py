"""A task's rate limit (executor): ``rate.recordsPerSecond`` and ``rate.bytesPerSecond``, applied where batches
are handed to the producer. Unlimited tasks get :class:`Unpaced`, which does nothing."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Protocol

import pyarrow as pa
import pyarrow.compute as pc

from recoverable_sink.identity import slices
from recoverable_sink.options import SinkOptions

# A paced batch is handed over in pieces of at most this many seconds' worth, so the records flow evenly
# instead of a whole Arrow batch (10,000 records) at once and then a long pause.
_PIECE_S = 0.1
# A task slower than its limit for a while (its input stalled) may catch up by at most this many seconds' worth.
_BURST_S = 1.0


class Pacer(Protocol):
    def pieces(self, batch: pa.RecordBatch, digests: bytes | None) -> Iterator[tuple[pa.RecordBatch, bytes | None]]:
        """The batch (and its digests, when known) in the pieces it is to be logged and handed over in."""
        ...

    def wait(self, batch: pa.RecordBatch) -> None:
        """Return once ``batch`` may be handed to the producer, and count it."""
        ...


class Unpaced:
    """No limit: the batch in one piece, handed over at once."""

    def pieces(self, batch: pa.RecordBatch, digests: bytes | None) -> Iterator[tuple[pa.RecordBatch, bytes | None]]:
        yield batch, digests

    def wait(self, batch: pa.RecordBatch) -> None:
        return None


class RatePacer:
    """At most ``records_per_s`` records and ``bytes_per_s`` bytes of keys, values and headers per second, counted
    from the first hand-over: a piece waits until the records and bytes handed over before it are due. A task held
    up by its input catches up by at most a second's worth at once."""

    def __init__(self, records_per_s: float | None, bytes_per_s: float | None,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> None:
        self.records_per_s = records_per_s
        self.bytes_per_s = bytes_per_s
        self._clock = clock
        self._sleep = sleep
        self._start: float | None = None
        self.records = 0
        self.bytes = 0

    def pieces(self, batch: pa.RecordBatch, digests: bytes | None) -> Iterator[tuple[pa.RecordBatch, bytes | None]]:
        n = batch.num_rows
        size = n
        if self.records_per_s is not None:
            size = min(size, max(1, int(self.records_per_s * _PIECE_S)))
        if self.bytes_per_s is not None:
            average = max(1.0, record_bytes(batch) / n)
            size = min(size, max(1, int(self.bytes_per_s * _PIECE_S / average)))
        yield from slices(batch, digests, size)

    def wait(self, batch: pa.RecordBatch) -> None:
        now = self._clock()
        if self._start is None:
            self._start = now
        due = self._start
        if self.records_per_s is not None:
            due = max(due, self._start + self.records / self.records_per_s)
        if self.bytes_per_s is not None:
            due = max(due, self._start + self.bytes / self.bytes_per_s)
        if due < now - _BURST_S:
            # Behind after an input stall: what was not sent then is not sent in a burst now.
            self._start += now - _BURST_S - due
            due = now - _BURST_S
        if due > now:
            self._sleep(due - now)
        self.records += batch.num_rows
        if self.bytes_per_s is not None:
            self.bytes += record_bytes(batch)


def pacer_for(options: SinkOptions) -> Pacer:
    """The task's pacer under its options."""
    if options.rate_records_per_s is None and options.rate_bytes_per_s is None:
        return Unpaced()
    return RatePacer(options.rate_records_per_s, options.rate_bytes_per_s)


def record_bytes(batch: pa.RecordBatch) -> int:
    """The bytes of a normalised batch's keys, values and header keys and values (what the limit counts)."""
    total = 0
    for name in ("key", "value"):
        if name in batch.schema.names:
            total += _lengths(batch.column(name))
    if "headers" in batch.schema.names:
        items = pc.list_flatten(batch.column("headers"))
        total += _lengths(items.field("key")) + _lengths(items.field("value"))
    return total


def _lengths(column: pa.Array) -> int:
    return int(pc.sum(pc.binary_length(column)).as_py() or 0)
