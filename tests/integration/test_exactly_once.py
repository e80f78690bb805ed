"""delivery.guarantee=exactly_once on real Spark and a real broker: what a read_committed consumer sees, the
commit markers' life, and the driver-side refusals. The faults are in test_chaos (both modes)."""

import json
from functools import partial

import pyarrow as pa
import pytest
from pyspark.sql import functions as F

from recoverable_sink import RecoverableKafkaDataSource
from recoverable_sink.columns import SchemaPlan
from recoverable_sink.contract import TaskIdentity
from recoverable_sink.driver.preflight import check_cluster
from recoverable_sink.errors import DeliveryError
from recoverable_sink.executor.task import open_writer
from recoverable_sink.identity import Fingerprint
from testing.chaos.checker import ids_in_topic, verdict
from testing.spark import sink_stream_writer, sink_writer
from testing.task_options import task_options

EO = {"delivery.guarantee": "exactly_once"}


@pytest.fixture(scope="module", autouse=True)
def registered(spark):
    spark.dataSource.register(RecoverableKafkaDataSource)


def _markers(kafka, groups):
    """The groups among ``groups`` that hold a committed offset (a commit marker)."""
    from recoverable_sink.producer.transactions import read_markers

    options = task_options({"kafka.bootstrap.servers": kafka.bootstrap_servers})
    return [group for group in groups if read_markers(options, group, None)]


def _ids(spark, n, partitions=4):
    return spark.range(n, numPartitions=partitions).select(F.col("id").cast("string").alias("key"),
                                                           F.lit("v").alias("value"))


def test_every_record_once_for_read_committed_and_markers_gone_after_commit(spark, kafka, new_topic, tmp_path):
    topic = new_topic(4)
    sink_writer(_ids(spark, 5000), kafka.bootstrap_servers, topic, tmp_path / "wal",
                **{**EO, "transactional.id.prefix": "eo-a-", "summary.path": str(tmp_path / "s.jsonl")}).save()
    found = ids_in_topic(kafka.bootstrap_servers, topic, expected=5000)
    assert (len(found), sum(found.values())) == (5000, 5000)
    summary = json.loads((tmp_path / "s.jsonl").read_text().splitlines()[-1])
    assert summary["acknowledged"] == 5000
    # A generated-id write's markers are deleted at its commit.
    assert _markers(kafka, [f"eo-a-{summary['write_id']}-{p}" for p in range(4)]) == []


def test_rerun_of_a_committed_write_id_sends_nothing(spark, kafka, new_topic, tmp_path):
    topic = new_topic(2)
    options = {**EO, "transactional.id.prefix": "eo-b-", "wal.writeId": "eo-rerun-1",
               "summary.path": str(tmp_path / "s.jsonl")}
    for _ in range(2):
        sink_writer(_ids(spark, 3000, 3), kafka.bootstrap_servers, topic, tmp_path / "wal", **options).save()
    found = ids_in_topic(kafka.bootstrap_servers, topic, expected=3000)
    assert (len(found), sum(found.values())) == (3000, 3000)
    second = json.loads((tmp_path / "s.jsonl").read_text().splitlines()[-1])
    assert (second["published"], second["skipped"]) == (0, 3000)
    # Markers of a wal.writeId write stay (that is what made the re-run send nothing), one per partition.
    groups = [f"eo-b-eo-rerun-1-{p}" for p in range(3)]
    assert _markers(kafka, groups) == groups


def test_transaction_timeout_above_the_brokers_maximum_fails_on_the_driver(spark, kafka, new_topic, tmp_path):
    topic = new_topic(1)
    with pytest.raises(Exception, match=r"kafka\.transaction\.timeout\.ms=3600000 exceeds the brokers' "
                                         r"transaction\.max\.timeout\.ms=900000"):
        sink_writer(_ids(spark, 10, 1), kafka.bootstrap_servers, topic, tmp_path / "wal",
                    **{**EO, "kafka.transaction.timeout.ms": "3600000"}).save()
    assert ids_in_topic(kafka.bootstrap_servers, topic) == {}


def _eo_options(kafka, topic, prefix, wal_dir):
    """exactly_once options for a partition writer driven by hand; a wal_dir per simulated host."""
    return task_options({"kafka.bootstrap.servers": kafka.bootstrap_servers, "topic": topic, **EO,
                          "transactional.id.prefix": prefix, "wal.path": str(wal_dir)})


def _host_options(kafka, topic, prefix, root, host_name):
    return _eo_options(kafka, topic, prefix, root / host_name)


def _keyed_batches(rows, size=500):
    return [pa.RecordBatch.from_pydict({"key": [b"%05d" % i for i in range(s, s + size)], "value": [b"v"] * size})
            for s in range(0, rows, size)]


def test_a_zombie_attempt_is_fenced_by_a_copy_on_another_host_and_nothing_repeats(kafka, new_topic, tmp_path):
    """Speculative copies and zombies, at the task level (Spark never places a speculative copy on the host of
    the attempt it doubles, so one machine cannot make Spark do it): attempt 0 is mid-transaction when attempt
    1 starts on another host (another WAL), sends the whole partition and commits; attempt 0 must then fail,
    and an attempt starting later must send nothing."""
    topic = new_topic(2)
    plan = SchemaPlan(columns=("key", "value"), topic_option=topic)

    host = partial(_host_options, kafka, topic, "zombie-", tmp_path)  # a WAL per simulated host
    cluster_id = check_cluster(host("a"))
    data = _keyed_batches(3000)
    zombie = open_writer(host("a"), plan, TaskIdentity("wz", 0, 0), cluster_id)
    for batch in data[:3]:
        zombie.write(batch)  # two batches handed to the producer inside its transaction, one logged

    copy = open_writer(host("b"), plan, TaskIdentity("wz", 0, 1), cluster_id)  # fences the zombie
    for batch in data:
        copy.write(batch)
    assert copy.commit().acknowledged == 3000

    with pytest.raises(DeliveryError, match="partition 0 \\(attempt 0\\) of write wz: .*fenced this one"):
        try:
            for batch in data[3:]:
                zombie.write(batch)
            zombie.commit()
        except BaseException:
            zombie.abort()
            raise

    late = open_writer(host("c"), plan, TaskIdentity("wz", 0, 2), cluster_id)
    for batch in data:
        late.write(batch)
    message = late.commit()
    assert (message.committed_before, message.published, message.skipped) == (True, 0, 3000)

    found = ids_in_topic(kafka.bootstrap_servers, topic, expected=3000)
    assert (len(found), sum(found.values())) == (3000, 3000)


def test_a_retry_after_a_transaction_cut_short_sends_exactly_the_rest_in_any_order(kafka, new_topic, tmp_path):
    """Found by the fault campaign: a task reading a shuffle whose fetch failed saw its input end early and
    committed only part of its partition. A retry on the same host reads that attempt's digests and commits
    exactly the records it lacked, whatever order its input comes in; a later attempt sends nothing."""
    topic = new_topic(1)
    plan = SchemaPlan(columns=("key", "value"), topic_option=topic)
    options = _eo_options(kafka, topic, "short-", tmp_path / "wal")
    cluster_id = check_cluster(options)
    keys = [b"%05d" % i for i in range(2000)]
    keys[1500] = keys[10]  # a record twice in the input: matched as a multiset, so both copies land
    data = [pa.RecordBatch.from_pydict({"key": keys[s:s + 500], "value": [b"v"] * 500}) for s in range(0, 2000, 500)]
    cut_short = open_writer(options, plan, TaskIdentity("ws", 0, 0), cluster_id)
    for batch in data[:2]:
        cut_short.write(batch)
    assert cut_short.commit().acknowledged == 1000

    retry = open_writer(options, plan, TaskIdentity("ws", 0, 1), cluster_id)
    for batch in reversed(data):  # as out of a shuffle: another order on a retry
        retry.write(batch.take(pa.array(range(499, -1, -1))))
    message = retry.commit()
    assert (message.committed_before, message.published, message.skipped) == (True, 1000, 1000)

    late = open_writer(options, plan, TaskIdentity("ws", 0, 2), cluster_id)
    for batch in data:
        late.write(batch)
    assert (late.commit().published, late.message.skipped) == (0, 2000)

    found = ids_in_topic(kafka.bootstrap_servers, topic, expected=2000)
    assert sum(found.values()) == 2000 and set(found.values()) == {1, 2} and found[keys[10].decode()] == 2


def test_a_retry_elsewhere_after_a_transaction_cut_short_sends_exactly_the_rest(kafka, new_topic, tmp_path):
    """The same cut-short transaction, retried where the WAL holding its digests is not: the proof topic holds them
    (written inside the committed transaction), so the retry sends exactly the records missing."""
    topic = new_topic(1)
    plan = SchemaPlan(columns=("key", "value"), topic_option=topic)

    host = partial(_host_options, kafka, topic, "short-", tmp_path)  # a WAL per simulated host
    cluster_id = check_cluster(host("a"))
    data = _keyed_batches(2000)
    cut_short = open_writer(host("a"), plan, TaskIdentity("wo", 0, 0), cluster_id)
    for batch in data[:2]:
        cut_short.write(batch)
    assert cut_short.commit().acknowledged == 1000

    elsewhere = open_writer(host("b"), plan, TaskIdentity("wo", 0, 1), cluster_id)
    for batch in data[::-1]:
        elsewhere.write(batch)
    message = elsewhere.commit()
    assert (message.published, message.skipped) == (1000, 1000)
    found = ids_in_topic(kafka.bootstrap_servers, topic, expected=2000)
    assert (len(found), sum(found.values())) == (2000, 2000)


def test_without_the_proof_topic_a_retry_elsewhere_after_a_cut_short_transaction_refuses(kafka, new_topic, tmp_path):
    """proof.kafka=false: the retry elsewhere cannot tell which records are missing, so it fails naming both counts
    and where the digests are, and sends nothing; a retry back on that host then completes the partition."""
    topic = new_topic(1)
    plan = SchemaPlan(columns=("key", "value"), topic_option=topic)

    def host(name):
        return task_options({"kafka.bootstrap.servers": kafka.bootstrap_servers, "topic": topic, **EO,
                             "transactional.id.prefix": "short-wal-", "wal.path": str(tmp_path / name),
                             "proof.kafka": "false"})

    cluster_id = check_cluster(host("a"))
    data = _keyed_batches(2000)
    cut_short = open_writer(host("a"), plan, TaskIdentity("wo", 0, 0), cluster_id)
    for batch in data[:2]:
        cut_short.write(batch)
    assert cut_short.commit().acknowledged == 1000

    elsewhere = open_writer(host("b"), plan, TaskIdentity("wo", 0, 1), cluster_id)
    for batch in data:
        elsewhere.write(batch)
    with pytest.raises(DeliveryError, match=f"committed 1000 records .* now holds 2000.*WAL {tmp_path / 'a'} on host"):
        elsewhere.commit()

    back = open_writer(host("a"), plan, TaskIdentity("wo", 0, 2), cluster_id)
    for batch in data:
        back.write(batch)
    assert back.commit().published == 1000
    found = ids_in_topic(kafka.bootstrap_servers, topic, expected=2000)
    assert (len(found), sum(found.values())) == (2000, 2000)


@pytest.mark.parametrize("producer", ["native", "confluent"])
def test_a_commit_marker_reads_back_whole_whichever_producer_wrote_it(kafka, new_topic, tmp_path, producer):
    """The marker's metadata is stored with its trailing NUL, as confluent-kafka writes it and its readers expect
    (they read up to the NUL): written without it, a retry read whatever followed in memory as part of the
    marker (undecodable metadata in 4 of 6 runs of the cut-short test above)."""
    from recoverable_sink.producer.marker import Marker
    from recoverable_sink.producer.native import NativeProducer
    from recoverable_sink.producer.transactions import PartitionTransaction

    topic = new_topic(1)
    options = task_options({"kafka.bootstrap.servers": kafka.bootstrap_servers, "topic": topic, **EO,
                             "transactional.id.prefix": f"marker-{producer}-", "wal.path": str(tmp_path / "wal"),
                             "producer.native": str(producer == "native").lower()})
    wal = "/a/wal/path/as/long/as/a/test's/" + "x" * 200  # a marker as long as a real one (heap past it is dirty)
    for write in range(6):  # the missing NUL showed in about one read in ten: six writes catch it most runs
        first = PartitionTransaction(options, f"w{write}", 0, "partition 0")
        assert first.open(topic) is None
        assert isinstance(first.producer, NativeProducer) is (producer == "native")
        fingerprint = Fingerprint(100 + write, 2**127 + write)
        first.commit(Marker(write_id=f"w{write}", partition=0, topic=topic, records=100 + write,
                            attempts=(f"attempt-{write}",), fingerprint=fingerprint, wal=wal), 30)
        retry = PartitionTransaction(options, f"w{write}", 0, "partition 0")
        assert retry.open(topic) is not None  # init_transactions, then the marker read
        retry.close()
        assert retry.marker is not None
        assert (retry.marker.write_id, retry.marker.records, retry.marker.attempts, retry.marker.wal,
                retry.marker.fingerprint) == (f"w{write}", 100 + write, (f"attempt-{write}",), wal, fingerprint)


def test_a_long_stream_keeps_one_transactional_id_and_marker_group_per_partition(spark, kafka, new_topic, tmp_path):
    """Ids and marker groups are shared by a query's micro-batches: after 12 micro-batches of 4 partitions, and a
    restart from the checkpoint that runs 4 more, the brokers keep at most 4 of each, and every record is there
    once for a read_committed reader."""
    from testing.kafka_check import consumer_groups, transactional_ids

    topic, source, prefix = new_topic(4), tmp_path / "in", "eo-long-"
    source.mkdir()

    def add_files(first, count, per_file=250):
        for f in range(first, first + count):
            rows = "\n".join(json.dumps({"id": i}) for i in range(f * per_file, (f + 1) * per_file))
            (source / f"part-{f:03d}.json").write_text(rows + "\n")

    def run():
        df = (spark.readStream.schema("id LONG").option("maxFilesPerTrigger", 1).json(str(source)).repartition(4)
              .selectExpr("CAST(id AS STRING) AS key", "'v' AS value"))
        query = (sink_stream_writer(df, kafka.bootstrap_servers, topic, tmp_path / "wal",
                                    **{**EO, "transactional.id.prefix": prefix,
                                       "checkpointLocation": str(tmp_path / "checkpoint")})
                 .trigger(availableNow=True).start())
        query.awaitTermination(300)
        assert query.exception() is None

    add_files(0, 12)
    run()
    add_files(12, 4)
    run()
    found = ids_in_topic(kafka.bootstrap_servers, topic, expected=16 * 250)
    assert verdict((str(i) for i in range(16 * 250)), found) == (0, 0, 0)
    ids = transactional_ids(kafka.bootstrap_servers, prefix) - {f"{prefix}preflight"}  # the driver's one probe
    groups = consumer_groups(kafka.bootstrap_servers, prefix)
    assert 1 <= len(ids) <= 4 and 1 <= len(groups) <= 4, (sorted(ids), sorted(groups))


def test_the_cli_lists_and_aborts_a_transaction_a_dead_job_left_open(kafka, new_topic):
    """A producer dies inside its transaction: read_committed readers of its partition are held back until the
    brokers' timeout. ``recoverable-kafka-wal transactions`` lists it as Ongoing and ``--abort`` releases them."""
    import subprocess
    import sys

    from testing.kafka_check import read_topic

    topic, prefix = new_topic(1), f"linger-{new_topic(1)}-"
    dead = (f"import os; from confluent_kafka import Producer; p = Producer({{'bootstrap.servers': "
            f"'{kafka.bootstrap_servers}', 'transactional.id': '{prefix}0', 'transaction.timeout.ms': 600000}}); "
            f"p.init_transactions(30); p.begin_transaction(); p.produce('{topic}', b'never committed'); "
            "p.flush(30); os._exit(0)")
    subprocess.run([sys.executable, "-c", dead], check=True, timeout=120)
    from confluent_kafka import Producer

    later = Producer({"bootstrap.servers": kafka.bootstrap_servers})
    later.produce(topic, b"committed later")
    assert later.flush(30) == 0
    assert read_topic(kafka.bootstrap_servers, topic, 5) == []  # held back behind the open transaction

    def cli(*extra):
        out = subprocess.run([sys.executable, "-m", "recoverable_sink.ops.cli", "transactions", "--prefix", prefix,
                              "--bootstrap-servers", kafka.bootstrap_servers, "--json", *extra],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    listed = cli()["transactions"]
    assert [(t["transactional_id"], t["state"]) for t in listed] == [(f"{prefix}0", "Ongoing")]
    assert 0 <= listed[0]["age_s"] < 300  # the record's start time, read past its partition list
    assert cli("--abort", "--older-than", "600")["aborted"] == []  # younger than that: left alone
    assert cli("--abort", "--older-than", "0")["aborted"] == [f"{prefix}0"]
    assert [r["value"] for r in read_topic(kafka.bootstrap_servers, topic, 30, expected=1)] == [b"committed later"]
    assert [t["state"] for t in cli()["transactions"]] in (["Empty"], ["CompleteAbort"])  # no longer open


def test_a_query_partition_whose_batches_went_to_two_topics_finds_its_own_batch_marker(kafka, new_topic, tmp_path):
    """A query's micro-batches share a partition's marker group, which then holds a marker per topic: a re-run of
    batch 2 (rows naming topic B) must find batch 2's marker, not batch 1's (topic A, listed first)."""
    from recoverable_sink.producer.marker import Marker
    from recoverable_sink.producer.transactions import PartitionTransaction

    first, second = sorted([new_topic(1), new_topic(1)])
    options = task_options({"kafka.bootstrap.servers": kafka.bootstrap_servers, **EO,
                             "transactional.id.prefix": "shared-", "wal.path": str(tmp_path / "wal")})
    for batch, topic in ((1, first), (2, second)):
        txn = PartitionTransaction(options, f"q-b{batch}", 0, "partition 0", scope="q")
        assert txn.open(None) is None
        txn.commit(Marker(write_id=f"q-b{batch}", partition=0, topic=topic, records=10,
                          attempts=(f"attempt-{batch}",)), 30)
        txn.close()
    rerun = PartitionTransaction(options, "q-b2", 0, "partition 0", scope="q")
    assert rerun.open(None) is not None  # committed: nothing to send again
    rerun.close()
    assert rerun.marker is not None
    assert (rerun.marker.write_id, rerun.marker.topic) == ("q-b2", second)
    later = PartitionTransaction(options, "q-b3", 0, "partition 0", scope="q")
    assert later.open(None) is None  # batch 3 is not committed by either marker
    later.abort()
