"""The native producer (executor): the sink's producer interface over the ``_produce`` C extension, which feeds
a batch's Arrow buffers to librdkafka in one C call without the GIL and keeps failure reports, by record
position, in C until the task collects them. librdkafka is the one inside confluent-kafka's wheel, opened at run
time; :func:`native_module` says once per process which producer path runs and why.
"""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import confluent_kafka
import pyarrow as pa
from confluent_kafka import KafkaError, KafkaException

from recoverable_sink._logging import get_logger
from recoverable_sink.producer.arguments import producer_columns
from recoverable_sink.producer.client_log import RepeatSummary
from recoverable_sink.producer.reports import Failure, Reports, Stopped

if TYPE_CHECKING:  # the extension is optional at run time; its stub types the handle
    from recoverable_sink import _produce

log = get_logger("producer")
_librdkafka_log = get_logger("librdkafka")  # librdkafka's own lines; producer.confluent routes its own there too
# syslog's levels, as librdkafka logs: emergency, alert, critical, error, warning, notice, info, debug.
_SYSLOG_LEVELS = (logging.CRITICAL, logging.CRITICAL, logging.CRITICAL, logging.ERROR, logging.WARNING,
                  logging.INFO, logging.INFO, logging.DEBUG)


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
            import recoverable_sink._produce as _produce  # optional, like the digests
        except ImportError as exc:
            if _first_in_executor("no-native-produce"):
                log.info("the sink runs without its C produce loop here (%s), as expected from a --py-files zip "
                         "or an install without a C compiler: records go through confluent-kafka's produce(), "
                         "with the same guarantees, somewhat slower; install the wheel for the faster path", exc)
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


def _first_in_executor(what: str) -> bool:
    """True once per Spark executor (its Python workers are forked from one daemon, their parent) and per process
    elsewhere: a flag file named for the parent, made atomically in the temporary directory."""
    flag = Path(tempfile.gettempdir()) / f"recoverable-sink-{what}-{os.getuid()}-{os.getppid()}"
    try:
        with open(flag, "x"):
            return True
    except FileExistsError:
        return False
    except OSError:
        return True


class NativeProducer:
    """A librdkafka producer fed from Arrow arrays by the ``_produce`` extension. Failure reports (by the slot and
    index each record's opaque carries) and the written offsets (success reports folded in C) wait in C until
    :meth:`take_reports`; librdkafka's log lines, kept in C meanwhile, go to the ``recoverable_sink.librdkafka``
    logger after every ``poll``/``flush``, their repeats summarised (:mod:`~recoverable_sink.producer.client_log`)."""

    kind = "native"

    def __init__(self, conf: dict[str, Any]) -> None:
        module = native_module()
        if module is None:
            raise RuntimeError("the _produce extension is not available")
        # offsets=True: acknowledged records are reported too, folded in C into each topic-partition's first and
        # last offset (the write's summary says where its records went).
        self._p: _produce.Producer = module.Producer({k: str(v) for k, v in conf.items()}, offsets=True)
        self._summary = RepeatSummary(_librdkafka_log)

    def _logs(self) -> None:
        for level, line in self._p.take_logs():  # kept in C: librdkafka's threads cannot call Python
            self._summary.log(_SYSLOG_LEVELS[min(max(level, 0), 7)], line)
        self._summary.due()

    def close_logs(self) -> None:
        self._logs()
        self._summary.flush()

    def take_reports(self) -> Reports:
        failures = [Failure(opaque >> 32, opaque & 0xFFFFFFFF, KafkaError(code), topic, partition)
                    for opaque, code, partition, topic in self._p.take_failures()]
        written, complete = self._p.take_written()
        return Reports(failures, written, complete)

    def poll(self, timeout: float = 0) -> int:
        try:
            return self._p.poll(timeout)
        finally:
            self._logs()

    def flush(self, timeout: float = -1) -> int:
        try:
            return self._p.flush(timeout)
        finally:
            self._logs()

    def __len__(self) -> int:
        return len(self._p)

    def purge(self) -> None:
        self._p.purge()

    def send(self, batch: pa.RecordBatch, topic: str | None, slot: int, rows: list[int] | None) -> int:
        """The batch's Arrow arrays go to librdkafka in one C call; each record's opaque is its slot and index."""
        if rows is not None:
            batch = batch.take(pa.array(rows, pa.int64()))
        taken, code, text = self._p.send(topic, slot, *producer_columns(batch))
        if code:
            names = batch.schema.names
            row_topic = batch.column("topic")[taken].as_py() if "topic" in names else topic
            part = batch.column("partition")[taken].as_py() if "partition" in names else None
            raise Stopped(taken, KafkaException(KafkaError(code, text)), row_topic, -1 if part is None else part)
        return taken

    def partition_count(self, topic: str, timeout_s: float) -> tuple[int, KafkaError | None]:
        count, code, text = self._p.partition_count(topic, timeout_s)
        return count, KafkaError(code, text or KafkaError(code).str()) if count < 0 else None

    def connect(self, timeout_s: float, topic: str | None = None) -> str | None:
        """Wait until a broker answers a metadata request: None, or why not (any broker: ``topic`` is not asked
        about)."""
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
        self._p.send_marker(group, topic, partition, offset, metadata, timeout_s)

    def commit_transaction(self, timeout_s: float) -> None:
        self._p.commit_transaction(timeout_s)

    def abort_transaction(self, timeout_s: float) -> None:
        self._p.abort_transaction(timeout_s)
