"""One Spark task's write: the mode and the proof tier chosen from the options, and a partition committed only when
its input ended as Spark ends a finished partition; a cut-short input or a failing input aborts, and the next
attempt skips what this one got acknowledged."""

from __future__ import annotations

import pyarrow as pa
import pytest

from recoverable_sink.columns import SchemaPlan
from recoverable_sink.contract import TaskIdentity
from recoverable_sink.errors import InputCutShortError
from recoverable_sink.executor import task
from recoverable_sink.executor.delivery import AtLeastOnce, Transactional
from recoverable_sink.executor.kafka_proof import KafkaProofLog
from recoverable_sink.executor.proof import NoProofTopic
from recoverable_sink.executor.spark_input import InputEnd
from recoverable_sink.options import parse_options
from recoverable_sink.wal import DONE, open_wal
from tests.unit.fakes import FakeProducer, sink_producer

PLAN = SchemaPlan(columns=("key", "value"), topic_option="t")
KAFKA = {"kafka.bootstrap.servers": "127.0.0.1:1", "kafka.delivery.timeout.ms": "200", "topic": "t"}


def test_the_mode_follows_the_guarantee():
    ident = TaskIdentity("w", 0, 0)
    assert isinstance(task.mode_for(parse_options(KAFKA), ident), AtLeastOnce)
    assert isinstance(task.mode_for(parse_options({**KAFKA, "delivery.guarantee": "exactly_once"}), ident),
                      Transactional)


def test_the_proof_topic_is_the_second_tier_unless_turned_off():
    ident = TaskIdentity("w", 0, 0)
    assert isinstance(task.proof_for(parse_options(KAFKA), ident), KafkaProofLog)
    assert isinstance(task.proof_for(parse_options({**KAFKA, "proof.kafka": "false"}), ident), NoProofTopic)


@pytest.fixture
def producer(monkeypatch) -> FakeProducer:
    """The task's producer: a scripted one in place of the pooled confluent-kafka producer."""
    fake = FakeProducer()
    opened = task.open_writer
    monkeypatch.setattr(task, "open_writer", lambda *a, **kw: opened(*a, **{**kw, "producer": sink_producer(fake)}))
    return fake


def batches(n: int, size: int = 50) -> list[pa.RecordBatch]:
    values = [b"r%04d" % i for i in range(n)]
    return [pa.RecordBatch.from_pydict({"key": values[i:i + size], "value": values[i:i + size]})
            for i in range(0, n, size)]


def write(wal_dir: str, data, attempt: int, end: InputEnd = InputEnd.COMPLETE):
    options = parse_options({**KAFKA, "wal.path": wal_dir, "proof.kafka": "false"})
    return task.write_partition(data, options, PLAN, TaskIdentity("w", 0, attempt), "c1", lambda: end)


def test_a_partition_whose_input_ended_normally_is_committed(wal_dir, producer):
    message = write(wal_dir, batches(200), 0)
    assert (message.received, message.published, message.acknowledged) == (200, 200, 200)
    assert [a.state for a in open_wal(wal_dir).attempts("w/")] == [DONE]


def test_a_cut_short_input_fails_the_attempt_and_its_retry_sends_only_the_rest(wal_dir, producer):
    with pytest.raises(InputCutShortError, match="after 100 records") as failed:
        write(wal_dir, batches(100), 0, InputEnd.CUT_SHORT)
    assert "stays recorded in this host's WAL" in str(failed.value)
    assert [a.state for a in open_wal(wal_dir).attempts("w/")] != [DONE]
    _retry_sends_the_rest_once(wal_dir, producer)


def test_an_input_that_fails_midway_aborts_and_raises_its_own_error(wal_dir, producer):
    def failing():
        yield from batches(150)
        raise ValueError("upstream failure")

    with pytest.raises(ValueError, match="upstream failure"):
        write(wal_dir, failing(), 0)
    [attempt] = open_wal(wal_dir).attempts("w/")
    assert attempt.state != DONE and attempt.ended is not None  # ended: a retry need not wait for it
    _retry_sends_the_rest_once(wal_dir, producer)


def _retry_sends_the_rest_once(wal_dir: str, producer: FakeProducer) -> None:
    delivered = len(producer.values())  # the failed attempt's last batch may be logged and never handed over
    assert delivered >= 50
    message = write(wal_dir, batches(200), 1)
    assert (message.skipped, message.published) == (delivered, 200 - delivered)
    assert sorted(producer.values()) == [b"r%04d" % i for i in range(200)]
