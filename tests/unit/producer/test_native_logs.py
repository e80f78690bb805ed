"""librdkafka's log lines reach the sink's logger (``recoverable_sink.librdkafka``) at their syslog level's
logging level, from both producers, instead of being written raw (``%3|...|FAIL|...``) to stderr."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterator

import pytest

from recoverable_sink.producer import native as native_producer
from recoverable_sink.producer.confluent import ConfluentProducer
from recoverable_sink.producer.native import NativeProducer

NOBODY = {"bootstrap.servers": "127.0.0.1:1", "reconnect.backoff.ms": "50"}  # nothing listens on port 1


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def lines() -> Iterator[_Lines]:
    logger = logging.getLogger("recoverable_sink.librdkafka")
    handler = _Lines()
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)


def _failed_connection(lines: _Lines, poll: Callable[[float], object]) -> logging.LogRecord:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        poll(0.1)
        found = [r for r in lines.records if "127.0.0.1:1" in r.getMessage()]
        if found:
            return found[0]
    raise AssertionError(f"no log line about the failed connection; got {[r.getMessage() for r in lines.records]}")


@pytest.mark.skipif(native_producer.native_module() is None, reason="the _produce extension is not built here")
def test_the_native_producers_log_lines_go_to_the_sink_logger(lines: _Lines, capfd: pytest.CaptureFixture) -> None:
    """The lines wait in C (librdkafka's threads cannot call Python) until a poll hands them over."""
    producer = NativeProducer(NOBODY)
    record = _failed_connection(lines, producer.poll)
    assert record.levelno == logging.ERROR and record.getMessage().startswith("FAIL [rdkafka#producer-")
    assert not re.search(r"^%\d\|", capfd.readouterr().err, re.M)


def test_confluent_kafkas_log_lines_go_to_the_sink_logger(lines: _Lines, capfd: pytest.CaptureFixture) -> None:
    producer = ConfluentProducer.open(NOBODY)
    record = _failed_connection(lines, producer.poll)
    assert record.levelno == logging.ERROR
    assert not re.search(r"^%\d\|", capfd.readouterr().err, re.M)


@pytest.mark.parametrize("make", [
    pytest.param(NativeProducer, id="native", marks=pytest.mark.skipif(native_producer.native_module() is None,
                                                                       reason="the _produce extension is not built")),
    pytest.param(ConfluentProducer.open, id="confluent")])
def test_a_broker_that_refuses_every_connection_gives_a_line_of_each_kind_then_a_count(lines: _Lines, make) -> None:
    """librdkafka retries every 50 ms here; its repeats are counted, and the count said when the producer closes."""
    producer = make({**NOBODY, "reconnect.backoff.max.ms": "50"})
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        producer.poll(0.1)
    shown = [r.getMessage() for r in lines.records]
    assert 1 <= sum("127.0.0.1:1" in m for m in shown) <= 3, shown
    producer.close_logs()
    counts = [m for m in (r.getMessage() for r in lines.records) if "more like it in the last" in m]
    assert counts and int(counts[0].split("librdkafka logged ")[1].split()[0]) >= 1, counts
