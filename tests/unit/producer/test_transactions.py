"""exactly_once's start, without Kafka: an attempt that cannot start lets go of its transactional producer at
once, so that producer cannot fence the next attempt under the same transactional.id once the coordinator
answers it."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException

from recoverable_sink.columns import SchemaPlan
from recoverable_sink.contract import TaskIdentity
from recoverable_sink.errors import DeliveryError
from recoverable_sink.executor import attempt_log, task
from recoverable_sink.options import parse_options
from recoverable_sink.producer import transactions
from recoverable_sink.producer.confluent import ConfluentProducer

OPTIONS = {"kafka.bootstrap.servers": "127.0.0.1:1", "topic": "t", "delivery.guarantee": "exactly_once"}


class _Producer:
    """Stands in for librdkafka under the transactional producer: ``init_transactions`` times out or succeeds."""

    made: list[_Producer] = []

    def __init__(self, conf: dict, init_fails: bool) -> None:
        self.conf = conf
        self.init_fails = init_fails
        self.flushed = False
        self.aborted = False
        self.calls: list[str] = []
        _Producer.made.append(self)

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> None:
        self.calls.append("list_topics")

    def init_transactions(self, timeout: float) -> None:
        self.calls.append("init_transactions")
        if self.init_fails:
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT))

    def begin_transaction(self) -> None:
        pass

    def purge(self) -> None:
        pass

    def abort_transaction(self, timeout: float) -> None:
        self.aborted = True

    def flush(self, timeout: float) -> int:
        self.flushed = True
        return 0


@pytest.fixture
def producers(monkeypatch: pytest.MonkeyPatch):
    _Producer.made = []

    def install(init_fails: bool) -> list[_Producer]:
        def new_producer(conf: dict, *_: object) -> ConfluentProducer:
            return ConfluentProducer(lambda _on_failure: _Producer(conf, init_fails))

        monkeypatch.setattr(transactions, "new_producer", new_producer)
        monkeypatch.setattr(transactions.PartitionTransaction, "read_markers", lambda self, topic=None: [])
        return _Producer.made

    return install


def test_a_new_transactional_producer_reaches_a_broker_before_init_transactions(producers) -> None:
    """librdkafka looks for the transaction coordinator when init_transactions is called and, with no broker
    connected yet, looks again only 500 ms later: each partition's producer is connected first."""
    made = producers(init_fails=False)
    txn = transactions.PartitionTransaction(parse_options(OPTIONS), "w1", 3, "partition 3")
    assert txn.open("t") is None
    assert made[0].calls == ["list_topics", "init_transactions"]


def test_an_attempt_whose_init_transactions_times_out_lets_go_of_its_producer(producers) -> None:
    made = producers(init_fails=True)
    txn = transactions.PartitionTransaction(parse_options(OPTIONS), "w1", 3, "partition 3")
    with pytest.raises(DeliveryError, match="init_transactions for transactional.id recoverable-kafka-w1-3"):
        txn.open("t")
    assert txn.producer is None
    assert made[0].flushed


def test_an_attempt_that_fails_after_opening_its_transaction_aborts_it(producers, monkeypatch, tmp_path) -> None:
    made = producers(init_fails=False)

    def no_wal(path: str):
        raise OSError(28, "No space left on device", path)

    monkeypatch.setattr(attempt_log, "open_wal", no_wal)
    opts = parse_options({**OPTIONS, "wal.path": str(tmp_path)})
    with pytest.raises(OSError, match="No space left"):
        task.open_writer(opts, SchemaPlan(columns=("value",), topic_option="t"), TaskIdentity("w1", 3, 0),
                             "cluster")
    assert made[0].aborted
    assert made[0].flushed
