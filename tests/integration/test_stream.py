"""The streaming sink: plain writeStream with trigger(availableNow=True), output modes, and exactly-once
across a driver SIGKILLed mid-micro-batch and restarted from the same checkpoint."""

import json
import os
import signal
import subprocess
import sys

import pytest
from confluent_kafka import Producer

from recoverable_sink import RecoverableKafkaDataSource
from recoverable_sink.contract import stream_batch_of
from recoverable_sink.proof.format import ChunkKey, parse_key
from recoverable_sink.wal import open_wal
from testing.kafka_check import read_topic
from testing.kafka_local import REPO
from testing.spark import python_env, sink_stream_writer
from testing.waiting import wait_until

FILES, PER_FILE = 3, 20_000


@pytest.fixture(scope="module", autouse=True)
def registered(spark):
    spark.dataSource.register(RecoverableKafkaDataSource)


def json_input(directory, files=FILES, per_file=PER_FILE):
    directory.mkdir(parents=True, exist_ok=True)
    for f in range(files):
        lines = (json.dumps({"id": i, "payload": f"p{i}"}) for i in range(f * per_file, (f + 1) * per_file))
        (directory / f"part-{f}.json").write_text("\n".join(lines) + "\n")
    return directory


def ids_in(kafka, topic, expected):
    return [json.loads(r["value"])["id"] for r in read_topic(kafka.bootstrap_servers, topic, 120, expected=expected)]


def start_job(tmp_path, name, *args):
    """The driver in its own process group, so a SIGKILL takes its JVM and Python workers with it."""
    log = open(tmp_path / f"{name}.log", "ab")
    return subprocess.Popen([sys.executable, "-m", "testing.stream_job", *args], cwd=REPO, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True, env=python_env())


def finish(proc, tmp_path, name, timeout_s=240):
    try:
        code = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    assert code == 0, (tmp_path / f"{name}.log").read_text()[-3000:]


def test_file_stream_writes_every_record_once(spark, kafka, new_topic, tmp_path):
    topic = new_topic(partitions=2)
    source = json_input(tmp_path / "in", files=4, per_file=2500)
    df = (spark.readStream.schema("id LONG, payload STRING").option("maxFilesPerTrigger", 1).json(str(source))
          .selectExpr("CAST(id AS STRING) AS key", "to_json(struct(*)) AS value"))
    query = (sink_stream_writer(df, kafka.bootstrap_servers, topic, tmp_path / "wal",
                                **{"summary.path": str(tmp_path / "summary.jsonl"),
                                   "checkpointLocation": str(tmp_path / "checkpoint")})
             .trigger(availableNow=True).start())
    query.awaitTermination(180)
    assert query.exception() is None
    ids = ids_in(kafka, topic, 10_000)
    assert sorted(ids) == list(range(10_000))
    batches = [json.loads(line) for line in (tmp_path / "summary.jsonl").read_text().splitlines()]
    assert [b["batch_id"] for b in batches] == [0, 1, 2, 3]
    assert all(b["event"] == "commit" and b["acknowledged"] == 2500 for b in batches)
    # Each micro-batch says where its records went: consecutive batches' offsets follow each other per partition.
    for b in batches:
        assert b["offsets_complete"] and sum(o["records"] for o in b["offsets"]) == 2500
    for earlier, later in zip(batches, batches[1:], strict=False):
        for first, second in zip(*(sorted(b["offsets"], key=lambda o: o["partition"]) for b in (earlier, later)),
                                 strict=False):
            assert first["partition"] == second["partition"] and second["first"] > first["last"]
    from recoverable_sink import last_write

    assert last_write(spark)["batch_id"] == 3
    # Proof of delivery of the last batch stays until a later batch runs: digests only, no payload.
    wal = open_wal(str(tmp_path / "wal"))
    assert {a.batch_id for a in wal.attempts()} == {3}
    assert all(a.state == "done" for a in wal.attempts()) and wal.stats().payload_bytes == 0
    # In Kafka too: each earlier micro-batch's proof released once, by the next one's tasks (taking tombstones for
    # proof to release, each micro-batch used to tombstone every earlier key again), the last one's live.
    released: dict[int | None, list[bool]] = {}  # micro-batch -> tombstone?, per chunk record
    for r in read_topic(kafka.bootstrap_servers, "recoverable-kafka-proof", 60):
        key = parse_key(r["key"])
        if isinstance(key, ChunkKey) and key.scope == query.id:
            released.setdefault(stream_batch_of(key.write_id), []).append(r["value"] is None)
    assert sorted(released) == [0, 1, 2, 3]
    for batch, tombstones in released.items():
        chunks = tombstones.count(False)
        assert chunks and tombstones.count(True) == (chunks if batch < 3 else 0), (batch, tombstones)


def aggregate_query(spark, kafka, topic, tmp_path, mode):
    source = json_input(tmp_path / "in", files=2, per_file=300)
    df = (spark.readStream.schema("id LONG, payload STRING").option("maxFilesPerTrigger", 1).json(str(source))
          .selectExpr("CAST(id % 10 AS STRING) AS key").groupBy("key").count()
          .selectExpr("key", "CAST(count AS STRING) AS value"))
    return (sink_stream_writer(df, kafka.bootstrap_servers, topic, tmp_path / "wal",
                               checkpointLocation=str(tmp_path / "checkpoint"))
            .outputMode(mode).trigger(availableNow=True).start())


def test_complete_mode_appends_the_whole_result_every_trigger(spark, kafka, new_topic, tmp_path):
    topic = new_topic()
    query = aggregate_query(spark, kafka, topic, tmp_path, "complete")
    query.awaitTermination(180)
    assert query.exception() is None
    final = {}
    records = read_topic(kafka.bootstrap_servers, topic, 60, expected=20)
    for r in records:
        final[r["key"]] = int(r["value"])  # one key's records come in order: the last is the latest count
    assert len(records) == 20  # 10 keys, both triggers
    assert final == {str(k).encode(): 60 for k in range(10)}


def test_update_mode_is_refused_by_spark_for_python_sinks(spark, kafka, new_topic, tmp_path):
    """Spark grants Update mode only to sinks whose write builder supports update-as-append, which a Python
    DataSource cannot declare; the README gives the foreachBatch + wal.writeId alternative."""
    query = aggregate_query(spark, kafka, new_topic(), tmp_path, "update")
    with pytest.raises(Exception, match="recoverable_kafka does not support Update mode"):
        query.awaitTermination(180)


@pytest.mark.parametrize("pause_at", [3_000, 14_000])
def test_driver_killed_mid_batch_restarts_with_every_record_once(kafka, new_topic, tmp_path, pause_at):
    topic = new_topic(partitions=2)
    source = json_input(tmp_path / "in")
    marker = tmp_path / "paused"
    args = ["--source", "files", "--input", str(source), "--max-per-trigger", "1",
            "--bootstrap", kafka.bootstrap_servers, "--topic", topic, "--checkpoint", str(tmp_path / "checkpoint"),
            "--wal", str(tmp_path / "wal"), "--summary", str(tmp_path / "summary.jsonl"),
            "--option", f"_test.pauseAfterRecords={pause_at}", "--option", f"_test.pauseFile={marker}"]
    first = start_job(tmp_path, "first", *args)
    wait_until(lambda: marker.exists() or first.poll() is not None, 180, "the first run to reach the kill point")
    assert first.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
    os.killpg(first.pid, signal.SIGKILL)  # the driver, its JVM and its Python workers, mid-micro-batch
    first.wait(30)
    delivered_before_kill = len(read_topic(kafka.bootstrap_servers, topic, 30))
    assert pause_at <= delivered_before_kill < FILES * PER_FILE

    finish(start_job(tmp_path, "restart", *args), tmp_path, "restart")
    ids = ids_in(kafka, topic, FILES * PER_FILE)
    assert len(ids) == FILES * PER_FILE, f"{len(ids) - len(set(ids))} duplicates"
    assert sorted(ids) == list(range(FILES * PER_FILE))
    rerun = [json.loads(line) for line in (tmp_path / "summary.jsonl").read_text().splitlines()][0]
    assert rerun["batch_id"] == 0 and rerun["skipped"] >= pause_at, rerun
    # Proof of delivery of the last batch stays until a later batch runs: digests only, no payload.
    wal = open_wal(str(tmp_path / "wal"))
    assert {a.batch_id for a in wal.attempts()} == {FILES - 1}
    assert all(a.state == "done" for a in wal.attempts()) and wal.stats().payload_bytes == 0


def test_kafka_source_pipeline_killed_and_restarted_delivers_each_record_once(kafka, new_topic, tmp_path):
    """Spark's own Kafka source (spark-sql-kafka-0-10 at the pyspark version) -> recoverable_kafka."""
    # One source partition: one task per micro-batch, so the kill lands where that task paused (after a
    # checkpoint). A second concurrent task would be killed at an arbitrary moment, inside the documented
    # window where Kafka acknowledged records the WAL has not yet checkpointed (chaos scenario 1b measures it).
    source, sink_topic = new_topic(partitions=1), new_topic(partitions=2)
    total = 30_000
    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers, "enable.idempotence": True})
    for i in range(total):
        producer.produce(source, value=f"event-{i}".encode(), key=str(i % 50).encode())
        if i % 10_000 == 0:
            producer.poll(0)
    assert producer.flush(30) == 0
    marker = tmp_path / "paused"
    args = ["--source", "kafka", "--source-topic", source, "--max-per-trigger", "12000",
            "--bootstrap", kafka.bootstrap_servers, "--topic", sink_topic,
            "--checkpoint", str(tmp_path / "checkpoint"), "--wal", str(tmp_path / "wal"),
            "--option", "_test.pauseAfterRecords=2500", "--option", f"_test.pauseFile={marker}"]
    first = start_job(tmp_path, "first", *args)
    wait_until(lambda: marker.exists() or first.poll() is not None, 180, "the first run to reach the kill point")
    assert first.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
    os.killpg(first.pid, signal.SIGKILL)
    first.wait(30)
    finish(start_job(tmp_path, "restart", *args), tmp_path, "restart")
    values = [r["value"] for r in read_topic(kafka.bootstrap_servers, sink_topic, 120, expected=total)]
    assert len(values) == total, f"{len(values) - len(set(values))} duplicates"
    assert set(values) == {f"event-{i}".encode() for i in range(total)}
