"""Defects found outside the fault campaign's paths, each at a random moment: the retention sweep against a task
still waiting for its input, a transaction outliving its timeout, and the exactly_once preflight on a broker
that has just started. The jobs run in drivers of their own: with Python workers not reused, every task's worker
sweeps as it starts (a reused one sweeps once per 10 minutes); without retries, a task's error is the job's."""

import json
import random
import subprocess
import sys
import uuid

import pytest

from recoverable_sink.driver.preflight import check_transactions
from recoverable_sink.options import parse_options
from testing.chaos.checker import ids_in_topic, verdict
from testing.kafka_local import REPO, KafkaCluster
from testing.spark import python_env

ROWS, PARTITIONS = 6_000, 4


@pytest.mark.parametrize("mode", ["at_least_once", "exactly_once"])
def test_a_sweep_never_removes_the_log_of_a_task_still_waiting_for_its_input(kafka, new_topic, tmp_path, mode):
    slow, quick = random.uniform(6.0, 9.0), random.uniform(2.5, 4.0)
    print(f"partition 0 waits {slow:.2f} s for its first row, partition 1 {quick:.2f} s")
    topic, summary = new_topic(2), tmp_path / "summary.jsonl"
    job = subprocess.run(
        [sys.executable, "-m", "testing.chaos.jobs", "--rows", str(ROWS), "--partitions", str(PARTITIONS),
         "--prefix", "sw", "--bootstrap", kafka.bootstrap_servers, "--topic", topic, "--wal", str(tmp_path / "wal"),
         "--summary", str(summary), "--conf", "spark.python.worker.reuse=false",
         "--delay", f"0={slow}", "--delay", f"1={quick}",
         "--option", f"delivery.guarantee={mode}", "--option", f"wal.retentionHours={2.0 / 3600}"],
        cwd=REPO, env=python_env(), capture_output=True, text=True, timeout=300)
    assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-3000:]
    found = ids_in_topic(kafka.bootstrap_servers, topic, expected=ROWS)
    assert verdict((f"sw-{i}" for i in range(ROWS)), found) == (0, 0, 0)
    assert json.loads(summary.read_text().splitlines()[-1])["retried_partitions"] == 0


def test_a_transaction_outliving_its_timeout_is_reported_as_a_timeout_not_as_fencing(kafka, new_topic, tmp_path):
    """exactly_once, kafka.transaction.timeout.ms=3000, and an upstream stage that stalls a partition mid-way
    for longer (at a random row): the brokers abort the transaction on timeout, and the task's error says so and
    names the option to raise, instead of blaming another attempt. No retries (local[2]): the error is the job's.
    """
    # Past a few of the JVM's 64 KB socket buffers of input, so that the sink has sent records (and so begun the
    # transaction on the brokers) when the stall comes.
    at_row, topic = random.randrange(12_000, 16_000), new_topic(1)
    job = subprocess.run(
        [sys.executable, "-m", "testing.chaos.jobs", "--master", "local[2]", "--rows", "20000", "--partitions", "1",
         "--prefix", "tt", "--bootstrap", kafka.bootstrap_servers, "--topic", topic, "--wal", str(tmp_path / "wal"),
         "--summary", str(tmp_path / "summary.jsonl"), "--delay", f"0=16@{at_row}",
         "--conf", "spark.sql.execution.arrow.maxRecordsPerBatch=500",
         "--option", "delivery.guarantee=exactly_once", "--option", "kafka.transaction.timeout.ms=3000"],
        cwd=REPO, env=python_env(), capture_output=True, text=True, timeout=300)
    out = job.stdout + job.stderr
    assert job.returncode != 0, out[-3000:]
    assert "longer than kafka.transaction.timeout.ms=3000, so the brokers aborted it on timeout" in out, out[-5000:]
    assert "fenced this one" not in out
    assert sum(ids_in_topic(kafka.bootstrap_servers, topic, timeout_s=30).values()) == 0


def test_the_exactly_once_preflight_on_a_broker_just_started_waits_for_its_coordinators(tmp_path):
    """The first exactly_once write on a freshly started broker met COORDINATOR_LOAD_IN_PROGRESS reading the
    marker group on the driver, which did not retry; the tasks do."""
    cluster = KafkaCluster(tmp_path / "fresh", 1)
    cluster.start()
    try:
        topic = cluster.create_topic(f"fresh-{uuid.uuid4().hex[:8]}", 1)
        check_transactions(parse_options({"kafka.bootstrap.servers": cluster.bootstrap_servers, "topic": topic,
                                          "delivery.guarantee": "exactly_once",
                                          "transactional.id.prefix": f"fresh-{uuid.uuid4().hex[:8]}-"}))
    finally:
        cluster.stop(timeout_s=20)


@pytest.mark.parametrize("mode", ["at_least_once", "exactly_once"])
def test_a_topic_column_into_a_topic_with_a_small_max_message_bytes_writes_ordinary_records(spark, kafka, new_topic,
                                                                                           tmp_path, mode):
    """max.message.bytes below the sink's default batch.size (384 KiB), named by a topic column: every full
    batch used to fail as MSG_SIZE_TOO_LARGE (and the re-run failed again). The driver fits batch.size to the
    smallest limit among the cluster's topics."""
    from recoverable_sink import RecoverableKafkaDataSource
    from testing.spark import sink_writer

    spark.dataSource.register(RecoverableKafkaDataSource)
    limit = random.randrange(50_000, 200_000)
    small, rows = new_topic(2, **{"max.message.bytes": str(limit)}), 60_000
    print(f"max.message.bytes={limit}")
    df = spark.range(rows, numPartitions=2).selectExpr("CAST(id AS STRING) AS key", f"'{small}' AS topic",
                                                       "repeat('v', 100) AS value")
    sink_writer(df, kafka.bootstrap_servers, None, tmp_path / "wal", **{"delivery.guarantee": mode}).save()
    found = ids_in_topic(kafka.bootstrap_servers, small, expected=rows)
    assert verdict((str(i) for i in range(rows)), found) == (0, 0, 0)
