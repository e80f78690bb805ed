"""Dead letters (errors.tolerance=all) through the writer, on the WAL and a stand-in producer: which records leave
for the dead-letter topic, with what, and that a retry in another order neither repeats nor loses one. A real
broker's view (read_committed, both modes, a worker killed) is in tests/integration/test_dead_letters.py."""

from __future__ import annotations

import random
from dataclasses import replace

import pyarrow as pa
import pytest

from recoverable_sink.columns import SchemaPlan
from recoverable_sink.contract import TaskIdentity
from recoverable_sink.errors import OptionError, RecordError
from recoverable_sink.executor import dead_letters as dl
from recoverable_sink.executor.task import open_writer
from recoverable_sink.options import DeadLetterTopic, FailOnRefusal, parse_options
from tests.unit.fakes import FakeProducer, sink_producer

PLAN = SchemaPlan(columns=("key", "value", "partition"), topic_option="t")
# proof.kafka=false: these tests script the producer, not a broker with a proof topic (test_writer_model does).
KAFKA = {"kafka.bootstrap.servers": "127.0.0.1:1", "kafka.delivery.timeout.ms": "200", "proof.kafka": "false"}
BIG = b"x" * 3000  # over topic t's limit below, under the producer's and the dead-letter topic's


def _options(wal_dir, **extra: str):
    opts = parse_options({**KAFKA, "topic": "t", "wal.path": str(wal_dir), "kafka.message.max.bytes": "10000",
                          "errors.tolerance": "all", "errors.deadletterqueue.topic.name": "dlq", **extra})
    return replace(opts, topic_max_message_bytes=2000)


def _input() -> list[dict]:
    """40 records: every tenth too large for topic t, every seventh to a partition t (4 partitions) lacks."""
    return [{"key": b"k%02d" % i, "value": BIG if i % 10 == 3 else b"v%02d" % i,
             "partition": 9 if i % 7 == 5 else None} for i in range(40)]


def _batches(records: list[dict], size: int = 8) -> list[pa.RecordBatch]:
    return [pa.RecordBatch.from_pylist(records[i:i + size],
                                       schema=pa.schema([("key", pa.binary()), ("value", pa.binary()),
                                                         ("partition", pa.int32())]))
            for i in range(0, len(records), size)]


def _write(opts, producer: FakeProducer, records: list[dict], attempt: int = 0, commit: bool = True):
    writer = open_writer(opts, PLAN, TaskIdentity("w", 0, attempt), "c1", producer=sink_producer(producer))
    for b in _batches(records):
        writer.write(b)
    return writer.commit() if commit else writer


def test_refused_records_go_to_the_dead_letter_topic_as_they_were_with_connects_headers(wal_dir):
    producer = FakeProducer()
    message = _write(_options(wal_dir), producer, _input())
    good = [s for s in producer.delivered if s.topic == "t"]
    dead = [s for s in producer.delivered if s.topic == "dlq"]
    # 3, 13, 23 and 33 too large; 5, 12, 19, 26 and 33 to partition 9: record 33 is counted by its first refusal.
    assert (len(good), len(dead)) == (32, 8)
    assert message.dead_lettered == {"RecordTooLarge": 4, "PartitionOutOfRange": 4}
    too_large = next(s for s in dead if s.key == b"k03")
    assert too_large.value == BIG and too_large.partition == -1  # the partitioner picks
    headers = dict(too_large.headers)
    assert headers[dl.H_TOPIC] == b"t" and headers[dl.H_EXCEPTION] == b"RecordTooLarge"
    assert headers[dl.H_STAGE] == b"KAFKA_PRODUCE" and headers[dl.H_WRITE] == b"w"
    assert b"max.message.bytes=2000" in headers[dl.H_MESSAGE]
    # It named no partition, so there is none to report (Kafka Connect too sets .partition only where it knows one).
    assert dl.H_PARTITION not in headers
    out_of_range = dict(next(s for s in dead if s.key == b"k05").headers)
    assert out_of_range[dl.H_PARTITION] == b"9" and out_of_range[dl.H_EXCEPTION] == b"PartitionOutOfRange"
    assert message.dead_letter_topic == "dlq"


def test_a_retry_in_another_order_sends_no_dead_letter_twice_and_misses_none(wal_dir):
    """The first attempt dies after its first 24 records were acknowledged; the retry reads the input shuffled
    and its task attempt is another (a header of every dead letter): what was delivered is still recognised."""
    opts, records = _options(wal_dir), _input()
    first = FakeProducer()
    writer = _write(opts, first, records[:24], commit=False)
    writer.flush(wait_s=1.0)  # acknowledged and saved, then the worker dies
    retry = FakeProducer()
    shuffled = list(records)
    random.Random(5).shuffle(shuffled)
    _write(opts, retry, shuffled, attempt=1)
    both = first.delivered + retry.delivered
    keys = sorted((s.topic, s.key) for s in both)
    assert len(keys) == len(set(keys)) == 40
    assert {h for s in retry.delivered if s.topic == "dlq" for k, h in s.headers if k == dl.H_ATTEMPT} <= {b"1"}


def test_a_dead_letter_the_dead_letter_topic_would_refuse_fails_the_task_naming_both(wal_dir):
    opts = replace(_options(wal_dir), errors=DeadLetterTopic("dlq", 2500))
    with pytest.raises(RecordError, match=r"record 3: Kafka would refuse it \(RecordTooLarge\), and the dead-letter "
                                          r"topic dlq would refuse it too"):
        _write(opts, FakeProducer(), _input()[:8])


def test_without_the_option_the_first_refused_record_fails_the_task_as_before(wal_dir):
    opts = replace(_options(wal_dir), errors=FailOnRefusal())
    with pytest.raises(RecordError, match=r"record 3: key\+value with the record framing is 3039 bytes"):
        _write(opts, FakeProducer(), _input())


@pytest.mark.parametrize(("given", "refused"), [
    ({"errors.tolerance": "all"}, "needs errors.deadletterqueue.topic.name"),
    ({"errors.deadletterqueue.topic.name": "dlq"}, "errors.tolerance is none"),
    ({"errors.tolerance": "some"}, "must be none"),
    ({"errors.tolerance": "all", "errors.deadletterqueue.topic.name": "t"}, "is the topic the records go to"),
])
def test_dead_letter_options_that_cannot_work_are_refused_naming_the_option(given, refused):
    with pytest.raises(OptionError, match=refused):
        parse_options({**KAFKA, "topic": "t", **given})


def test_the_inputs_fingerprint_counts_a_dead_letter_as_the_record_it_was(wal_dir):
    """An exactly_once partition skipped as committed compares its input's fingerprint with its marker's, taken
    from the write that routed the dead letters: both must count every record as it came in."""
    from recoverable_sink.executor.normalise import normalise
    from recoverable_sink.identity import Fingerprint, record_digests

    writer = _write(_options(wal_dir), FakeProducer(), _input(), commit=False)
    writer.commit()
    expected = Fingerprint()
    for b in _batches(_input()):
        expected.add(record_digests(normalise(b, PLAN), "t", "c1"))
    assert writer.fingerprint == expected
