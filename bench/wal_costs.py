"""What one Arrow batch costs each stage of a task, measured alone (no Spark, no broker, one thread): the
record digests, the WAL append (Arrow IPC, CRC32, an fsynced LMDB commit that also compacts the segment
before, acknowledged by then), and on the send side the Python
lists for ``produce()`` plus the ``produce()`` calls themselves (confluent-kafka's path), or the native
producer's one call for the whole batch (into librdkafka's local queue; the producers point at a closed port,
so nothing is sent and the network and the broker cost nothing).

    .venv/bin/python -m bench.wal_costs    # WAL_COSTS_ROWS=10000 WAL_COSTS_REPS=30, 100 B / 1 KB / 10 KB values,
                                           # and 100 B with two headers (make bench's shapes)

It answers how far the WAL can get from the send path on CPU alone: with the WAL on, a task does the first
two stages as well as the last two, on threads of their own, but on the same cores.

A second table gives the WAL's two parts in the calling thread's CPU (user and kernel, the fsyncs included), per
record, in segments as the writer cuts them (about 8 MiB): the digests and the LMDB append.
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable

import pyarrow as pa
from confluent_kafka import Producer

from recoverable_sink.columns import SchemaPlan
from recoverable_sink.executor.normalise import normalise
from recoverable_sink.executor.partition_writer import SEGMENT_MAX_BYTES
from recoverable_sink.identity import record_digests
from recoverable_sink.producer.arguments import to_records
from recoverable_sink.producer.confluent import ConfluentProducer
from recoverable_sink.producer.native import NativeProducer, native_module
from recoverable_sink.wal import Wal, open_wal

ROWS = int(os.environ.get("WAL_COSTS_ROWS", "10000"))  # spark.sql.execution.arrow.maxRecordsPerBatch's default
REPS = int(os.environ.get("WAL_COSTS_REPS", "30"))
PLAN = SchemaPlan(columns=("key", "value"), topic_option="t")
PLAN_HEADERS = SchemaPlan(columns=("key", "value", "headers"), topic_option="t")
HEADERS = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))


def _batch(value_bytes: int, headers: bool = False) -> pa.RecordBatch:
    pad = b"x" * max(0, value_bytes - 8)
    rows = range(ROWS)
    columns = {"key": [b"k%07d" % i for i in rows], "value": [b"%08d" % i + pad for i in rows]}
    if not headers:
        return normalise(pa.RecordBatch.from_pydict(columns), PLAN)
    lists = pa.array([[{"key": "source", "value": b"bench"}, {"key": "seq", "value": b"%d" % i}] for i in rows],
                     HEADERS)
    return normalise(pa.RecordBatch.from_pydict({**columns, "headers": lists}), PLAN_HEADERS)


def _median_ms(step: Callable[[], object], clock: Callable[[], float] = time.perf_counter) -> float:
    """The median of ``step``'s REPS runs after a warm-up, in ms of ``clock`` (wall time, or ``time.thread_time``)."""
    step()  # warm-up
    runs = []
    for _ in range(REPS):
        started = clock()
        step()
        runs.append(clock() - started)
    return statistics.median(runs) * 1000


def _appends(wal: Wal, key: str, batch: pa.RecordBatch, digests: bytes) -> Callable[[], None]:
    """A step that appends ``batch`` as the attempt's next segment."""
    position = 0

    def append() -> None:
        nonlocal position
        # As in a task: the segment before is acknowledged by now, so this commit compacts it and LMDB reuses
        # its pages (a log that only grows would time the file's growth instead).
        rows = batch.num_rows
        acks = {position - rows: bytearray(b"\1" * rows)} if position else {}
        wal.append(key, position, batch, digests, 1 << 40, acks)
        position += rows

    return append


def _costs(wal: Wal, producer: ConfluentProducer, native: NativeProducer | None, value_bytes: int,
           headers: bool) -> dict[str, float]:
    """Median milliseconds of each stage for one batch of ``value_bytes`` values (with two headers each)."""
    batch = _batch(value_bytes, headers)
    digests = record_digests(batch, "t", "cluster")
    key = wal.begin_attempt("bench", 0, 0, {})
    append = _appends(wal, key, batch, digests)

    def send() -> None:
        producer.send(batch, "t", 1, None)  # the lists and the calls
        producer.purge()  # keep the queue from growing across repetitions
        producer.take_reports()

    def send_native() -> None:
        assert native is not None
        native.send(batch, "t", 1, None)
        native.purge()
        native.poll(0)
        native.take_reports()

    try:
        return {
            "digests": _median_ms(lambda: record_digests(batch, "t", "cluster")),
            "append": _median_ms(append),
            "lists": _median_ms(lambda: to_records(batch)),
            "calls": _median_ms(send),
            "native": _median_ms(send_native) if native is not None else float("nan"),
        }
    finally:
        wal.purge([key])


def _cpu_split(directory: str, value_bytes: int) -> dict[str, float]:
    """µs of the thread's CPU per record, digests and LMDB append, for one segment."""
    batch = _batch(value_bytes)
    if batch.nbytes > SEGMENT_MAX_BYTES:
        batch = batch.slice(0, batch.num_rows * SEGMENT_MAX_BYTES // batch.nbytes)
    digests = record_digests(batch, "t", "cluster")
    wal = open_wal(os.path.join(directory, f"split-{value_bytes}"))
    key = wal.begin_attempt("bench", 0, 0, {})
    try:
        per = 1000 / batch.num_rows
        return {"digests": _median_ms(lambda: record_digests(batch, "t", "cluster"), time.thread_time) * per,
                "append": _median_ms(_appends(wal, key, batch, digests), time.thread_time) * per}
    finally:
        wal.purge([key])


def main() -> int:
    directory = tempfile.mkdtemp(prefix="wal-costs-")
    # Nothing listens on port 1: produce() only enqueues. A queue large enough for a batch.
    conf = {"bootstrap.servers": "127.0.0.1:1", "queue.buffering.max.messages": 1_000_000,
            "queue.buffering.max.kbytes": 2_097_151, "log_level": 0}
    producer = ConfluentProducer(lambda report: Producer({**conf, "on_delivery": report}))
    native = NativeProducer(conf) if native_module() is not None else None
    try:
        wal = open_wal(directory)
        sys.stdout.write(f"one batch of {ROWS:,} keyed records, median of {REPS} (ms; per record in µs)\n")
        sys.stdout.write("| value | digests | WAL append | produce() lists | produce() calls | native send | "
                         "WAL share (native) |\n")
        sys.stdout.write("|---:|---:|---:|---:|---:|---:|---:|\n")
        for value_bytes, headers in ((100, False), (1024, False), (10240, False), (100, True)):
            cost = _costs(wal, producer, native, value_bytes, headers)
            wal_ms = cost["digests"] + cost["append"]
            cost["calls"] -= cost["lists"]  # the send makes the lists, then calls produce() per record
            cells = [f"{cost[k]:.1f} ({cost[k] * 1000 / ROWS:.2f})"
                     for k in ("digests", "append", "lists", "calls", "native")]
            shape = f"{value_bytes} B" + (" + headers" if headers else "")
            sys.stdout.write(f"| {shape} | {' | '.join(cells)} | {wal_ms / (wal_ms + cost['native']):.0%} |\n")
        sys.stdout.write("\nthe WAL in the thread's CPU, µs per record, one segment of about 8 MiB at most, median of "
                         f"{REPS}\n| value | digests | LMDB append |\n|---:|---:|---:|\n")
        for value_bytes in (100, 1024, 10240):
            split = _cpu_split(directory, value_bytes)
            sys.stdout.write(f"| {value_bytes} B | {split['digests']:.2f} | {split['append']:.2f} |\n")
    finally:
        producer.purge()
        if native is not None:
            native.purge()
        shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
