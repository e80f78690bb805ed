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
from recoverable_sink.executor.retention import sweep
from recoverable_sink.executor.task import open_writer
from recoverable_sink.wal import DONE, open_wal
from testing.chaos.checker import ids_in_topic, verdict
from testing.kafka_check import count_topic
from testing.kafka_local import KafkaCluster, start_cluster
from testing.spark import sink_writer, tasks_running
from testing.task_options import task_options
from testing.waiting import wait_until

ROWS = 40_000
OFFSET_END = -1  # librdkafka's OFFSET_END: DeleteRecords up to the high watermark
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
    ever). Now a write with an attempt not done keeps its proof, unless the proof topic holds it (then this host's copy
    is a cache), and the re-run sends every record once."""
    topic, wal, write_id = new_topic(4), tmp_path / "wal", f"trim-{uuid.uuid4().hex[:8]}"
    options = {"delivery.guarantee": mode, "wal.writeId": write_id, "transactional.id.prefix": f"{write_id}-",
               "wal.proofMaxBytes": "1"}
    _fail_late_in(spark, kafka, topic, wal, options, 4, 2)
    log = open_wal(str(wal))
    sweep(log, 3600, proof_max_bytes=1)  # as the next task to open this WAL would
    attempts = log.attempts(f"{write_id}/")
    assert any(a.state == DONE for a in attempts) and all(a.published for a in attempts if a.trimmed)
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
    options = task_options({"kafka.bootstrap.servers": kafka.bootstrap_servers, "topic": topic,
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
    options = task_options({"kafka.bootstrap.servers": kafka.bootstrap_servers, "topic": topic,
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
    options_a = task_options({"kafka.bootstrap.servers": kafka_a.bootstrap_servers, **base})
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


# ---- issue 61: a clock stepped during a same-id re-run; a re-run that changes the delivery guarantee ---------------
def _job(kafka, topic, wal, log, rows, partitions, prefix, options, fail_at=None, **env):
    args = ["-m", "testing.chaos.jobs", "--master", "local[2,4]", "--rows", str(rows), "--partitions", str(partitions),
            "--prefix", prefix, "--bootstrap", kafka.bootstrap_servers, "--topic", topic, "--wal", str(wal),
            "--summary", str(log.with_suffix(".jsonl")), *[a for k, v in options.items() for a in ("--option",
                                                                                                     f"{k}={v}")]]
    if fail_at is not None:
        args += ["--fail-at", str(fail_at)]
    from testing.chaos.lab import python_subprocess

    return python_subprocess(args, log, **env).wait(600), log


@pytest.mark.parametrize("mode", MODES)
def test_a_host_clock_stepped_during_a_same_id_rerun_changes_nothing_a_reader_sees(kafka, new_topic, tmp_path, mode):
    """Issue 61's first case: run 1 (4 partitions, wal.proofMaxBytes=1k) fails late in partition 3; run 2 re-runs it
    with the same wal.writeId on 8 partitions on a host whose clock stepped an hour ahead. A sweep trimmed run 1's
    proof once the 10-minute 'recent activity' guard on the host clock passed: 5,000 records visible twice."""
    from pathlib import Path

    rows, topic, wal, prefix = 20_000, new_topic(4), tmp_path / "wal", f"clock-{mode[:3]}-{uuid.uuid4().hex[:6]}"
    options = {"delivery.guarantee": mode, "wal.writeId": prefix, "transactional.id.prefix": f"{prefix}-",
               "wal.proofMaxBytes": "1k"}
    fail_at = 3 * rows // 4 + random.randrange(rows // 8, rows // 4 - 1)
    print(f"run 1 fails at row {fail_at}")
    code, log = _job(kafka, topic, wal, tmp_path / "run1.log", rows, 4, prefix, options, fail_at)
    assert code != 0 and f"upstream failure at row {fail_at}" in log.read_text(errors="replace")
    hook = Path(__file__).resolve().parents[2] / "testing" / "clock_step"
    code, log = _job(kafka, topic, wal, tmp_path / "run2.log", rows, 8, prefix, options,
                     PYTHONPATH=f"{hook}:{Path(__file__).resolve().parents[2]}", RECOVERABLE_KAFKA_CLOCK_STEP_S="3600")
    assert code == 0, log.read_text(errors="replace")[-3000:]
    found = ids_in_topic(kafka.bootstrap_servers, topic, expected=rows)
    assert verdict((f"{prefix}-{i}" for i in range(rows)), found) == (0, 0, 0)


@pytest.mark.parametrize(("first", "then"), [("at_least_once", "exactly_once"), ("exactly_once", "at_least_once")])
def test_a_rerun_that_changes_the_guarantee_counts_what_the_failed_run_delivered(spark, kafka, new_topic, tmp_path,
                                                                               first, then):
    """Issue 61's second case: a failed at_least_once write re-run with exactly_once repeated everything it had
    delivered (15,000 of 20,000): its acknowledged records are visible to read_committed readers, and count as
    delivered whichever mode delivered them. The reverse switch too."""
    topic, wal, write_id = new_topic(4), tmp_path / "wal", f"switch-{uuid.uuid4().hex[:8]}"
    options = {"wal.writeId": write_id, "transactional.id.prefix": f"{write_id}-"}
    _fail_late_in(spark, kafka, topic, wal, {**options, "delivery.guarantee": first}, 4, random.randrange(4))
    sink_writer(_frame(spark, 4), kafka.bootstrap_servers, topic, wal, **options, **{"delivery.guarantee": then}).save()
    found = ids_in_topic(kafka.bootstrap_servers, topic, expected=ROWS)
    assert verdict((str(i) for i in range(ROWS)), found) == (0, 0, 0)


def test_an_exactly_once_rerun_whose_proof_the_retention_deleted_is_refused_by_name_then_completes_when_told(
        spark, kafka, new_topic, tmp_path):
    """Issue 62: a refusal remains only where Kafka no longer holds what is needed, named as such. Run 1 fails late
    in one partition; the proof topic's records are then deleted (DeleteRecords, as its retention would), and the
    re-run runs where run 1's WAL is not: the partition no transaction committed refuses before sending, naming the
    retention and proof.failOnExpired=false; with that option the write completes (here exactly: what the markers
    name is skipped by fingerprint and the failed partition's transaction was aborted)."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    topic, write_id = new_topic(4), f"expired-{uuid.uuid4().hex[:8]}"
    options = {"delivery.guarantee": "exactly_once", "wal.writeId": write_id, "transactional.id.prefix": f"{write_id}-"}
    _fail_late_in(spark, kafka, topic, tmp_path / "wal-1", options, 4, random.randrange(4))
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})
    proof = f"{write_id}-proof"
    ends = [TopicPartition(proof, p, OFFSET_END) for p in range(1, 9)]
    for _tp, future in admin.delete_records(ends, request_timeout=30).items():
        future.result(timeout=40)
    with pytest.raises(Exception, match=r"retention deleted part of the proof(.|\n)*proof\.failOnExpired=false"):
        sink_writer(_frame(spark, 4), kafka.bootstrap_servers, topic, tmp_path / "wal-2", **options).save()
    sink_writer(_frame(spark, 4), kafka.bootstrap_servers, topic, tmp_path / "wal-2", **options,
                **{"proof.failOnExpired": "false"}).save()
    found = ids_in_topic(kafka.bootstrap_servers, topic, expected=ROWS)
    assert verdict((str(i) for i in range(ROWS)), found) == (0, 0, 0)
