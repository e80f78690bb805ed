"""Two attempts of one partition that overlap on a host (at_least_once): Spark does not wait for a failed task's
Python worker, which goes on sending what its input had buffered while the retry runs, and may even start its
writer after the retry started. Neither order may put a record in Kafka twice."""

from __future__ import annotations

import threading

import pytest

from recoverable_sink.contract import SinkCommitMessage, TaskIdentity
from recoverable_sink.errors import InputCutShortError
from recoverable_sink.task import open_writer
from recoverable_sink.wal import open_wal
from tests.unit.fakes import FakeProducer
from tests.unit.test_delivery_identity import PLAN, batches, options, rows


def _ident(task_attempt_id: int, attempt: int) -> TaskIdentity:
    return TaskIdentity("w", 0, attempt, extra={"task_attempt_id": task_attempt_id})


def test_an_attempt_whose_writer_starts_after_its_retry_stands_down_without_sending(wal_dir):
    opts = options(wal_dir)
    retry = open_writer(opts, PLAN, _ident(7, 1), "c1", producer=FakeProducer())
    late = FakeProducer()
    with pytest.raises(InputCutShortError, match="later attempt"):
        open_writer(opts, PLAN, _ident(3, 0), "c1", producer=late)
    assert late.delivered == [] and [a.attempt for a in open_wal(wal_dir).attempts("w/")] == [1]
    for b in batches(rows(300)):
        retry.write(b)
    assert retry.commit().published == 300


def test_a_retry_waits_for_an_earlier_attempt_still_sending_then_skips_what_kafka_acknowledged_to_it(wal_dir, caplog):
    opts = options(wal_dir, **{"kafka.delivery.timeout.ms": "10000"})  # a retry waits up to about twice this
    data = rows(500)
    earlier = open_writer(opts, PLAN, _ident(3, 0), "c1", producer=FakeProducer())
    for b in batches(data[:200]):
        earlier.write(b)
    done: list[SinkCommitMessage] = []

    def retry() -> None:
        writer = open_writer(opts, PLAN, _ident(7, 1), "c1", producer=FakeProducer())
        for b in batches(data):
            writer.write(b)
        done.append(writer.commit())

    thread = threading.Thread(target=retry)
    thread.start()
    thread.join(0.5)
    assert thread.is_alive() and not done  # waiting, while the earlier attempt goes on sending
    assert "waiting for 1 earlier attempt(s)" in caplog.text
    for b in batches(data[200:400]):
        earlier.write(b)
    earlier.abort()  # its input cut short: 300 produced and acknowledged, the last 100 only logged
    thread.join(30)
    [message] = done
    assert (message.skipped, message.published, message.replayed) == (300, 200, 100)
