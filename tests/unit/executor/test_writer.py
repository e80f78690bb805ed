"""The delivery-identity rules, without Spark or Kafka: a retry skips a recomputed record only if an earlier
attempt got the same record, for the same destination, acknowledged, counted as a multiset."""

from __future__ import annotations

import logging
import random

import pyarrow as pa
import pytest

from recoverable_sink.columns import SchemaPlan
from recoverable_sink.contract import TaskIdentity
from recoverable_sink.errors import DeliveryError, FatalProducerError, WalFullError
from recoverable_sink.executor import partition_writer as writer_module
from recoverable_sink.executor.task import open_writer
from recoverable_sink.identity import record_digests
from recoverable_sink.ops.replay import NotFullyLogged, replay_partition
from recoverable_sink.options import parse_options
from recoverable_sink.wal import DONE, LOGGED, OPEN, open_wal
from tests.unit.fakes import FakeProducer, sink_producer

PLAN = SchemaPlan(columns=("key", "value"), topic_option="t")
# A short delivery timeout: the fake never acknowledges what its budget excludes, and the sink waits that long.
# proof.kafka=false: these tests script the producer, not a broker with a proof topic (test_writer_model does).
KAFKA = {"kafka.bootstrap.servers": "127.0.0.1:1", "kafka.delivery.timeout.ms": "200", "proof.kafka": "false"}


def options(wal_dir: str, **extra: str):
    return parse_options({**KAFKA, "topic": "t", "wal.path": wal_dir, **extra})


def batches(values: list[bytes], size: int = 100) -> list[pa.RecordBatch]:
    return [pa.RecordBatch.from_pydict({"key": [v[-1:] for v in values[i:i + size]], "value": values[i:i + size]})
            for i in range(0, len(values), size)]


def rows(n: int) -> list[bytes]:
    return [b"r%05d" % i for i in range(n)]


def crash_after(opts, data: list[bytes], acked: int | None = None, attempt: int = 0, plan: SchemaPlan = PLAN,
                write_id: str = "w") -> None:
    """An attempt that logs and produces ``data[:acked]``, drains (the producer acknowledges all of it),
    then logs and produces the rest, which the producer never acknowledges, and dies (no commit, no abort:
    as after SIGKILL)."""
    acked = len(data) if acked is None else acked
    producer = FakeProducer()
    writer = open_writer(opts, plan, TaskIdentity(write_id, 0, attempt), "c1", producer=sink_producer(producer))

    for b in batches(data[:acked]):
        writer.write(b)
    writer.flush(wait_s=1.0)
    producer.ack_budget = 0
    for b in batches(data[acked:]):
        writer.write(b)
    writer.flush(wait_s=0.01)


def finish(opts, producer: FakeProducer, data: list[bytes], attempt: int, plan: SchemaPlan = PLAN,
           write_id: str = "w", cluster: str = "c1"):
    writer = open_writer(opts, plan, TaskIdentity(write_id, 0, attempt), cluster, producer=sink_producer(producer))
    for b in batches(data):
        writer.write(b)
    return writer.commit()


def test_first_attempt_leaves_only_digests_as_proof_of_delivery(wal_dir):
    opts, producer = options(wal_dir), FakeProducer()
    message = finish(opts, producer, rows(1000), attempt=0)
    assert (message.received, message.published, message.acknowledged, message.skipped) == (1000, 1000, 1000, 0)
    wal = open_wal(wal_dir)
    [attempt] = wal.attempts("w/")
    assert attempt.state == DONE
    assert wal.used_bytes() == 0 and wal.stats().payload_bytes == 0
    segments = list(wal.segments(attempt.key))
    assert sum(s.count for s in segments) == 1000 and all(s.batch is None for s in segments)


def test_retry_reading_its_input_in_another_order_sends_only_what_was_never_acknowledged(wal_dir):
    opts, data = options(wal_dir), rows(1000)
    crash_after(opts, data, acked=430)
    shuffled = data[:]
    random.Random(7).shuffle(shuffled)
    retry = FakeProducer()
    message = finish(opts, retry, shuffled, attempt=1)
    assert message.skipped == 430 and message.published == 570
    assert message.replayed == 570  # logged by attempt 0, never acknowledged
    assert sorted(retry.values()) == sorted(data[430:])


def test_drains_in_mid_partition_queue_their_saves_behind_the_stores_and_a_retry_skips_what_they_saved(
        wal_dir, monkeypatch):
    """Every batch handed over drains, and the drain only queues its save on the WAL thread: once that thread
    has done what was queued (a kill lands after it), the retry skips exactly what Kafka acknowledged."""
    monkeypatch.setattr(writer_module, "CHECKPOINT_EVERY_S", 1e-6)
    opts, data = options(wal_dir), rows(1000)
    writer = open_writer(opts, PLAN, TaskIdentity("w", 0, 0), "c1", producer=sink_producer(FakeProducer()))
    for b in batches(data):
        writer.write(b)
    writer.log.wait()  # what the drains queued is done; then the kill
    retry = FakeProducer()
    message = finish(opts, retry, data[::-1], attempt=1)
    assert (message.skipped, message.published) == (900, 100)
    assert sorted(retry.values()) == sorted(data[900:])


def test_equal_records_count_as_a_multiset(wal_dir):
    opts = options(wal_dir)
    data = [b"same"] * 300 + rows(200)
    crash_after(opts, data, acked=250)  # 250 of the 300 copies acknowledged
    retry = FakeProducer()
    message = finish(opts, retry, data[::-1], attempt=1)
    assert message.skipped == 250
    assert retry.values().count(b"same") == 50
    assert sorted(v for v in retry.values() if v != b"same") == rows(200)


def test_another_topic_or_cluster_never_matches(wal_dir):
    opts = options(wal_dir)
    crash_after(opts, rows(300))
    other_topic = SchemaPlan(columns=("key", "value"), topic_option="b")
    to_b = FakeProducer()
    assert finish(options(wal_dir, topic="b"), to_b, rows(300), attempt=1, plan=other_topic).skipped == 0
    assert len(to_b.delivered) == 300
    elsewhere = FakeProducer()
    assert finish(opts, elsewhere, rows(300), attempt=0, write_id="w2", cluster="c2").skipped == 0


def test_rerun_of_a_finished_write_sends_nothing(wal_dir):
    opts = options(wal_dir)
    finish(opts, FakeProducer(), rows(500), attempt=0)
    again = FakeProducer()
    message = finish(opts, again, rows(500)[::-1], attempt=0)
    assert (message.skipped, message.published, again.delivered) == (500, 0, [])


def test_a_fatal_producer_error_fails_the_task_naming_it_and_a_retry_skips_what_was_drained_before_it(wal_dir):
    """Acknowledgements are learnt at drains (a checkpoint, or any send after which the queue is found empty): the
    500 records drained before the fatal error are skipped by the retry, which sends the other 500 once."""
    opts = options(wal_dir)
    first = FakeProducer(fatal_after=500)
    writer = open_writer(opts, PLAN, TaskIdentity("w", 0, 0), "c1", producer=sink_producer(first))
    fatal = r"partition 0 \(attempt 0\) of write w: fatal producer error: _FENCED"
    with pytest.raises(FatalProducerError, match=fatal):
        for i, b in enumerate(batches(rows(1000))):
            if i == 3:  # batches 0-2 handed over, drained at a checkpoint
                writer.flush(wait_s=1.0)
            writer.write(b)
        writer.commit()
    writer.abort()
    second = FakeProducer()
    finish(opts, second, rows(1000), attempt=1)
    assert (len(first.delivered), len(second.delivered)) == (500, 500)
    assert set(first.values() + second.values()) == set(rows(1000))


def test_records_delivered_earlier_but_not_recomputed_are_reported_as_diverged(wal_dir):
    opts = options(wal_dir)
    crash_after(opts, rows(200), acked=100)
    message = finish(opts, FakeProducer(), rows(200)[50:] + [b"new"], attempt=1)
    assert message.diverged == 50


def test_wal_refusal_lets_no_later_batch_into_the_log(wal_dir):
    # Each 100-record batch is ~1.5 KB of Arrow IPC: the bound admits the first and refuses the second.
    opts = options(wal_dir, **{"wal.maxBytes": "2500"})
    writer = open_writer(opts, PLAN, TaskIdentity("w", 0, 0), "c1", producer=sink_producer(FakeProducer(ack_budget=0)))
    with pytest.raises(WalFullError, match="wal.maxBytes=2500"):
        for b in batches(rows(500)):
            writer.write(b)
        writer.commit()
    writer.abort()
    wal = open_wal(wal_dir)
    [attempt] = wal.attempts("w/")
    firsts = [s.first for s in wal.segments(attempt.key)]
    assert firsts == [0]  # batch 0 only: no batch after the refused one
    assert attempt.state == OPEN


def test_acknowledgements_carried_by_a_refused_batch_are_saved_by_the_abort_and_a_retry_skips_them(
        wal_dir, monkeypatch):
    """A batch's store also carries the bitmaps acknowledged since the last save. When the WAL refuses that
    batch (wal.maxBytes), the abort must still save them: the ledger forgets a fully acknowledged segment
    once its bitmap is taken, so otherwise a retry sends those 100 records a second time."""
    monkeypatch.setattr(writer_module, "CHECKPOINT_EVERY_S", 3600.0)  # no drain of its own: the test serves them
    opts = options(wal_dir, **{"wal.maxBytes": "4000"})
    data = rows(400)
    producer = FakeProducer()
    writer = open_writer(opts, PLAN, TaskIdentity("w", 0, 0), "c1", producer=sink_producer(producer))
    writer.write(batches(data[:100])[0])
    writer.write(batches(data[100:200])[0])  # hands the first batch to the producer
    writer.ledger.serve()  # its 100 records acknowledged, not saved yet
    with pytest.raises(WalFullError, match="wal.maxBytes=4000"):
        writer.write(batches(data[200:], size=200)[0])  # refused, with the bitmap it carried
        writer.commit()
    writer.abort()
    second = FakeProducer()
    finish(options(wal_dir), second, data, attempt=1)  # the retry with room for all of it
    assert second.values() == data[200:]


def test_a_failed_acknowledgement_save_fails_the_task_and_its_abort_saves_those_bitmaps_again(
        wal_dir, monkeypatch, caplog):
    monkeypatch.setattr(writer_module, "CHECKPOINT_EVERY_S", 3600.0)
    opts = options(wal_dir)
    data = rows(300)
    writer = open_writer(opts, PLAN, TaskIdentity("w", 0, 0), "c1", producer=sink_producer(FakeProducer()))
    for b in batches(data):
        writer.write(b)
    real, calls = writer.log.wal.save_acks, []

    def fails_once(key: str, acks: dict[int, bytearray]) -> None:
        calls.append(key)
        if len(calls) == 1:
            raise OSError(28, "No space left on device")
        real(key, acks)

    monkeypatch.setattr(writer.log.wal, "save_acks", fails_once)
    writer.flush(wait_s=1.0, sync=False)  # all 300 acknowledged; their save fails on the WAL's thread
    with pytest.raises(OSError, match="No space left"):
        writer.commit()
    with caplog.at_level(logging.WARNING, logger="recoverable_sink.writer"):
        writer.abort()
    assert len(calls) == 2 and not caplog.records  # saved again, and no warning about a save that worked
    second = FakeProducer()
    finish(opts, second, data, attempt=1)
    assert second.values() == []


class StillClock:
    """The writer's clock, stopped: only the record count triggers drains, and sleeps pass no time."""

    def monotonic(self) -> float:
        return 0.0

    def sleep(self, seconds: float) -> None:
        pass


def test_replay_sends_what_no_attempt_got_acknowledged_then_a_rerun_sends_nothing(wal_dir):
    opts = options(wal_dir)
    # Time stands still: a drain in mid-partition (every 0.05 s on a slow machine) would expire the rest early.
    writer = open_writer(opts, PLAN, TaskIdentity("w", 0, 0), "c1",
                         producer=sink_producer(FakeProducer(ack_budget=321, expire=True)), clock=StillClock())
    for b in batches(rows(1000)):
        writer.write(b)
    with pytest.raises(DeliveryError, match="did not acknowledge 679 of 1000"):
        writer.commit()
    wal = open_wal(wal_dir)
    [attempt] = wal.attempts("w/")
    assert attempt.state == LOGGED
    producer = FakeProducer()
    counts = replay_partition(wal, wal.attempts("w/"), KAFKA, producer=sink_producer(producer))
    assert (counts.records, counts.sent, counts.already_delivered) == (1000, 679, 321)
    assert sorted(producer.values()) == rows(1000)[321:]
    rerun = FakeProducer()
    assert finish(opts, rerun, rows(1000), attempt=0).published == 0


def test_replay_refuses_a_partition_never_fully_logged(wal_dir):
    opts = options(wal_dir)
    crash_after(opts, rows(300), acked=10)
    wal = open_wal(wal_dir)
    with pytest.raises(NotFullyLogged, match="wal.writeId"):
        replay_partition(wal, wal.attempts("w/"), KAFKA, producer=sink_producer(FakeProducer()))


def test_replay_refuses_an_exactly_once_write_whose_acks_may_belong_to_an_aborted_transaction(wal_dir):
    wal = open_wal(wal_dir)
    key = wal.begin_attempt("w", 0, 0, {"guarantee": "exactly_once"})
    wal.set_state(key, LOGGED, {})
    with pytest.raises(NotFullyLogged, match="exactly_once.*wal.writeId"):
        replay_partition(wal, wal.attempts("w/"), KAFKA, producer=sink_producer(FakeProducer()))


@pytest.mark.parametrize("column", ["partition", "timestamp", "headers"])
def test_digest_covers_every_part_of_a_record(column):
    values = {"partition": pa.array([1, 2], pa.int32()), "timestamp": pa.array([5, 6], pa.int64()),
              "headers": pa.array([[{"key": "h", "value": b"1"}], [{"key": "h", "value": b"2"}]])}
    b = pa.RecordBatch.from_pydict({"key": [b"k", b"k"], "value": [b"v", b"v"], column: values[column]})
    digests = record_digests(b, "t", "c")
    assert digests[:16] != digests[16:]


def test_a_client_call_that_fails_without_an_error_is_a_fatal_producer_error():
    """A fenced transactional producer's flush can fail with a bare SystemError: the task must fail as on
    any fatal producer error (its acknowledgements are kept, the producer dropped), not on an odd type."""
    from recoverable_sink.producer.failures import fatal_errors

    with pytest.raises(FatalProducerError, match="fatal producer error: the client failed without naming it"):
        with fatal_errors():
            raise SystemError("<method 'flush' of 'cimpl.Producer' objects> returned NULL without setting an "
                              "exception")


def test_a_batch_over_the_segment_size_is_logged_and_sent_in_order_in_segments_of_its_digests(wal_dir):
    opts, producer = options(wal_dir), FakeProducer()
    writer = open_writer(opts, PLAN, TaskIdentity("w", 0, 0), "c1", producer=sink_producer(producer))
    big = [b"%06d" % i + b"x" * 4000 for i in range(5000)]  # about 20 MB: three segments of 8 MiB at most
    uneven = [b"%06d" % i + b"y" * (40 if i % 2 else 20_000) for i in range(1600)]  # 16 MB
    batch = pa.RecordBatch.from_pydict({"key": [v[:6] for v in big], "value": big})
    writer.write(batch)
    # A slice of 6 MB is cut by its own size, not its parent's buffers.
    writer.write(pa.RecordBatch.from_pydict({"key": [v[:6] for v in uneven], "value": uneven}).slice(100, 600))
    message = writer.commit()
    wal = open_wal(wal_dir)
    [attempt] = wal.attempts("w/")
    logged = list(wal.segments(attempt.key))  # payloads dropped once acknowledged; counts and digests stay
    assert message.published == message.acknowledged == 5600
    assert producer.values() == big + uneven[100:700]  # in order, nothing lost or repeated
    counts = [s.count for s in logged]
    assert len(counts) == 4 and sum(counts[:3]) == 5000 and counts[3] == 600
    # Each segment's digests are its own records': what a retry skips by.
    first = 0
    for segment in logged[:3]:
        piece = batch.slice(first, segment.count)
        assert piece.nbytes <= writer_module.SEGMENT_MAX_BYTES
        assert segment.digests == record_digests(piece, "t", "c1")
        first += segment.count


def test_a_record_kafka_gave_up_on_fails_the_attempt_at_its_next_batch_not_after_its_whole_partition(
        wal_dir, monkeypatch):
    """Issue 63: with the brokers gone, every drain waited out the delivery timeout again for the records handed over
    since, and an attempt took minutes to fail; it stops at the first batch after a drain found a record failed for
    good."""
    monkeypatch.setattr(writer_module, "CHECKPOINT_EVERY_S", 1e-6)  # a drain after every batch handed over
    producer = FakeProducer(ack_budget=150, expire=True)
    writer = open_writer(options(wal_dir), PLAN, TaskIdentity("w", 0, 0), "c1", producer=sink_producer(producer))
    with pytest.raises(DeliveryError, match="did not acknowledge 50 of 200 records"):
        for b in batches(rows(1000)):
            writer.write(b)
    writer.abort()
    assert len(producer.delivered) == 150 and not producer.queue  # nothing handed over after the failed drain
