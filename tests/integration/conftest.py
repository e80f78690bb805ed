"""Shared fixtures: one real Kafka broker and one SparkSession per test session; a 3-broker cluster only for
the tests that ask for it. Brokers' data and logs live under build/test-kafka/, wiped when a fixture starts; a
cluster that fails to start is stopped and started afresh once (testing.kafka_local.start_cluster)."""

from __future__ import annotations

import os
import shutil
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from testing.kafka_local import REPO, KafkaCluster, start_cluster
from testing.schema_registry import SchemaRegistry
from testing.spark import QUICK_START_ENV, local_spark

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# Overridable so that two test sessions on one machine do not stop each other's brokers.
TEST_KAFKA = Path(os.environ.get("RK_TEST_KAFKA_DIR", REPO / "build" / "test-kafka"))

# Set before any SparkSession is built: the Python workers must run this interpreter (the virtualenv's), or
# they will not find pyarrow and lmdb.
os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
# The suite starts dozens of short drivers (its own, and subprocesses that inherit this): the C1 JIT alone
# starts them faster (see testing.spark.driver_java_options).
os.environ.setdefault(QUICK_START_ENV, "1")


def _cluster(name: str, brokers: int) -> Iterator[KafkaCluster]:
    root = TEST_KAFKA / name
    if root.exists():  # a previous run that died may have left its brokers running: stop them by pid file
        KafkaCluster(root, brokers).wipe()
    shutil.rmtree(root, ignore_errors=True)
    cluster = start_cluster(lambda: KafkaCluster(root, brokers))
    try:
        yield cluster
    finally:
        cluster.stop(timeout_s=20)


@pytest.fixture(scope="session")
def kafka() -> Iterator[KafkaCluster]:
    """One real Apache Kafka broker (KRaft) on a free 127.0.0.1 port for the whole session."""
    yield from _cluster("single", 1)


@pytest.fixture(scope="session")
def kafka3() -> Iterator[KafkaCluster]:
    """Three brokers (default RF 3, min.insync.replicas 2), started only when a test asks for them."""
    yield from _cluster("three", 3)


@pytest.fixture(scope="session")
def kafka_defaults() -> Iterator[KafkaCluster]:
    """A broker with Apache Kafka's default settings, as `make kafka-up` starts one: it auto-creates topics, which
    the session broker does not (so that a misspelt topic fails there); started only when a test asks for it."""
    root = TEST_KAFKA / "defaults"
    if root.exists():
        KafkaCluster(root, 1).wipe()
    shutil.rmtree(root, ignore_errors=True)
    cluster = start_cluster(lambda: KafkaCluster(root, 1, kafka_defaults=True))
    try:
        yield cluster
    finally:
        cluster.stop(timeout_s=20)


@pytest.fixture(scope="session")
def registry() -> Iterator[SchemaRegistry]:
    """A real Schema Registry (testing.schema_registry), started only when a test asks for it."""
    r = SchemaRegistry().start()
    try:
        yield r
    finally:
        r.stop()


@pytest.fixture
def new_topic(kafka: KafkaCluster) -> Callable[..., str]:
    """``new_topic(partitions=1, **config) -> name``: a fresh, uniquely named topic on the session broker."""

    def make(partitions: int = 1, **config: str) -> str:
        return kafka.create_topic(f"t-{uuid.uuid4().hex[:12]}", partitions, 1, config or None)

    return make


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """One SparkSession for the suite: local[2,4] so that a failed task is retried (up to 4 attempts)."""
    session = local_spark("recoverable-sink-tests", **{"spark.sql.shuffle.partitions": "4"})
    yield session
    session.stop()


@pytest.fixture(scope="module")
def small_batches(spark: SparkSession) -> Iterator[None]:
    """The sink registered and Arrow batches of 1,000 rows, so that a failure upstream of the sink cuts a
    partition's input between batches, well before its end (for a module: ``usefixtures("small_batches")``)."""
    from recoverable_sink import RecoverableKafkaDataSource

    spark.dataSource.register(RecoverableKafkaDataSource)
    before = spark.conf.get("spark.sql.execution.arrow.maxRecordsPerBatch")
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "1000")
    yield
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", before)


# Longer forms of cases the suite covers otherwise, marked campaign: make chaos runs them (pytest -m campaign), make
# test does not, to stay within CI's time. Each by its test id (the part after the file's name), with what covers it.
CAMPAIGN = {
    "test_broker_down.py": {"[at_least_once]": "the exactly_once case: the same failed attempts, with more steps"},
    "test_deadlines.py": {
        "[1]": "trial 0: the silence lands at another random point of the commit",
        "[2]": "trial 0",
        "[at_least_once-batch]": "the at_least_once stream and the exactly_once batch cases",
        "[exactly_once-stream]": "the at_least_once stream and the exactly_once batch cases"},
    "test_stream.py": {"[14000]": "the pause at 3,000 rows: the same restart, later in the micro-batch"},
    "test_reruns.py": {
        "[exactly_once-3-4]": "4 to 3 here, and test_proof_elsewhere's re-runs on 3, 5 and 4 partitions in both modes",
        "[at_least_once-4-3]": "test_proof_elsewhere's re-runs on 3, 5 and 4 partitions in both modes",
        "test_a_rerun_from_a_driver_whose_clock_is_behind_on_another_partitioning_sends_every_record_once"
        "[at_least_once]": "its exactly_once case, and the clock-step cases in both modes",
        "test_a_proof_trim_before_a_rerun_keeps_what_the_rerun_needs[at_least_once]":
            "its exactly_once case, and the writer's model, which trims at random in both modes"},
    "test_exactly_once.py": {"test_a_long_stream_keeps_one_transactional_id_and_marker_group_per_partition":
                             "test_broker_state's streams, and chaos scenario 20's 200 micro-batches"},
    "test_stream_stop.py": {"[at_least_once-2]": "the exactly_once stop in its first micro-batch, the one that failed"},
    "test_field_faults.py": {"test_a_sweep_never_removes_the_log_of_a_task_still_waiting_for_its_input[at_least_once]":
                             "its exactly_once case; release() is one pure function for both modes"},
    "test_upgrade.py": {"[at_least_once]": "its exactly_once case, the strict one"},
    "test_dead_letters.py": {
        "test_a_failed_write_s_summary_counts_what_its_finished_partitions_delivered_and_dead_lettered[at_least_once]":
            "its exactly_once case"},
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        path, _, name = item.nodeid.rpartition("/")[2].partition("::")
        if any(name.endswith(suffix) for suffix in CAMPAIGN.get(path, {})):
            item.add_marker(pytest.mark.campaign)
