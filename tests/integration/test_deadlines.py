"""No call hangs a task (issue 52): brokers whose replies are swallowed by a proxy (testing.kafka_proxy), so a request
is processed and its reply never comes. A stuck call ends at the deadline the sink owns for it, the task fails
cleanly, and the retry sends exactly what Kafka lacks. Each trial prints its random draws and how long the stuck
call took, so the distribution is in the test log (`-s`)."""

from __future__ import annotations

import random
import threading
import time
import uuid

import pyarrow as pa
import pytest

from recoverable_sink.columns import SchemaPlan
from recoverable_sink.contract import TaskIdentity
from recoverable_sink.deadlines import MARGIN_S
from recoverable_sink.driver.preflight import check_cluster
from recoverable_sink.errors import DeadlineExceededError, DeliveryError
from recoverable_sink.executor.partition_writer import final_wait_s
from recoverable_sink.executor.task import open_writer
from recoverable_sink.producer.transactions import transactional_id
from testing.chaos.checker import ids_in_topic, verdict
from testing.kafka_local import start_cluster
from testing.kafka_proxy import GatedCluster, Silencer, silenced_nodes
from testing.task_options import task_options
from testing.waiting import wait_until

DELIVERY_MS = 6000  # the calls' own limits in these tests: a commit's deadline is then 6 s + the margin


@pytest.fixture(scope="module")
def gated(tmp_path_factory):
    root = tmp_path_factory.mktemp("gated")
    cluster = start_cluster(lambda: GatedCluster(root, 3))
    yield cluster
    cluster.stop(timeout_s=20)


def _options(cluster, topic, mode, wal):
    prefix = f"dl-{uuid.uuid4().hex[:8]}-"
    conf = {"kafka.bootstrap.servers": cluster.bootstrap_servers, "topic": topic, "delivery.guarantee": mode,
            "wal.path": str(wal), "kafka.delivery.timeout.ms": str(DELIVERY_MS), "kafka.request.timeout.ms": "3000"}
    if mode == "exactly_once":
        conf |= {"transactional.id.prefix": prefix, "kafka.transaction.timeout.ms": "10000"}
    return task_options(conf)


def _batch(first: int, n: int) -> pa.RecordBatch:
    keys = [str(i).encode() for i in range(first, first + n)]
    return pa.RecordBatch.from_pydict({"key": keys, "value": [b"v-" + k for k in keys]})


def _read_committed(cluster, topic, rows):
    """What a read_committed reader sees once it sees ``rows`` records (an aborted transaction's markers may still be
    on their way), or at a deadline."""
    seen = []

    started = time.monotonic()

    def enough() -> bool:
        seen[:] = [ids_in_topic(cluster.bootstrap_servers, topic, expected=rows, timeout_s=10)]
        print(f"read_committed after {time.monotonic() - started:.1f} s: {sum(seen[0].values())}")
        return sum(seen[0].values()) >= rows

    try:
        wait_until(enough, 90, f"{rows} records visible to a read_committed reader")
    except AssertionError:
        pass  # fewer is a result (lost), counted by the caller
    return seen[0]


def _commit_in_thread(writer) -> tuple[threading.Thread, dict]:
    outcome: dict = {}

    def commit() -> None:
        started = time.monotonic()
        try:
            outcome["message"] = writer.commit()
        except BaseException as exc:  # noqa: BLE001 - the test looks at it
            outcome["error"] = exc
        outcome["seconds"] = time.monotonic() - started

    thread = threading.Thread(target=commit, daemon=True)
    thread.start()
    return thread, outcome


@pytest.mark.parametrize("trial", range(3))
def test_a_commit_whose_coordinators_stop_answering_ends_at_its_deadline_and_the_retry_sends_every_record_once(
        gated, tmp_path, trial):
    """exactly_once: the transaction and group coordinators of the partition stop answering at a random point of
    its commit (before the marker in the first trial). The stuck call ends within its deadline, the task fails,
    and the retry (fencing the stuck transaction) commits every record once for a read_committed reader."""
    topic = gated.create_topic(f"dl-{uuid.uuid4().hex[:8]}", 1)
    options = _options(gated, topic, "exactly_once", tmp_path / "wal")
    cluster_id = check_cluster(options)
    plan = SchemaPlan(columns=("key", "value"), topic_option=topic)
    rows = random.randrange(1_000, 5_000)
    delay = 0.0 if trial == 0 else random.uniform(0, 0.01)
    writer = open_writer(options, plan, TaskIdentity("dl", 0, 0, task_attempt_id=0, run="r1"),
                         cluster_id)
    writer.write(_batch(0, rows))
    writer.flush(wait_s=30)  # every record acknowledged: what is left is the marker and the commit
    txn_id = transactional_id(options, "dl", 0)
    nodes = {gated.coordinator_of(txn_id), gated.coordinator_of(txn_id, "__consumer_offsets")}
    limit = min(final_wait_s(options), DELIVERY_MS / 1000)
    if delay == 0:
        for node in nodes:
            gated.gates[node].swallow()
    thread, outcome = _commit_in_thread(writer)
    if delay:
        time.sleep(delay)
        for node in nodes:
            gated.gates[node].swallow()
    thread.join(limit + MARGIN_S + 30)
    for node in nodes:
        gated.gates[node].answer()
    print(f"trial {trial}: {rows} records, coordinators {sorted(nodes)} silenced {delay * 1000:.1f} ms into the "
          f"commit: {type(outcome.get('error')).__name__ if 'error' in outcome else 'committed'} after "
          f"{outcome.get('seconds', -1):.2f} s (deadline {limit + MARGIN_S:.0f} s): {outcome.get('error')}")
    assert not thread.is_alive(), "the commit is still blocked past its deadline"
    assert outcome["seconds"] <= limit + MARGIN_S + 2
    if "error" in outcome:
        assert isinstance(outcome["error"], DeliveryError), outcome["error"]
        if isinstance(outcome["error"], DeadlineExceededError):
            assert str(outcome["error"]).splitlines()[0].count("commit") >= 1
        writer.abort()
        retry = open_writer(options, plan, TaskIdentity("dl", 0, 1, task_attempt_id=1, run="r1"),
                            cluster_id)
        retry.write(_batch(0, rows))
        retry.commit()
    found = _read_committed(gated, topic, rows)
    assert verdict((str(i) for i in range(rows)), found) == (0, 0, 0)


def test_an_at_least_once_drain_whose_leader_stops_answering_ends_at_its_deadline_and_loses_nothing(gated, tmp_path):
    """at_least_once: the partition's leader stops answering while records are in flight. The final drain ends at
    the delivery timeout, the task fails, and the retry sends what Kafka never acknowledged: nothing lost, and the
    only repeats are records whose acknowledgement the proxy swallowed (the broker stored them)."""
    topic = gated.create_topic(f"dl-{uuid.uuid4().hex[:8]}", 1)
    options = _options(gated, topic, "at_least_once", tmp_path / "wal")
    cluster_id = check_cluster(options)
    plan = SchemaPlan(columns=("key", "value"), topic_option=topic)
    rows = random.randrange(2_000, 6_000)
    first = rows // 2
    writer = open_writer(options, plan, TaskIdentity("al", 0, 0, task_attempt_id=0, run="r1"),
                         cluster_id)
    writer.write(_batch(0, first))
    writer.flush(wait_s=30)
    leader = gated.leader_of(topic, 0)
    gated.gates[leader].swallow()
    writer.write(_batch(first, rows - first))
    thread, outcome = _commit_in_thread(writer)
    thread.join(final_wait_s(options) + MARGIN_S + 30)
    gated.gates[leader].answer()
    print(f"{rows} records, leader {leader} silenced after {first}: "
          f"{type(outcome.get('error')).__name__} after {outcome.get('seconds', -1):.2f} s "
          f"(final wait {final_wait_s(options):.0f} s)")
    assert not thread.is_alive() and isinstance(outcome.get("error"), DeliveryError)
    assert outcome["seconds"] <= final_wait_s(options) + 2
    writer.abort()
    retry = open_writer(options, plan, TaskIdentity("al", 0, 1, task_attempt_id=1, run="r1"),
                        cluster_id)
    retry.write(_batch(0, rows))
    message = retry.commit()
    assert message.skipped >= first  # what Kafka acknowledged before the silence is not sent again
    found = _read_committed(gated, topic, rows)
    lost, repeated, _ = verdict((str(i) for i in range(rows)), found)
    assert lost == 0 and repeated <= rows - first


# ---- on Spark: a batch write and a stream, in both modes ------------------------------------------------------
@pytest.mark.parametrize("kind", ["batch", "stream"])
@pytest.mark.parametrize("mode", ["at_least_once", "exactly_once"])
def test_a_write_whose_brokers_stop_answering_at_a_tasks_commit_completes_through_spark_retries(
        spark, gated, tmp_path, mode, kind):
    """The partition's coordinators (exactly_once) or leaders (at_least_once) stop answering at a random point of a
    task's commit, for longer than the stuck call's deadline: the task fails at the deadline, Spark retries it,
    and the write (or the stream) completes with every record once for a read_committed reader (at_least_once:
    nothing lost; repeats only of records whose acknowledgement was swallowed)."""
    from pyspark.sql import functions as F

    from recoverable_sink import RecoverableKafkaDataSource
    from testing.spark import sink_stream_writer, sink_writer

    spark.dataSource.register(RecoverableKafkaDataSource)
    topic = gated.create_topic(f"dls-{uuid.uuid4().hex[:8]}", 2)
    write_id, wal = f"dls-{uuid.uuid4().hex[:8]}", tmp_path / "wal"
    conf = {"delivery.guarantee": mode, "kafka.delivery.timeout.ms": str(DELIVERY_MS),
            "kafka.request.timeout.ms": "3000", "transactional.id.prefix": f"{write_id}-"}
    if mode == "exactly_once":
        conf["kafka.transaction.timeout.ms"] = "10000"
    options = task_options({"kafka.bootstrap.servers": gated.bootstrap_servers, "topic": topic, **conf})
    limit = min(final_wait_s(options), DELIVERY_MS / 1000) if mode == "exactly_once" else final_wait_s(options)
    silencer = Silencer(gated, wal, silenced_nodes(gated, options, topic, mode, 2), hold_s=limit + MARGIN_S + 1)
    rows = 20_000
    silencer.start()
    if kind == "batch":
        df = spark.range(rows, numPartitions=4).select(F.col("id").cast("string").alias("key"),
                                                       F.lit("v").alias("value"))
        sink_writer(df, gated.bootstrap_servers, topic, wal, **{"wal.writeId": write_id, **conf}).save()
    else:
        source = tmp_path / "in"
        source.mkdir()
        for f in range(4):
            (source / f"part-{f}.json").write_text(
                "\n".join(f'{{"id": {i}}}' for i in range(f * rows // 4, (f + 1) * rows // 4)) + "\n")
        df = (spark.readStream.schema("id LONG").option("maxFilesPerTrigger", 1).json(str(source))
              .selectExpr("CAST(id AS STRING) AS key", "'v' AS value"))
        query = (sink_stream_writer(df, gated.bootstrap_servers, topic, wal, **conf)
                 .option("checkpointLocation", str(tmp_path / "checkpoint")).trigger(availableNow=True).start())
        query.awaitTermination(600)
        assert query.exception() is None, query.exception()
    silencer.done.wait(120)
    assert silencer.silenced is not None, "no task reached its commit while the test watched"
    _, attempt, nodes = silencer.silenced
    took = silencer.took
    print(f"{mode} {kind}: nodes {sorted(nodes)} silenced at partition {attempt.partition}'s commit; its attempt "
          f"{'ended ' + format(took, '.1f') + ' s later' if took is not None else 'did not fail (done first)'} "
          f"(deadline {limit + MARGIN_S:.0f} s)")
    if took is not None:
        assert took <= limit + MARGIN_S + 5
    found = _read_committed(gated, topic, rows)
    lost, repeated, unexpected = verdict((str(i) for i in range(rows)), found)
    assert (lost, unexpected) == (0, 0)
    if mode == "exactly_once":
        assert repeated == 0
