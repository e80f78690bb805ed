"""The exactly_once commit marker as offset metadata: what one release writes, the next reads back whole, and what an
older release wrote (or anything unreadable) reads as unknown, never as a wrong value."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from recoverable_sink.contract import stream_write_id
from recoverable_sink.identity import Fingerprint, record_digests
from recoverable_sink.producer.marker import MARKER_VERSION, Marker


def fingerprint() -> Fingerprint:
    f = Fingerprint()
    f.add(record_digests(pa.RecordBatch.from_pydict({"key": [b"k1", b"k2"], "value": [b"v1", b"v2"]}), "t", "c"))
    return f


def test_a_marker_reads_back_as_it_was_written():
    marker = Marker(write_id="w", topic="t", records=20, attempts=("a1", "a2"), run="r1", fingerprint=fingerprint(),
                    partition=3, wal="/data/wal")
    text = marker.encode()
    back = Marker.parse(text)
    assert json.loads(text)["version"] == MARKER_VERSION
    assert (back.write_id, back.topic, back.records, back.attempts, back.run, back.partition, back.wal) == \
        ("w", "t", 20, ("a1", "a2"), "r1", 3, "/data/wal")
    assert back.fingerprint is not None and back.fingerprint.encode() == marker.fingerprint.encode()
    assert back.host and isinstance(back.committed_at, float)  # stamped by the writer, for the operator


def test_a_marker_of_an_earlier_release_reads_what_it_has_and_the_rest_as_unknown():
    old = Marker.parse(json.dumps({"write_id": "w", "records": 5}))  # no version, attempts, run or fingerprint
    assert (old.write_id, old.records, old.attempts, old.run, old.fingerprint, old.partition, old.topic) == \
        ("w", 5, None, None, None, None, None)


@pytest.mark.parametrize("metadata", [None, "", "not json", "[1, 2]", '"text"'])
def test_unreadable_metadata_gives_a_marker_that_names_nothing(metadata):
    m = Marker.parse(metadata)
    assert (m.write_id, m.records, m.attempts, m.fingerprint) == (None, 0, None, None)


def test_fields_of_the_wrong_type_read_as_unknown_not_as_a_wrong_value():
    m = Marker.parse(json.dumps({"write_id": 7, "topic": ["t"], "records": "20", "attempts": "a1", "run": None,
                                 "partition": "3", "fingerprint": 12, "committed_at": "yesterday"}))
    assert (m.write_id, m.topic, m.records, m.attempts, m.run, m.partition, m.fingerprint, m.committed_at) == \
        (None, None, 0, None, None, None, None, None)


def test_a_streams_marker_names_its_micro_batch_and_a_batch_writes_none():
    assert Marker(write_id=stream_write_id("q1", 42), topic="t", records=1, attempts=()).batch == 42
    assert Marker(write_id="w-b12", topic="t", records=1, attempts=()).batch is None
    assert Marker(write_id=None, topic="t", records=0, attempts=None).batch is None
