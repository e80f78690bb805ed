"""The Kafka producer side of a task (executor): a small per-process pool of librdkafka producers,
delivery tracking, and error classification.

librdkafka does the retrying (retriable errors are retried until ``delivery.timeout.ms``), the idempotent
ordering and the murmur2 partitioning; this module only records which records Kafka acknowledged.

Producers report failed deliveries only (``delivery.report.only.error``): a per-record report and callback
cost more than the rest of the send path. What Kafka acknowledged is learnt at **drains** instead: once the
producer's queue is empty, every record handed over since the last drain is acknowledged, except those a
failure report named. The task drains every checkpoint interval and at its end, so it knows as much as a
per-record report would have told it at its checkpoints.

Two producers, one contract (:func:`send_batch`):
- :class:`NativeProducer` (the default where the ``_produce`` extension is built): a batch's Arrow buffers go
  to librdkafka in one C call without the GIL, and a failure report names the record by its position (the
  message opaque), kept in C until the task collects it.
- :class:`TrackedProducer` (``producer.native=false``, or no extension, as with ``--py-files``):
  confluent-kafka's ``produce()`` once per record, failures matched by content (topic, key and value).
"""

from __future__ import annotations

import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from operator import length_hint
from pathlib import Path
from typing import Any

import confluent_kafka
import pyarrow as pa
from confluent_kafka import KafkaError, KafkaException, Message, Producer

from recoverable_sink._logging import get_logger
from recoverable_sink.errors import DeliveryError, FatalProducerError, RecordError
from recoverable_sink.options import SinkOptions
from recoverable_sink.records import KafkaRecords, producer_columns, to_records

log = get_logger("delivery")

_DEFAULT_DELIVERY_TIMEOUT_MS = 300_000  # librdkafka's default message.timeout.ms
_POOL_MAX = 8
_POOL_IDLE_S = 600.0  # like Spark's producer cache (spark.kafka.producer.cache.timeout, 10 minutes)

ProducerKey = tuple[tuple[str, str], ...]


class TrackedProducer(Producer):
    """A librdkafka producer whose only delivery reports are failures, handed to the tracker of the task
    using it (``tracker``, set by the task for its duration: producers are reused by the tasks a Python
    worker runs, one at a time)."""

    def __init__(self, conf: dict[str, Any]) -> None:
        # A plain function over a one-item list: the producer holds its callback, and a callback holding the
        # producer (a bound method) would make a cycle that only the garbage collector breaks.
        slot: list[DeliveryTracker | None] = [None]

        def on_failure(err: KafkaError | None, msg: Message) -> None:
            tracker = slot[0]
            if err is not None and tracker is not None:
                tracker.on_failure(err, msg)

        super().__init__({**conf, "delivery.report.only.error": True, "on_delivery": on_failure})
        self._slot = slot

    @property
    def tracker(self) -> DeliveryTracker | None:
        return self._slot[0]

    @tracker.setter
    def tracker(self, tracker: DeliveryTracker | None) -> None:
        self._slot[0] = tracker


def _librdkafka_path() -> str:
    """The librdkafka that confluent-kafka's own producer uses (its wheel ships one), else the system's."""
    libs = Path(confluent_kafka.__file__).resolve().parent.parent / "confluent_kafka.libs"
    found = sorted(libs.glob("librdkafka*.so*"))
    return str(found[0]) if found else "librdkafka.so.1"


_native: list[Any] = []  # [the loaded _produce module, or None], decided once per process


def native_module() -> Any:
    """The ``_produce`` extension with librdkafka loaded, or None where it is not built or cannot load. The
    first call logs which producer path this process takes and, where it is the slower one, why."""
    if not _native:
        try:
            from recoverable_sink import _produce  # optional, like the digests
        except ImportError as exc:
            log.warning("the native produce loop is not available in this Python (%s: the package was installed "
                        "without its C extension, e.g. from --py-files or without a C compiler); producing "
                        "through confluent-kafka, which is slower", exc)
            _native.append(None)
        else:
            path = _librdkafka_path()
            try:
                version = _produce.load(path)
            except OSError as exc:
                log.warning("the native produce loop is off (%s); producing through confluent-kafka, which is "
                            "slower", exc)
                _native.append(None)
            else:
                log.info("producing through the native produce loop (librdkafka %s from %s)", version, path)
                _native.append(_produce)
    return _native[0]


class NativeProducer:
    """A librdkafka producer fed from Arrow buffers by the ``_produce`` extension. Only failures are reported;
    they are collected after every ``poll``/``flush`` and handed to ``tracker`` (set by the task using it)."""

    def __init__(self, conf: dict[str, Any]) -> None:
        module = native_module()
        if module is None:
            raise RuntimeError("the _produce extension is not available")
        self._p = module.Producer({k: str(v) for k, v in conf.items()})
        self.tracker: DeliveryTracker | None = None

    def _collect(self) -> None:
        failures = self._p.take_failures()
        if failures and self.tracker is not None:
            self.tracker.on_failures_at(failures)

    def poll(self, timeout: float = 0) -> int:
        try:
            return self._p.poll(timeout)
        finally:
            self._collect()

    def flush(self, timeout: float = -1) -> int:
        try:
            return self._p.flush(timeout)
        finally:
            self._collect()

    def __len__(self) -> int:
        return len(self._p)

    def purge(self) -> None:
        self._p.purge()

    def send(self, topic: str | None, batch: pa.RecordBatch, slot: int) -> tuple[int, int, str]:
        """Hand every row of a normalised batch over, in order: (rows handed, error code, text)."""
        return self._p.send(topic, batch.num_rows, slot, *producer_columns(batch))

    def partition_count(self, topic: str, timeout_s: float) -> tuple[int, str | None]:
        count, code, text = self._p.partition_count(topic, timeout_s)
        return count, (text or KafkaError(code).str()) if count < 0 else None

    def connect(self, timeout_s: float) -> str | None:
        """Wait until a broker answers a metadata request: None, or why not."""
        code, text = self._p.connect(timeout_s)
        return (text or KafkaError(code).str()) if code else None

    # exactly_once: the transaction calls, with confluent-kafka's names and errors (KafkaException).
    def init_transactions(self, timeout_s: float) -> None:
        self._p.init_transactions(timeout_s)

    def begin_transaction(self) -> None:
        self._p.begin_transaction()

    def send_marker(self, group: str, topic: str, partition: int, offset: int, metadata: str,
                    timeout_s: float) -> None:
        """The commit marker: ``group``'s offset of (topic, partition), inside the open transaction."""
        self._p.send_offset(group, topic, partition, offset, metadata, timeout_s)

    def commit_transaction(self, timeout_s: float) -> None:
        self._p.commit_transaction(timeout_s)

    def abort_transaction(self, timeout_s: float) -> None:
        self._p.abort_transaction(timeout_s)


SinkProducer = TrackedProducer | NativeProducer


def new_producer(conf: dict[str, Any], native: bool) -> SinkProducer:
    """A native producer where asked for and available, else confluent-kafka's."""
    return NativeProducer(conf) if native and native_module() is not None else TrackedProducer(conf)


def wait_for_broker(producer: Producer | NativeProducer, topic: str | None, timeout_s: float) -> str | None:
    """Wait until the producer has a broker to talk to (it answered a metadata request): None, or why not.

    A transactional producer looks for its coordinator when ``init_transactions()`` is called, and librdkafka
    retries that search only after 500 ms if no broker was connected yet, which a new producer never is."""
    if isinstance(producer, NativeProducer):
        return producer.connect(timeout_s)
    try:
        producer.list_topics(topic, timeout=timeout_s)
    except KafkaException as exc:
        return str(exc)
    return None


def partition_count(producer: SinkProducer, topic: str, timeout_s: float) -> tuple[int, str | None]:
    """A topic's partition count from the cluster's metadata: (count, None), or (-1, why not)."""
    if isinstance(producer, NativeProducer):
        return producer.partition_count(topic, timeout_s)
    meta = producer.list_topics(topic, timeout=timeout_s).topics.get(topic)
    if meta is None or meta.error is not None:
        return -1, meta.error.str() if meta is not None and meta.error is not None else "no metadata"
    return len(meta.partitions), None


class ProducerPool:
    """Producers by configuration, reused across the tasks a Python worker runs (connection set-up is paid
    once per worker, not once per task). At most ``max_size`` are kept; one idle for ``idle_s`` is flushed
    briefly and closed the next time the pool is used."""

    def __init__(self, max_size: int = _POOL_MAX, idle_s: float = _POOL_IDLE_S) -> None:
        self.max_size = max_size
        self.idle_s = idle_s
        self._producers: dict[tuple[ProducerKey, bool], tuple[SinkProducer, float]] = {}
        self._lock = threading.Lock()

    def get(self, options: SinkOptions) -> SinkProducer:
        now = time.monotonic()
        key = (options.producer_items, options.native_producer)
        with self._lock:
            expired = [k for k, (_, used) in self._producers.items() if now - used > self.idle_s]
            entry = self._producers.get(key)
            if entry is None:
                while len(self._producers) - len(expired) >= self.max_size:
                    expired.append(min((k for k in self._producers if k not in expired),
                                       key=lambda k: self._producers[k][1]))
                try:
                    producer = new_producer(options.producer_config(), options.native_producer)
                except KafkaException as exc:
                    raise DeliveryError(f"cannot create the Kafka producer: {options.scrub(str(exc))}") from None
            else:
                producer = entry[0]
            self._producers[key] = (producer, now)
            stale = [self._producers.pop(k)[0] for k in expired if k != key]
        for old in stale:
            _close(old, flush_s=1.0)
        return producer

    def discard(self, options: SinkOptions) -> None:
        """Drop a producer after a failure so the next task starts with an empty queue and a fresh state."""
        with self._lock:
            entry = self._producers.pop((options.producer_items, options.native_producer), None)
        if entry is not None:
            _close(entry[0], flush_s=0.0, purge=True)

    def close(self) -> None:
        """Flush (briefly) and drop every producer."""
        with self._lock:
            producers = [p for p, _ in self._producers.values()]
            self._producers.clear()
        for producer in producers:
            _close(producer, flush_s=5.0)

    def __len__(self) -> int:
        return len(self._producers)


def _close(producer: SinkProducer, flush_s: float, purge: bool = False) -> None:
    try:
        if purge:
            producer.purge()
        producer.flush(flush_s)
    except (KafkaException, RuntimeError, SystemError) as exc:  # SystemError: see fatal_errors()
        log.debug("closing a producer: %s", exc)


producers = ProducerPool()


def delivery_timeout_s(options: SinkOptions) -> float:
    conf = options.producer_config()
    ms = conf.get("delivery.timeout.ms") or conf.get("message.timeout.ms") or _DEFAULT_DELIVERY_TIMEOUT_MS
    return int(ms) / 1000


@dataclass
class _Handed:
    """One segment's records handed to the producer since the last drain."""

    seg_first: int
    bitmap: bytearray
    upto: int  # records [0, upto) were handed over or skipped (fewer than all when one was refused)
    topic: str | None  # the topic of records without a topic of their own
    records: Callable[[], KafkaRecords] | None  # recomputes the records, to match failure reports by content
    slot: int = 0  # native: the slot its records' opaques carry
    rows: list[int] | None = None  # native: the segment row of each record sent, when some were skipped


@dataclass
class DeliveryTracker:
    """What Kafka acknowledged, by segment: one bitmap per segment, one byte per record, filled at drains."""

    bitmaps: dict[int, bytearray] = field(default_factory=dict)
    dirty: set[int] = field(default_factory=set)
    produced: int = 0
    acked: int = 0
    failed: int = 0
    errors: list[tuple[str, int, KafkaError]] = field(default_factory=list)
    window: list[_Handed] = field(default_factory=list)  # handed over since the last drain
    failures: Counter[tuple[str | None, bytes | None, bytes | None]] = field(default_factory=Counter)
    failed_rows: dict[int, list[int]] = field(default_factory=dict)  # native: by slot, the rows that failed
    slots: int = 0  # native: slots given out

    def on_failure(self, err: KafkaError, msg: Message) -> None:
        self.failed += 1
        self.failures[(msg.topic(), msg.key(), msg.value())] += 1
        if len(self.errors) < 20:
            self.errors.append((msg.topic(), msg.partition(), err))

    def on_failures_at(self, failures: list[tuple[int, int, int, str | None]]) -> None:
        """Native failure reports: (opaque = slot << 32 | row, error code, partition, topic or None)."""
        for opaque, code, partition, topic in failures:
            self.failed += 1
            self.failed_rows.setdefault(opaque >> 32, []).append(opaque & 0xFFFFFFFF)
            if len(self.errors) < 20:
                self.errors.append((topic or "?", partition, KafkaError(code)))

    def segment(self, seg_first: int, n: int, skip: list[bool] | None) -> tuple[bytearray, list[int] | None]:
        """A new segment's bitmap, its skipped records (delivered earlier) marked acknowledged, and the positions
        of the records to hand over when some are skipped (None: all of them)."""
        bitmap = bytearray(n)
        self.bitmaps[seg_first] = bitmap
        if skip is None or not any(skip):
            return bitmap, None
        for i in range(n):
            if skip[i]:
                bitmap[i] = 1
        self.dirty.add(seg_first)
        return bitmap, [i for i in range(n) if not skip[i]]

    def next_slot(self) -> int:
        self.slots += 1
        return self.slots

    def handed(self, handed: _Handed, count: int) -> None:
        self.produced += count
        if count:
            self.window.append(handed)

    def drained(self) -> None:
        """The producer's queue is empty: every record handed over since the last drain was acknowledged
        unless a failure report named its content (every record of that content then counts as failed:
        possibly one more copy sent again, never one lost)."""
        for handed in self.window:
            bitmap = handed.bitmap
            if self.failures and handed.records is not None:
                records = handed.records()
                n = len(records)
                rows = zip(records.topics or [handed.topic] * n, records.keys or [None] * n, records.values,
                           strict=True)
                for i, (t, k, v) in enumerate(rows):
                    if i >= handed.upto:
                        break
                    if (t, _b(k), _b(v)) not in self.failures:
                        bitmap[i] = 1
            else:
                bitmap[:handed.upto] = b"\x01" * handed.upto
                for i in self.failed_rows.pop(handed.slot, ()):
                    bitmap[i if handed.rows is None else handed.rows[i]] = 0
            self.dirty.add(handed.seg_first)
        self.window.clear()
        self.failures.clear()
        self.failed_rows.clear()
        self.acked = self.produced - self.failed

    @property
    def outstanding(self) -> int:
        return self.produced - self.acked - self.failed

    def take_dirty(self) -> dict[int, bytearray]:
        """Bitmaps changed since the last call (copies, to persist); fully acknowledged segments are
        forgotten afterwards so memory stays flat in the partition size."""
        out = {first: bytearray(self.bitmaps[first]) for first in self.dirty}
        for first in self.dirty:
            if 0 not in self.bitmaps[first]:  # a C scan; all() makes an int per byte
                del self.bitmaps[first]
        self.dirty.clear()
        return out

    def restore(self, acks: dict[int, bytearray]) -> None:
        """Bitmaps taken by :meth:`take_dirty` whose save failed: the next call returns them again. A segment
        still tracked keeps its own bitmap, which is newer (acknowledgements only add up)."""
        for first, bitmap in acks.items():
            self.bitmaps.setdefault(first, bitmap)
            self.dirty.add(first)

    def first_error(self) -> str | None:
        if not self.errors:
            return None
        topic, partition, err = self.errors[0]
        more = f" (and {self.failed - 1} more failed records)" if self.failed > 1 else ""
        if err.code() == KafkaError._MSG_TIMED_OUT:
            kind = "not acknowledged within delivery.timeout.ms; the broker may or may not have stored it"
        elif err.fatal():
            kind = "fatal producer error"
        else:
            kind = "retriable, retries exhausted" if err.retriable() else "permanent"
        where = f"partition {partition}" if partition is not None and partition >= 0 else "partition not yet assigned"
        return f"topic {topic} {where}: {err.name()} ({kind}): {err.str()}{more}"


def _b(data: object) -> bytes | None:
    """A field as the producer sent it (str is sent as UTF-8)."""
    return data.encode() if isinstance(data, str) else data  # type: ignore[return-value]


@contextmanager
def fatal_errors() -> Iterator[None]:
    """Turn a fatal producer error raised out of ``poll``/``flush`` into :class:`FatalProducerError`.

    confluent-kafka raises it as a KafkaException, except when a delivery callback runs in the same call
    after the error was set: Python then reports a SystemError caused by that KafkaException, or (seen with
    failure-only reports, a fenced transactional producer) a SystemError that ``flush`` "returned NULL
    without setting an exception"."""
    try:
        yield
    except (KafkaException, SystemError) as exc:
        cause = exc if isinstance(exc, KafkaException) else exc.__cause__
        if not isinstance(cause, KafkaException):
            raise FatalProducerError(f"fatal producer error: the client failed without naming it ({exc})") from None
        err = cause.args[0]
        raise FatalProducerError(f"fatal producer error: {err.name()}: {err.str()}") from None


def serve(producer: SinkProducer, tracker: DeliveryTracker) -> None:
    """Serve reports that are ready, without waiting; an empty queue is a drain."""
    with fatal_errors():
        producer.poll(0)
    if tracker.window and len(producer) == 0:
        tracker.drained()


def drain(producer: SinkProducer, tracker: DeliveryTracker, timeout_s: float) -> None:
    """Wait up to ``timeout_s`` for the producer's queue to empty (serving failure reports); if it emptied,
    learn what was acknowledged."""
    with fatal_errors():
        left = producer.flush(timeout_s)
    if left == 0:
        tracker.drained()


def _refused(exc: KafkaException, position: int, topic: str | None, partition: int,
             scrub: Callable[[str], str], tracker: DeliveryTracker | None = None) -> Exception:
    err = exc.args[0]
    where = f"record {position} to topic {topic}" + (f" partition {partition}" if partition >= 0 else "")
    if err.code() == KafkaError._STATE:
        # A transaction that an earlier delivery failure made abortable refuses every later record: that failure
        # is the cause, not this record.
        cause = tracker.first_error() if tracker is not None else None
        return DeliveryError(f"the transaction stopped taking records after an earlier error"
                             f"{' (the first failed delivery: ' + scrub(cause) + ')' if cause else ''}: "
                             f"{err.name()}: {scrub(err.str())}; {where} is not at fault")
    if err.code() in (KafkaError.MSG_SIZE_TOO_LARGE, KafkaError._UNKNOWN_PARTITION, KafkaError._UNKNOWN_TOPIC,
                      KafkaError._INVALID_ARG):
        return RecordError(f"{where} was refused by the producer: {err.name()}: {scrub(err.str())}")
    if err.fatal() or err.code() in (KafkaError._FATAL, KafkaError._FENCED):
        return FatalProducerError(f"{where} could not be queued: fatal producer error: {err.name()}: "
                                  f"{scrub(err.str())}")
    return DeliveryError(f"{where} could not be queued: {err.name()}: {scrub(err.str())}")


def send_batch(producer: SinkProducer, batch: pa.RecordBatch, topic: str | None, seg_first: int,
               skip: list[bool] | None, tracker: DeliveryTracker, scrub: Callable[[str], str]) -> int:
    """Hand one segment's records (a normalised batch) to the producer, except those marked in ``skip``
    (already delivered, recorded as acknowledged); returns how many were handed over. The native producer
    takes the batch's Arrow buffers in one call; confluent-kafka's takes per-record lists (:func:`produce`)."""
    if not isinstance(producer, NativeProducer):
        return produce(producer, to_records(batch), topic, seg_first, skip, tracker, scrub, lambda: to_records(batch))
    n = batch.num_rows
    bitmap, rows = tracker.segment(seg_first, n, skip)
    if rows is not None:
        batch = batch.take(pa.array(rows, pa.int64()))
    slot = tracker.next_slot()
    handed, code, text = 0, 0, ""
    with fatal_errors():
        try:
            if batch.num_rows:  # every row may have been skipped
                handed, code, text = producer.send(topic, batch, slot)
        finally:
            upto = n if handed == batch.num_rows else handed if rows is None else rows[handed]
            tracker.handed(_Handed(seg_first, bitmap, upto, topic, None, slot, rows), handed)
        if code:
            # A handle in a fatal state (fenced, idempotence lost) refuses every record with that error's code:
            # poll raises it as fatal, which the task reports as such, not as this record's problem.
            producer.poll(0)
            names = batch.schema.names
            row_topic = batch.column("topic")[handed].as_py() if "topic" in names else topic
            part = batch.column("partition")[handed].as_py() if "partition" in names else None
            position = seg_first + (handed if rows is None else rows[handed])
            raise _refused(KafkaException(KafkaError(code, text)), position, row_topic, -1 if part is None else part,
                           scrub, tracker)
        producer.poll(0)
    return handed


# produce()'s own defaults for its optional positional arguments: key, partition, on_delivery, callback,
# timestamp, headers.
_DEFAULTS: tuple[object, ...] = (None, -1, None, None, 0, None)


def produce(producer: Producer, records: KafkaRecords, topic: str | None, seg_first: int,
            skip: list[bool] | None, tracker: DeliveryTracker, scrub: Callable[[str], str],
            recompute: Callable[[], KafkaRecords] | None = None) -> int:
    """Hand one segment's records to the producer, except those marked in ``skip`` (already delivered),
    which are recorded as acknowledged. Returns how many were handed over. ``recompute`` gives the records
    again if a failure report must be matched (default: keep ``records`` until the next drain).

    Blocks (serving reports) while librdkafka's local queue is full: nothing is dropped, and records keep
    their order. This is the hot loop of the sink: one ``produce`` call per record, no per-record callback,
    and no per-record Python bytecode either (``map`` drives the calls from C, about 2x a ``for`` loop)."""
    n = len(records)
    bitmap, rows = tracker.segment(seg_first, n, skip)
    # produce()'s positional arguments (cheaper than keywords): topic, value, then key, partition (-1: the
    # partitioner picks), on_delivery (None: the producer's failure report), callback (unused alias),
    # timestamp (0: unset), headers. Only as far as the last one the records set: each argument left out is
    # one less to parse (topic, value and key alone make a call about 15% cheaper than all eight).
    optional = [
        records.keys,
        [-1 if p is None else p for p in records.partitions] if records.partitions is not None else None,
        None,
        None,
        [0 if t is None else t for t in records.timestamps] if records.timestamps is not None else None,
        records.headers,
    ]
    given = max((i + 1 for i, column in enumerate(optional) if column is not None), default=0)
    columns = [records.topics if records.topics is not None else [topic] * n, records.values]
    columns += [column if column is not None else [_DEFAULTS[i]] * n for i, column in enumerate(optional[:given])]
    if rows is not None:
        columns = [[column[i] for i in rows] for column in columns]
    count, handed = len(columns[1]), 0
    with fatal_errors():
        try:
            _send_in_order(producer, columns)
            handed = count
        except _Stopped as stop:
            handed = stop.index
            if isinstance(stop.exc, KafkaException):
                partition = columns[3][handed] if len(columns) > 3 else -1
                raise _refused(stop.exc, seg_first + (handed if rows is None else rows[handed]),
                               columns[0][handed], partition, scrub, tracker) from None
            raise stop.exc  # noqa: B904 - as it was: fatal_errors() reads a SystemError's cause
        finally:
            # Counted even when a record is refused midway (that record and those after it were not handed
            # over): the failure path waits for the acknowledgements of those before it.
            upto = n if handed == count else handed if rows is None else rows[handed]
            tracker.handed(_Handed(seg_first, bitmap, upto, topic, recompute or (lambda: records)), handed)
        producer.poll(0)
    return handed


class _Stopped(Exception):
    """``exc`` stopped the sending at row ``index``: the rows before it were handed over, it and later ones not."""

    def __init__(self, index: int, exc: BaseException) -> None:
        super().__init__(index)
        self.index = index
        self.exc = exc


def _send_in_order(producer: Producer, columns: list[list[Any]]) -> None:
    """Call ``produce`` once per row of ``columns`` (its positional arguments, column by column), from C.
    When librdkafka's queue is full the row that did not fit is retried (serving reports) before any later
    row is tried, so rows are handed over in order. Raises _Stopped when anything else stops it."""
    send = producer.produce
    count = len(columns[1])
    rows = [iter(column) for column in columns]
    while True:
        try:
            deque(map(send, *rows), maxlen=0)
            return
        except BaseException as exc:
            # map took row i from every column before its call failed: the rest is what the columns have left.
            i = count - length_hint(rows[1]) - 1
            if not isinstance(exc, BufferError):
                raise _Stopped(i, exc) from None
            try:
                _send_when_room(producer, *(column[i] for column in columns))
            except BaseException as failed:
                raise _Stopped(i, failed) from None


def _send_when_room(producer: Producer, *record: object) -> None:
    """librdkafka's local queue is full: serve reports until it takes the record (nothing is dropped)."""
    while True:
        producer.poll(0.05)
        try:
            producer.produce(*record)
            return
        except BufferError:
            continue


def wait_for_acks(producer: SinkProducer, tracker: DeliveryTracker, timeout_s: float) -> None:
    """Drain until every handed-over record is acknowledged or has failed, with a deadline past
    librdkafka's own delivery timeout (after which it reports every undelivered record as failed)."""
    deadline = time.monotonic() + timeout_s
    while tracker.outstanding > 0:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        drain(producer, tracker, min(1.0, remaining))
