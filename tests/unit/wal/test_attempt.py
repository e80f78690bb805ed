"""The attempt record (wal/attempt.py): its fields through the WAL, its versions, and the rules read from it."""

from __future__ import annotations

import json
import time
from dataclasses import replace

import pytest

from recoverable_sink.errors import WalCorruptionError, WalError
from recoverable_sink.ops.cli import main
from recoverable_sink.wal import DONE, LOGGED, OPEN, AttemptInfo, AttemptState, Owner, decode_attempt, open_wal

LIVE = Owner.this_process()
GONE = replace(LIVE, started="0")  # this host and boot, but no process with that pid started then
ELSEWHERE = replace(LIVE, host="another-host")  # not knowable from here
OLDER_RUN, NEWER_RUN = "00000000000000000001-aaaaaaaa", "00000000000000000002-bbbbbbbb"


def raw(wal, key: str) -> dict:
    with wal.env.begin() as txn:
        return json.loads(txn.get(f"m/{key}".encode()))


def put_raw(wal, key: str, meta: dict) -> None:
    with wal.env.begin(write=True) as txn:
        txn.put(f"m/{key}".encode(), json.dumps(meta).encode())


def record(key: str, run: str | None = None, task_attempt_id: int | None = None, owner: Owner | None = LIVE,
           **fields: object) -> AttemptInfo:
    return AttemptInfo(key=key, write_id="w", partition=0, attempt=0, host="h", created=100.0, owner=owner, run=run,
                       task_attempt_id=task_attempt_id, **fields)


def test_a_record_goes_through_the_wal_typed_and_versioned(wal_dir):
    wal = open_wal(wal_dir)
    key = wal.begin_attempt("w", 2, 1, {"stage": 4, "task_attempt_id": 9, "run": NEWER_RUN, "generated": True,
                                         "kind": "batch", "topic": "t", "cluster_id": "c1",
                                         "guarantee": "at_least_once", "newer_field": {"kept": [1, 2]}})
    [a] = wal.attempts("w/")
    assert (a.key, a.write_id, a.partition, a.attempt, a.state) == (key, "w", 2, 1, OPEN)
    assert (a.stage, a.task_attempt_id, a.run, a.generated) == (4, 9, NEWER_RUN, True)
    assert (a.kind, a.topic, a.cluster_id, a.guarantee, a.exactly_once) == ("batch", "t", "c1", "at_least_once", False)
    assert (a.owner, a.ended, a.done_at, a.query_id, a.batch_id) == (LIVE, None, None, None, None)
    assert a.extra == {"newer_field": {"kept": [1, 2]}}
    assert raw(wal, key)["v"] == 1 and "ended" not in raw(wal, key)  # a field at its default is not written

    wal.set_state(key, LOGGED)
    assert wal.attempts("w/")[0].state is AttemptState.LOGGED
    wal.end_attempt(key)
    before = time.time()
    wal.set_state(key, DONE)
    [done] = wal.attempts("w/")
    assert done.state is DONE and done.ended is not None and done.done_at is not None and done.done_at >= before
    assert done.extra == {"newer_field": {"kept": [1, 2]}} and raw(wal, key)["newer_field"] == {"kept": [1, 2]}
    wal.set_state(key, DONE)
    assert wal.attempts("w/")[0].done_at == done.done_at  # marked done once: the first time stays
    assert not done.trimmed and "trimmed" not in raw(wal, key)
    wal.trim_proof([key])
    [trimmed] = wal.attempts("w/")
    assert trimmed.trimmed and raw(wal, key)["trimmed"] is True
    assert replace(trimmed, trimmed=False) == done  # nothing else of the record changes


def test_a_record_of_the_version_before_without_v_decodes_and_is_written_back_as_v1(wal_dir):
    wal = open_wal(wal_dir)
    key = "q-b000000000003/000001/00000000000000000001-000-abcdef01"
    put_raw(wal, key, {"query_id": "q", "batch_id": 3, "task_attempt_id": 12, "run": OLDER_RUN, "kind": "stream",
                       "topic": None, "cluster_id": "c1", "guarantee": "exactly_once", "write_id": "q-b000000000003",
                       "partition": 1, "attempt": 0, "host": "h", "created": 5, "state": "logged",
                       "owner": {"host": "h", "boot": "b", "pid": 42, "started": "77"}, "ended": 6.5})
    [a] = wal.attempts()
    assert (a.state, a.created, a.ended, a.topic, a.exactly_once) == (LOGGED, 5.0, 6.5, None, True)
    assert a.owner == Owner(host="h", boot="b", pid=42, started="77")
    assert (a.micro_batch_of("q"), a.micro_batch_of("other"), a.extra) == (3, None, {})
    wal.set_state(key, DONE)
    stored = raw(wal, key)
    assert (stored["v"], stored["state"], stored["ended"], stored["batch_id"]) == (1, "done", 6.5, 3)


def test_a_record_of_a_newer_version_is_refused_naming_it_and_can_still_be_purged(wal_dir, caplog):
    wal = open_wal(wal_dir)
    key = "w9/000000/00000000000000000001-000-abcdef01"
    put_raw(wal, key, {"v": 2, "write_id": "w9", "partition": 0, "attempt": 0, "host": "h", "created": 1.0,
                       "state": "something new"})
    with pytest.raises(WalError, match="version 2") as err:
        wal.attempts()
    assert wal_dir in str(err.value) and key in str(err.value)
    assert "Upgrade recoverable-sink" in str(err.value) and "recoverable-kafka-wal purge" in str(err.value)
    assert not isinstance(err.value, WalCorruptionError)
    assert main(["purge", "--path", wal_dir, "--write-id", "w9"]) == 0
    assert wal.attempts() == []


@pytest.mark.parametrize("value", [b"not json", b"[1]", b'{"v": "1", "write_id": "w"}',
                                   b'{"write_id": "w", "partition": "0", "attempt": 0, "host": "h", "created": 1}',
                                   b'{"write_id": "w", "partition": 0, "attempt": 0, "host": "h", "created": 1, '
                                   b'"owner": "me"}'])
def test_a_record_that_does_not_decode_is_corruption_named_by_its_key(value):
    with pytest.raises(WalCorruptionError, match="metadata entry m/w/000000/k is not valid"):
        decode_attempt("/wal", "w/000000/k", value)


@pytest.mark.parametrize(("changes", "sending"), [
    ({}, True), ({"state": LOGGED}, True), ({"state": DONE}, False), ({"ended": 1.0}, False),
    ({"owner": GONE}, False), ({"owner": ELSEWHERE}, False), ({"owner": None}, False),
])
def test_still_sending_is_an_unfinished_attempt_whose_process_runs_here(changes, sending):
    assert replace(record("w/0/1"), **changes).still_sending() is sending


@pytest.mark.parametrize(("changes", "running"), [
    ({}, True), ({"owner": ELSEWHERE}, True), ({"owner": GONE}, False), ({"owner": None}, False),
    ({"state": DONE}, False), ({"ended": 1.0, "owner": ELSEWHERE}, False),
])
def test_the_sweep_keeps_an_unfinished_attempt_while_its_process_may_still_run(changes, running):
    assert replace(record("w/0/1"), **changes).may_be_running() is running
