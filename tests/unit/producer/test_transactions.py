"""exactly_once's transactions, without Kafka: an attempt that cannot start lets go of its transactional producer at
once, so that producer cannot fence the next attempt under the same transactional.id once the coordinator
answers it; and a marker read survives a coordinator that moved."""

from __future__ import annotations

import subprocess
import sys

import pytest
from confluent_kafka import KafkaError, KafkaException

from recoverable_sink.columns import SchemaPlan
from recoverable_sink.contract import TaskIdentity
from recoverable_sink.errors import DeliveryError
from recoverable_sink.executor import partition_writer, task
from recoverable_sink.options import parse_options
from recoverable_sink.producer import transactions
from recoverable_sink.producer.confluent import ConfluentProducer

OPTIONS = {"kafka.bootstrap.servers": "127.0.0.1:1", "topic": "t", "delivery.guarantee": "exactly_once",
           "proof.kafka": "false"}


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

    def no_room(*args: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(partition_writer, "Ledger", no_room)  # the first thing done with the opened producer
    opts = parse_options({**OPTIONS, "wal.path": str(tmp_path)})
    with pytest.raises(OSError, match="No space left"):
        task.open_writer(opts, SchemaPlan(columns=("value",), topic_option="t"), TaskIdentity("w1", 3, 0),
                             "cluster")
    assert made[0].aborted
    assert made[0].flushed


# ---- a marker read (group_offsets) ----------------------------------------------------------------------------
# The commit-marker read survives a coordinator that moved. librdkafka's own in-process mock cluster answers
# OffsetFetch with NOT_COORDINATOR / COORDINATOR_NOT_AVAILABLE: read through an AdminClient, that answer killed the
# process (SIGSEGV in librdkafka's main thread); the sink's read must retry it and return. A subprocess each, so a
# crash fails the test instead of the test run.
_SCRIPT = r"""
import ctypes, pathlib, sys
import confluent_kafka
from recoverable_sink.options import parse_options
from recoverable_sink.producer.transactions import group_offsets

libdir = pathlib.Path(confluent_kafka.__file__).resolve().parent.parent / "confluent_kafka.libs"
lib = ctypes.CDLL(str(sorted(libdir.glob("librdkafka*.so*"))[0]))  # the instance confluent-kafka loaded
lib.rd_kafka_conf_new.restype = ctypes.c_void_p
lib.rd_kafka_conf_set.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t]
lib.rd_kafka_new.restype = ctypes.c_void_p
lib.rd_kafka_new.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
lib.rd_kafka_handle_mock_cluster.restype = ctypes.c_void_p
lib.rd_kafka_handle_mock_cluster.argtypes = [ctypes.c_void_p]
lib.rd_kafka_mock_cluster_bootstraps.restype = ctypes.c_char_p
lib.rd_kafka_mock_cluster_bootstraps.argtypes = [ctypes.c_void_p]
err = ctypes.create_string_buffer(512)
conf = lib.rd_kafka_conf_new()
lib.rd_kafka_conf_set(conf, b"test.mock.num.brokers", b"3", err, 512)
rk = lib.rd_kafka_new(0, conf, err, 512)
cluster = lib.rd_kafka_handle_mock_cluster(rk)
bootstraps = lib.rd_kafka_mock_cluster_bootstraps(cluster).decode()
code, times = int(sys.argv[1]), int(sys.argv[2])
lib.rd_kafka_mock_push_request_errors(ctypes.c_void_p(cluster), ctypes.c_int16(9),  # OffsetFetch
                                      ctypes.c_size_t(times), *[ctypes.c_int(code)] * times)
options = parse_options({"kafka.bootstrap.servers": bootstraps})
print("offsets", group_offsets(options, "recoverable-kafka-preflight", ["t"], 20))
"""


@pytest.mark.parametrize(("code", "name"), [(16, "NOT_COORDINATOR"), (15, "COORDINATOR_NOT_AVAILABLE"),
                                            (14, "COORDINATOR_LOAD_IN_PROGRESS")])
def test_a_marker_read_retries_a_coordinator_that_moved_and_returns(code, name):
    run = subprocess.run([sys.executable, "-c", _SCRIPT, str(code), "2"], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, f"{name}: exit {run.returncode}\n{run.stdout}\n{run.stderr[-2000:]}"
    assert "offsets []" in run.stdout, run.stdout
