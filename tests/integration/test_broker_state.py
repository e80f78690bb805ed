"""Broker-side state that expires or times out, on a broker whose clocks run fast: consumer-group offsets (the
exactly_once commit markers) and transactional ids expire after about a minute instead of a week, and timed-out
transactions are rolled back within a second. A stream restarted, or a write re-run, after its markers expired
must still deliver every record once; a partition whose transaction the broker rolled back on timeout must say
so, naming the option."""

import json
import time
import uuid

import pyarrow as pa
import pytest
from pyspark.sql import functions as F

from recoverable_sink import RecoverableKafkaDataSource
from recoverable_sink.columns import SchemaPlan
from recoverable_sink.contract import TaskIdentity, new_run_id
from recoverable_sink.driver.preflight import check_cluster
from recoverable_sink.errors import DeliveryError
from recoverable_sink.executor.retention import sweep
from recoverable_sink.executor.task import open_writer
from recoverable_sink.wal import DONE, open_wal
from testing.chaos.checker import ids_in_topic, verdict
from testing.chaos.lab import kill_group, python_subprocess
from testing.kafka_check import consumer_groups
from testing.kafka_local import KafkaCluster, start_cluster
from testing.spark import sink_writer, tasks_running
from testing.stream_job import write_inputs
from testing.task_options import task_options
from testing.waiting import wait_until

FAST = {"offsets.retention.minutes": "1", "offsets.retention.check.interval.ms": "1000",
        "transactional.id.expiration.ms": "10000", "transaction.remove.expired.transaction.cleanup.interval.ms": "1000",
        "transaction.abort.timed.out.transaction.cleanup.interval.ms": "1000"}


@pytest.fixture(scope="module")
def fast_broker(tmp_path_factory):
    root = tmp_path_factory.mktemp("fast-expiry")
    cluster = start_cluster(lambda: KafkaCluster(root, 1, broker_props=FAST))
    yield cluster
    cluster.stop(timeout_s=20)



def _stream_args(d, source, bootstrap, topic, mode, prefix):
    # local[4,4]: the four partitions run at once, so the others finish while one pauses.
    return ["-m", "testing.stream_job", "--source", "files", "--input", str(source), "--max-per-trigger", "4",
            "--master", "local[4,4]",
            "--bootstrap", bootstrap, "--topic", topic, "--checkpoint", str(d / "checkpoint"), "--wal", str(d / "wal"),
            "--option", f"delivery.guarantee={mode}", "--option", f"transactional.id.prefix={prefix}",
            # Each file a partition of its own: a file's opening cost alone fills a partition.
            "--conf", "spark.sql.files.openCostInBytes=134217728"]


def test_a_restart_or_rerun_after_the_brokers_expired_the_markers_sends_every_record_once(spark, fast_broker,
                                                                                         tmp_path):
    """Streams in both modes killed mid-micro-batch once three of its four partitions committed (the first to
    reach 1,000 records pauses), and an exactly_once batch write failing in one partition; once the brokers
    expired the marker groups, each is restarted (the streams on a host without their WAL) or re-run: every record
    once."""
    bootstrap = fast_broker.bootstrap_servers
    streams = {}
    for mode in ("exactly_once", "at_least_once"):
        d, topic, prefix = tmp_path / mode, f"s-{uuid.uuid4().hex[:8]}", f"exp-{uuid.uuid4().hex[:6]}-"
        fast_broker.create_topic(topic, 4)
        total = write_inputs(d / "in", [3000, 3000, 40, 60])
        pause = d / "paused"
        args = _stream_args(d, d / "in", bootstrap, topic, mode, prefix)
        first = python_subprocess([*args, "--option", "_test.pauseAfterRecords=1000", "--option",
                                   f"_test.pauseFile={pause}"], d / "first.log")
        def others_done_one_paused(job=first, marker=pause, wal=d / "wal") -> bool:
            # Not counted by a read_committed reader: the paused transaction holds every Kafka partition's
            # stable offset back. The WAL says which attempts finished (committed, under exactly_once).
            if job.poll() is not None:
                return True
            return marker.exists() and sum(a.state == DONE for a in open_wal(str(wal)).attempts()) >= 3

        try:  # one large partition paused in mid-write, the three others finished
            wait_until(others_done_one_paused, 240, "three partitions finished and one paused")
            assert first.poll() is None, (d / "first.log").read_text()[-3000:]
        finally:
            kill_group(first)
        streams[mode] = (d, topic, prefix, total, args)

    write_id, batch_topic, rows = f"exp-{uuid.uuid4().hex[:8]}", f"b-{uuid.uuid4().hex[:8]}", 20_000
    fast_broker.create_topic(batch_topic, 4)
    spark.dataSource.register(RecoverableKafkaDataSource)
    options = {"delivery.guarantee": "exactly_once", "wal.writeId": write_id, "transactional.id.prefix": f"{write_id}-"}

    def frame(fail_at=None):
        value = F.lit("v")
        if fail_at is not None:
            value = F.when(F.col("id") == fail_at, F.raise_error(F.lit("upstream failure"))).otherwise(value)
        return spark.range(rows, numPartitions=4).select(F.col("id").cast("string").alias("key"), value.alias("value"))

    with pytest.raises(Exception, match="upstream failure"):
        sink_writer(frame(fail_at=2 * rows // 4 + 4000), bootstrap, batch_topic, tmp_path / "batch-wal",
                    **options).save()
    prefixes = [streams["exactly_once"][2], f"{write_id}-"]
    assert all(consumer_groups(bootstrap, p) for p in prefixes)  # the markers are there...
    # The same failed write once more, whose committed partitions' proof will go to keep wal.proofMaxBytes.
    trimmed_id, trimmed_topic = f"trim-{uuid.uuid4().hex[:8]}", f"t-{uuid.uuid4().hex[:8]}"
    fast_broker.create_topic(trimmed_topic, 4)
    trimmed_options = {**options, "wal.writeId": trimmed_id, "transactional.id.prefix": f"{trimmed_id}-"}
    with pytest.raises(Exception, match="upstream failure"):
        sink_writer(frame(fail_at=2 * rows // 4 + 4000), bootstrap, trimmed_topic, tmp_path / "trim-wal",
                    **trimmed_options).save()
    assert consumer_groups(bootstrap, f"{trimmed_id}-")
    prefixes.append(f"{trimmed_id}-")
    # Spark gives up on the write without waiting for its other tasks: each ends in its own time, committed or not,
    # and one launched just before the abort may not have begun its attempt yet.
    wait_until(lambda: tasks_running(spark) == 0, 120, "the failed write's tasks to end")
    trim_wal = str(tmp_path / "trim-wal")
    wait_until(lambda: not any(a.still_sending() for a in open_wal(trim_wal).attempts(f"{trimmed_id}/")), 120,
               "the failed write's other tasks to end")
    done_partitions = {a.partition for a in open_wal(trim_wal).attempts(f"{trimmed_id}/") if a.state == DONE}
    committed = ids_in_topic(bootstrap, trimmed_topic, expected=len(done_partitions) * rows // 4)
    assert done_partitions and sum(committed.values()) == len(done_partitions) * rows // 4

    wait_until(lambda: not any(consumer_groups(bootstrap, p) for p in prefixes), 300,
               "the brokers to expire the commit markers")  # ...and then gone, as after a week

    sink_writer(frame(), bootstrap, batch_topic, tmp_path / "batch-wal", **options).save()
    assert verdict((str(i) for i in range(rows)), ids_in_topic(bootstrap, batch_topic, expected=rows)) == (0, 0, 0)
    # wal.proofMaxBytes reached: the failed write's proof is not trimmed while its failed partition is not done,
    # unless the proof topic holds it, so its re-run, with no marker left, still knows what the committed partitions
    # hold and sends the rest once.
    sweep(open_wal(trim_wal), 3600, proof_max_bytes=1)
    done = [a for a in open_wal(trim_wal).attempts() if a.state == DONE]
    assert {a.partition for a in done} == done_partitions and all(a.published for a in done if a.trimmed)
    sink_writer(frame(), bootstrap, trimmed_topic, tmp_path / "trim-wal", **trimmed_options).save()
    assert verdict((str(i) for i in range(rows)), ids_in_topic(bootstrap, trimmed_topic, expected=rows)) == (0, 0, 0)
    for mode, (d, topic, _, total, args) in streams.items():
        # Restarted where the first driver's WAL is not (issue 62, row 4): only the proof topic says what the killed
        # micro-batch's committed partitions hold, its markers gone.
        elsewhere = [str(d / "wal-elsewhere") if a == str(d / "wal") else a for a in args]
        second = python_subprocess(elsewhere, d / "second.log")
        assert second.wait(300) == 0, (d / "second.log").read_text()[-3000:]
        found = ids_in_topic(bootstrap, topic, expected=total)
        assert verdict((str(i) for i in range(total)), found) == (0, 0, 0), mode


def test_a_transaction_the_brokers_rolled_back_on_timeout_names_the_option(fast_broker, tmp_path):
    """The input stalls upstream of the sink (the writer is handed nothing) for longer than the transaction
    timeout after the first records went out: the brokers roll the transaction back, and the error says so."""
    topic = f"t-{uuid.uuid4().hex[:8]}"
    fast_broker.create_topic(topic, 1)
    options = task_options({"kafka.bootstrap.servers": fast_broker.bootstrap_servers, "topic": topic,
                             "delivery.guarantee": "exactly_once", "kafka.transaction.timeout.ms": "3000",
                             "wal.path": str(tmp_path / "wal"), "transactional.id.prefix": "timeout-"})
    writer = open_writer(options, SchemaPlan(columns=("key", "value"), topic_option=topic),
                         TaskIdentity("timeout", 0, 0, task_attempt_id=0, run=new_run_id()),
                         check_cluster(options))

    def batch(first):
        keys = [str(i).encode() for i in range(first, first + 1000)]
        return pa.RecordBatch.from_pydict({"key": keys, "value": keys})

    try:
        writer.write(batch(0))
        writer.write(batch(1000))  # the first batch goes out: the transaction's clock runs on the brokers
        time.sleep(6)  # past the 3 s timeout and the brokers' 1 s rollback check: an upstream stall
        with pytest.raises(DeliveryError, match=r"kafka\.transaction\.timeout\.ms=3000"):
            writer.write(batch(2000))
            writer.commit()
    finally:
        writer.abort()
    assert json.dumps(sum(ids_in_topic(fast_broker.bootstrap_servers, topic, timeout_s=10).values())) == "0"


def test_an_exactly_once_write_right_after_a_broker_starts_waits_for_its_coordinators(spark, tmp_path):
    """Right after a broker starts, its group and transaction coordinators are still loading
    (COORDINATOR_LOAD_IN_PROGRESS, NOT_COORDINATOR): the driver's probe and the tasks' marker reads ask again
    instead of failing the write."""
    cluster = KafkaCluster(tmp_path / "fresh", 1)
    cluster.start()
    try:
        topic = cluster.create_topic(f"fresh-{uuid.uuid4().hex[:8]}", 4)
        spark.dataSource.register(RecoverableKafkaDataSource)
        df = spark.range(4000, numPartitions=4).select(F.col("id").cast("string").alias("key"),
                                                       F.lit("v").alias("value"))
        sink_writer(df, cluster.bootstrap_servers, topic, tmp_path / "wal",
                    **{"delivery.guarantee": "exactly_once", "wal.writeId": "fresh"}).save()
        found = ids_in_topic(cluster.bootstrap_servers, topic, expected=4000)
        assert verdict((str(i) for i in range(4000)), found) == (0, 0, 0)
    finally:
        cluster.stop(timeout_s=20)
