"""librdkafka's repeated log lines (a broker down: a line per reconnect attempt) are said once per kind and then as
a count, once a minute and when the producer is closed."""

from __future__ import annotations

import logging

from recoverable_sink.producer.client_log import ClientLogger, RepeatSummary

REFUSED = ("FAIL [rdkafka#producer-{n}] [thrd:127.0.0.1:9092/bootstrap]: 127.0.0.1:9092/1: Connect to "
           "ipv4#127.0.0.1:9092 failed: Connection refused (after {ms}ms in state CONNECT)")


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _summary(caplog) -> tuple[RepeatSummary, _Clock]:
    clock = _Clock()
    caplog.set_level(logging.DEBUG, logger="test.librdkafka")
    return RepeatSummary(logging.getLogger("test.librdkafka"), every_s=60, clock=clock), clock


def test_a_line_repeated_every_50_ms_for_seven_minutes_gives_one_line_a_minute_with_the_count(caplog):
    summary, clock = _summary(caplog)
    for i in range(7 * 60 * 20):  # every reconnect.backoff.ms=50 for seven minutes
        clock.now = i * 0.05
        summary.log(logging.ERROR, REFUSED.format(n=1, ms=i % 7))
    summary.flush()
    said = [r for r in caplog.records if "Connection refused" in r.getMessage()]
    assert 7 <= len(said) <= 9, [r.getMessage() for r in said]
    assert all(r.levelno == logging.ERROR for r in said)
    assert said[0].getMessage() == REFUSED.format(n=1, ms=0)
    counted = [int(r.getMessage().split("librdkafka logged ")[1].split()[0]) for r in said[1:]]
    assert sum(counted) + 1 == 7 * 60 * 20  # every line is in a count


def test_other_kinds_of_lines_are_said_apart_and_a_quiet_kind_says_nothing_more(caplog):
    summary, clock = _summary(caplog)
    summary.log(logging.ERROR, REFUSED.format(n=1, ms=0))
    summary.log(logging.WARNING, "1/1 brokers are down")
    summary.log(logging.ERROR, REFUSED.format(n=1, ms=3))  # the same kind: its numbers left out
    clock.now = 120
    summary.due()
    summary.flush()
    assert [r.getMessage() for r in caplog.records] == [
        REFUSED.format(n=1, ms=0), "1/1 brokers are down",
        REFUSED.format(n=1, ms=3) + " (librdkafka logged 1 more like it in the last 120 s, not shown)"]


def test_confluent_kafkas_logger_interface_formats_its_arguments(caplog):
    summary, _ = _summary(caplog)
    ClientLogger(summary).log(logging.WARNING, "%s [%s] %s", "FAIL", "rdkafka#producer-1", "down")
    assert caplog.records[0].getMessage() == "FAIL [rdkafka#producer-1] down"
