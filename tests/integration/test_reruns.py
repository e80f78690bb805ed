"""Re-runs and zombies, on real Spark and a real broker, in both delivery modes: a re-run of a failed write that
splits the rows into another number of partitions, a replay aimed at the wrong cluster, and tasks of a run or
micro-batch that a newer one already superseded. Each random draw is printed, so a failure can be replayed."""

import random
import subprocess
import sys
import time
import uuid

import pyarrow as pa
import pytest
from pyspark.sql import functions as F

from recoverable_sink.columns import SchemaPlan
from recoverable_sink.contract import TaskIdentity, new_run_id, stream_write_id
from recoverable_sink.errors import StaleAttemptError
from recoverable_sink.executor.task import open_writer
from recoverable_sink.options import parse_options
from recoverable_sink.wal import DONE, open_wal
from recoverable_sink.wal.retention import sweep
from testing.chaos.checker import ids_in_topic, verdict
from testing.kafka_check import count_topic
from testing.kafka_local import KafkaCluster, start_cluster
from testing.spark import sink_writer, tasks_running
from testing.waiting import wait_until

ROWS = 40_000
MODES = ["at_least_once", "exactly_once"]


pytestmark = pytest.mark.usefixtures("small_batches")  # Arrow batches of 1,000 rows: a cut lands mid-way


def _frame(spark, partitions, fail_at=None):
    df = spark.range(ROWS, numPartitions=partitions)
    value = F.concat(F.lit("v-"), F.col("id").cast("string"))
    if fail_at is not None:  # evaluated in the JVM, upstream of the sink, in every attempt of that partition
        value = F.when(F.col("id") == fail_at, F.raise_error(F.lit(f"upstream failure at row {fail_at}"))) \
            .otherwise(value)
    return df.select(F.col("id").cast("string").alias("key"), value.alias("value"))


# Both ways under exactly_once, the strict mode; at_least_once shares the code path (make chaos runs scenario 22,
# a stream's form of it, in both modes).
@pytest.mark.parametrize(("mode", "before", "after"), [("exactly_once", 4, 3), ("exactly_once", 3, 4),
                                                       ("at_least_once", 4, 3)])
def test_a_rerun_that_splits_the_rows_otherwise_sends_every_record_once(spark, kafka, new_topic, tmp_path, mode,
                                                                          before, after):
    per = ROWS // before
    failing = random.randrange(before)
    fail_at = failing * per + random.randrange(per // 2, per)  # late in that partition: most of it is sent first
    print(f"{before} -> {after} partitions, partition {failing} failing at row {fail_at}")
    topic, wal, write_id = new_topic(4), tmp_path / "wal", f"rerun-{uuid.uuid4().hex[:8]}"
    options = {"delivery.guarantee": mode, "wal.writeId": write_id, "transactional.id.prefix": f"{write_id}-"}
    with pytest.raises(Exception, match=f"upstream failure at row {fail_at}"):
        sink_writer(_frame(spark, before, fail_at), kafka.bootstrap_servers, topic, wal, **options).save()
    left = ids_in_topic(kafka.bootstrap_servers, topic, timeout_s=30)
    print(f"the failed run left {sum(left.values())} records for a read_committed reader")

    sink_writer(_frame(spark, after), kafka.bootstrap_servers, topic, wal, **options).save()
    found = ids_in_topic(kafka.bootstrap_servers, topic, expected=ROWS)
    assert verdict((str(i) for i in range(ROWS)), found) == (0, 0, 0)
    # And a third run, on the first partitioning, finds every record delivered.
    sink_writer(_frame(spark, before), kafka.bootstrap_servers, topic, wal, **options).save()
    assert count_topic(kafka.bootstrap_servers, topic) == sum(found.values()) if mode == "at_least_once" else True
    assert verdict((str(i) for i in range(ROWS)), ids_in_topic(kafka.bootstrap_servers, topic, expected=ROWS)) == \
        (0, 0, 0)


def _fail_late_in(spark, kafka, topic, wal, options, partitions, failing):
    """Run 1 of a write: it fails near the end of partition ``failing`` (the others commit); its tasks have ended
    when this returns."""
    per = ROWS // partitions
    fail_at = failing * per + per - random.randrange(1, per // 8)
    print(f"run 1: {partitions} partitions, partition {failing} failing at row {fail_at}")
    with pytest.raises(Exception, match=f"upstream failure at row {fail_at}"):
        sink_writer(_frame(spark, partitions, fail_at), kafka.bootstrap_servers, topic, wal, **options).save()
    wait_until(lambda: tasks_running(spark) == 0, 120, "the failed write's tasks to end")
    wait_until(lambda: not any(a.still_sending() for a in open_wal(str(wal)).attempts(f"{options['wal.writeId']}/")),
               120, "the failed write's Python workers to stop sending")


@pytest.mark.parametrize("mode", MODES)
def test_a_rerun_from_a_driver_whose_clock_is_behind_on_another_partitioning_sends_every_record_once(
        spark, kafka, new_topic, tmp_path, monkeypatch, mode):
    """Issue 51's first case: run 1 fails late in partition 2 of 4; the re-run comes from a driver whose clock is
    600 s behind and splits the rows into 5 partitions. Runs were ordered by the drivers' clocks, so the re-run took
    nothing from run 1's proof and repeated its committed records (exactly_once: 2,967)."""
    topic, wal, write_id = new_topic(4), tmp_path / "wal", f"clock-{uuid.uuid4().hex[:8]}"
    options = {"delivery.guarantee": mode, "wal.writeId": write_id, "transactional.id.prefix": f"{write_id}-"}
    _fail_late_in(spark, kafka, topic, wal, options, 4, 2)
    real_time, real_ns = time.time, time.time_ns
    monkeypatch.setattr(time, "time", lambda: real_time() - 600)  # the driver's Python side: run ids, summaries
    monkeypatch.setattr(time, "time_ns", lambda: real_ns() - 600 * 10**9)
    sink_writer(_frame(spark, 5), kafka.bootstrap_servers, topic, wal, **options).save()
    monkeypatch.undo()
    assert verdict((str(i) for i in range(ROWS)), ids_in_topic(kafka.bootstrap_servers, topic, expected=ROWS)) == \
        (0, 0, 0)


@pytest.mark.parametrize("mode", MODES)
def test_a_proof_trim_before_a_rerun_keeps_what_the_rerun_needs(spark, kafka, new_topic, tmp_path, mode):
    """Issue 51's second case: wal.proofMaxBytes reached between a failed write and its same-id re-run. The trim
    took the failed write's successful partitions' proof (at_least_once: 15,132 repeats; exactly_once: refused for
    ever). Now a write with an attempt not done keeps its proof, and the re-run sends every record once."""
    topic, wal, write_id = new_topic(4), tmp_path / "wal", f"trim-{uuid.uuid4().hex[:8]}"
    options = {"delivery.guarantee": mode, "wal.writeId": write_id, "transactional.id.prefix": f"{write_id}-",
               "wal.proofMaxBytes": "1"}
    _fail_late_in(spark, kafka, topic, wal, options, 4, 2)
    log = open_wal(str(wal))
    sweep(log, 3600, proof_max_bytes=1)  # as the next task to open this WAL would
    attempts = log.attempts(f"{write_id}/")
    assert any(a.state == DONE for a in attempts) and not any(a.trimmed for a in attempts)
    sink_writer(_frame(spark, 4), kafka.bootstrap_servers, topic, wal, **options).save()
    assert verdict((str(i) for i in range(ROWS)), ids_in_topic(kafka.bootstrap_servers, topic, expected=ROWS)) == \
        (0, 0, 0)


# ---- zombies: tasks of a run or micro-batch that a newer one superseded, driven through the writer ------------
def _batch(first: int, n: int) -> pa.RecordBatch:
    keys = [str(i).encode() for i in range(first, first + n)]
    return pa.RecordBatch.from_pydict({"key": keys, "value": [b"v-" + k for k in keys]})


def _write(options, ident, cluster_id, batch):
    writer = open_writer(options, SchemaPlan(columns=("key", "value"), topic_option=options.topic), ident, cluster_id)
    try:
        writer.write(batch)
        return writer.commit()
    except BaseException:
        writer.abort()
        raise


@pytest.mark.parametrize("mode", MODES)
def test_a_zombie_micro_batch_sends_nothing_once_a_later_one_ran(kafka, new_topic, tmp_path, mode):
    """A driver frozen while micro-batch 1's task starts, resumed after another driver committed batches 1 and 2
    from the same checkpoint: its task of batch 1 must stand down before sending."""
    from recoverable_sink.driver.preflight import check_cluster

    topic = new_topic(1)
    options = parse_options({"kafka.bootstrap.servers": kafka.bootstrap_servers, "topic": topic,
                             "delivery.guarantee": mode, "wal.path": str(tmp_path / "wal"),
                             "transactional.id.prefix": f"zombie-{uuid.uuid4().hex[:8]}-"})
    cluster_id = check_cluster(options)
    query = uuid.uuid4().hex

    def ident(batch, run):
        return TaskIdentity(write_id=stream_write_id(query, batch), partition=0, attempt=0, kind="stream",
                            query_id=query, batch_id=batch, task_attempt_id=batch, run=run)

    frozen = new_run_id()  # the frozen driver's run began first
    newer = new_run_id()
    for batch in (1, 2):
        _write(options, ident(batch, newer), cluster_id, _batch(batch * 1000, 1000))
    with pytest.raises(StaleAttemptError, match="micro-batch 2"):
        _write(options, ident(1, frozen), cluster_id, _batch(1000, 1000))
    assert verdict((str(i) for i in range(1000, 3000)), ids_in_topic(kafka.bootstrap_servers, topic, expected=2000)) \
        == (0, 0, 0)


@pytest.mark.parametrize("mode", MODES)
def test_a_stale_attempt_of_an_earlier_run_sends_nothing_once_a_newer_run_wrote(kafka, new_topic, tmp_path, mode):
    """A batch write's task that starts late, after a re-run (a newer run of the same wal.writeId) wrote its
    partition: no clock says which run is newer, so it is judged as a re-run of its own, and the newer run's proof
    on this host tells it that everything is delivered: it sends nothing."""
    from recoverable_sink.driver.preflight import check_cluster

    topic = new_topic(1)
    options = parse_options({"kafka.bootstrap.servers": kafka.bootstrap_servers, "topic": topic,
                             "delivery.guarantee": mode, "wal.path": str(tmp_path / "wal"),
                             "wal.writeId": "stale", "transactional.id.prefix": f"stale-{uuid.uuid4().hex[:8]}-"})
    cluster_id = check_cluster(options)
    older, newer = new_run_id(), new_run_id()

    def ident(run):
        return TaskIdentity(write_id="stale", partition=0, attempt=0, kind="batch",
                            task_attempt_id=0, run=run)

    _write(options, ident(newer), cluster_id, _batch(0, 1000))
    stale = _write(options, ident(older), cluster_id, _batch(0, 1000))
    assert (stale.published, stale.skipped) == (0, 1000)
    assert verdict((str(i) for i in range(1000)), ids_in_topic(kafka.bootstrap_servers, topic, expected=1000)) \
        == (0, 0, 0)


# ---- the wrong cluster --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def kafka_a(tmp_path_factory):
    """A second, single-broker cluster: the one a write was meant for."""
    root = tmp_path_factory.mktemp("cluster-a")
    cluster = start_cluster(lambda: KafkaCluster(root, 1))
    yield cluster
    cluster.stop(timeout_s=20)


def test_a_replay_to_the_wrong_cluster_is_refused_and_never_counts_as_delivered(kafka, kafka_a, tmp_path):
    """A write to cluster A fails with every record logged (A went down). `replay` aimed at cluster B is refused,
    naming both ids; forced with --allow-other-cluster it copies the records to B but records nothing, so the
    re-run against A still delivers every record there."""
    from recoverable_sink.driver.preflight import check_cluster

    topic = f"wrong-{uuid.uuid4().hex[:8]}"
    kafka_a.create_topic(topic, 1)
    kafka.create_topic(topic, 1)
    wal = tmp_path / "wal"
    base = {"topic": topic, "wal.path": str(wal), "wal.writeId": "to-a", "kafka.delivery.timeout.ms": "3000",
            "kafka.request.timeout.ms": "2000"}
    options_a = parse_options({"kafka.bootstrap.servers": kafka_a.bootstrap_servers, **base})
    cluster_a = check_cluster(options_a)
    rows = random.randrange(2_000, 6_000)
    print(f"{rows} records")
    writer = open_writer(options_a, SchemaPlan(columns=("key", "value"), topic_option=topic),
                         TaskIdentity("to-a", 0, 0, task_attempt_id=0, run=new_run_id()), cluster_a)
    kafka_a.kill_broker(kafka_a.node_ids[0])  # A is unreachable before the records are handed over
    try:
        writer.write(_batch(0, rows))
        with pytest.raises(Exception, match="did not acknowledge"):
            writer.commit()
    finally:
        writer.abort()

    def replay(*extra):
        return subprocess.run([sys.executable, "-m", "recoverable_sink.ops.cli", "replay", "--path", str(wal),
                               "--write-id", "to-a", "--bootstrap-servers", kafka.bootstrap_servers, *extra],
                              capture_output=True, text=True, timeout=180)

    refused = replay()
    assert refused.returncode != 0 and cluster_a in refused.stderr, refused.stdout + refused.stderr
    assert count_topic(kafka.bootstrap_servers, topic) == 0
    forced = replay("--allow-other-cluster")
    assert forced.returncode == 0, forced.stdout + forced.stderr
    assert count_topic(kafka.bootstrap_servers, topic) >= rows  # copied to B, as asked

    kafka_a.start_broker(kafka_a.node_ids[0])
    kafka_a.wait_ready()
    _write(options_a, TaskIdentity("to-a", 0, 0, task_attempt_id=0, run=new_run_id()), cluster_a,
           _batch(0, rows))
    assert verdict((str(i) for i in range(rows)), ids_in_topic(kafka_a.bootstrap_servers, topic, expected=rows)) \
        == (0, 0, 0)
