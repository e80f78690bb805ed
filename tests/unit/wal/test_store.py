"""The LMDB write-ahead log on its own: layout, bound, permissions, purge, proof of delivery, corruption."""

import logging
import os
import shutil
import stat
import struct
import subprocess
import sys
import time
import tracemalloc
import zlib

import pyarrow as pa
import pytest

from recoverable_sink.errors import WalCorruptionError, WalError, WalFullError
from recoverable_sink.identity import record_digests
from recoverable_sink.wal import DONE, close_wals, open_wal, sweep
from recoverable_sink.wal import env as wal_env
from recoverable_sink.wal import format as wal_format
from recoverable_sink.wal.format import encode_segment, segment_value


def later() -> float:
    """Past the quiet time after which a finished write's proof may be trimmed."""
    return time.time() + 3600


def batch(values, keys=None):
    arrays, names = [pa.array(values, pa.binary())], ["value"]
    if keys is not None:
        arrays.insert(0, pa.array(keys, pa.binary()))
        names.insert(0, "key")
    return pa.RecordBatch.from_arrays(arrays, names=names)


def append(wal, key, first, b, max_bytes=1 << 20, acks=None):
    return wal.append(key, first, b, record_digests(b, "t", "c"), max_bytes, acks or {})


def reopen(path):
    close_wals()
    return open_wal(path)


def test_segments_round_trip_with_their_acknowledgements(wal_dir):
    wal = open_wal(wal_dir)
    key = wal.begin_attempt("w1", 3, 0, {"kind": "batch"})
    append(wal, key, 0, batch([b"a", b"b"]))
    append(wal, key, 2, batch([b"c"]), acks={0: bytearray(b"\x01\x00")})
    wal = reopen(wal_dir)
    segments = list(wal.segments(key))
    assert [(s.first, s.batch.column("value").to_pylist(), bytes(s.acked)) for s in segments] == [
        (0, [b"a", b"b"], b"\x01\x00"),
        (2, [b"c"], b"\x00"),
    ]
    [info] = wal.attempts("w1/")
    assert (info.write_id, info.partition, info.attempt, info.kind) == ("w1", 3, 0, "batch")


def test_purge_removes_everything_of_the_attempt_and_frees_its_bytes(wal_dir):
    wal = open_wal(wal_dir)
    key = wal.begin_attempt("w1", 0, 0, {})
    other = wal.begin_attempt("w2", 0, 0, {})
    append(wal, key, 0, batch([b"x" * 100]), 1 << 20)
    append(wal, other, 0, batch([b"y"]), 1 << 20)
    before = wal.used_bytes()
    freed = wal.purge([key])
    assert freed > 100 and wal.used_bytes() == before - freed == wal.stats().payload_bytes
    assert [a.write_id for a in wal.attempts()] == ["w2"]
    assert list(wal.segments(key)) == []


def test_max_bytes_refuses_the_batch_and_keeps_what_was_accepted(wal_dir):
    wal = open_wal(wal_dir)
    key = wal.begin_attempt("w1", 0, 0, {})
    size = append(wal, key, 0, batch([b"x" * 1000]), 4000)
    with pytest.raises(WalFullError, match=r"wal\.maxBytes=4000.*nothing was dropped"):
        append(wal, key, 1, batch([b"y" * 5000]), 4000)
    assert wal.used_bytes() == size
    assert [s.batch.num_rows for s in wal.segments(key)] == [1]


def test_directory_is_owner_only_and_files_are_0600(wal_dir):
    wal = open_wal(wal_dir)
    append(wal, wal.begin_attempt("w", 0, 0, {}), 0, batch([b"v"]))
    assert stat.S_IMODE(os.stat(wal_dir).st_mode) == 0o700
    for name in ("data.mdb", "lock.mdb"):
        assert stat.S_IMODE(os.stat(os.path.join(wal_dir, name)).st_mode) == 0o600


def test_an_existing_directory_keeps_its_mode_and_a_world_writable_one_is_refused(tmp_path):
    own = tmp_path / "own"
    own.mkdir(mode=0o750)
    os.chmod(own, 0o750)
    open_wal(str(own))
    assert stat.S_IMODE(os.stat(own).st_mode) == 0o750
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    with pytest.raises(WalError, match=r"writable by every user; point wal.path at a directory of its own"):
        open_wal(str(shared))
    assert stat.S_IMODE(os.stat(shared).st_mode) == 0o1777


def test_unusable_wal_path_is_a_clear_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(WalError, match=r"wal\.path=.*cannot be created"):
        open_wal(str(blocker / "wal"))


def test_flipped_byte_in_a_record_is_detected_with_its_location(wal_dir):
    wal = open_wal(wal_dir)
    key = wal.begin_attempt("w1", 0, 0, {})
    marker = b"PAYLOAD-" + b"z" * 64
    append(wal, key, 0, batch([b"ok"] * 10), 1 << 20)
    append(wal, key, 10, batch([marker] * 5), 1 << 20)
    close_wals()
    data = os.path.join(wal_dir, "data.mdb")
    raw = bytearray(open(data, "rb").read())
    at = raw.index(marker) + 10
    raw[at] ^= 0x01  # one bit of one record, on disk
    open(data, "wb").write(raw)
    segments = open_wal(wal_dir).segments(key)
    assert next(segments).first == 0
    with pytest.raises(WalCorruptionError, match=r"entry s/w1/000000/.*records 10\.\.14 fail their CRC32"):
        next(segments)


def test_truncated_data_file_is_refused_before_it_is_read(wal_dir):
    wal = open_wal(wal_dir)
    key = wal.begin_attempt("w1", 0, 0, {})
    for i in range(4):
        append(wal, key, i * 1000, batch([os.urandom(200) for _ in range(1000)]), 1 << 30)
    close_wals()
    data = os.path.join(wal_dir, "data.mdb")
    os.truncate(data, os.path.getsize(data) // 2)
    with pytest.raises(WalCorruptionError, match="data.mdb is truncated"):
        open_wal(wal_dir)


def test_corrupt_ack_bitmap_is_never_trusted(wal_dir):
    wal = open_wal(wal_dir)
    key = wal.begin_attempt("w1", 0, 0, {})
    append(wal, key, 0, batch([b"a", b"b"]), 1 << 20)
    with wal.env.begin(write=True) as txn:
        ack_key = f"a/{key}/{0:012d}".encode()
        value = bytearray(txn.get(ack_key))
        value[-1] ^= 1
        txn.put(ack_key, bytes(value))
    with pytest.raises(WalCorruptionError, match="acknowledgement bitmap"):
        list(wal.segments(key))


def test_fully_acknowledged_segment_keeps_only_its_digests_and_frees_its_bytes(wal_dir):
    wal = open_wal(wal_dir)
    key = wal.begin_attempt("w1", 0, 0, {})
    b = batch([b"x" * 500] * 4)
    append(wal, key, 0, b)
    append(wal, key, 4, batch([b"y"]), acks={0: bytearray(b"\x01\x01\x00\x01")})
    partly = wal.used_bytes()
    wal.save_acks(key, {0: bytearray(b"\x01" * 4)})
    assert wal.used_bytes() < partly - 2000
    first = next(wal.segments(key))
    assert first.batch is None and first.digests == record_digests(b, "t", "c") and all(first.acked)


def ipc_stream(b):
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, b.schema) as writer:
        writer.write_batch(b)
    return sink.getvalue().to_pybytes()


@pytest.mark.parametrize("b", [
    batch([b"a", b"", None, b"x" * 1000], keys=[b"k", None, b"", b"k2"]),
    batch([b"v%d" % i for i in range(1000)]).slice(3, 501),
    batch([b"x" * 70_000]),
], ids=["nulls-and-empties", "sliced", "one-large"])
def test_a_segment_built_in_place_has_the_bytes_of_the_stream_wrapped_afterwards(b):
    """The on-disk format is unchanged by building the segment in one buffer: a WAL written by an earlier
    release reads the same, and this one's the same for it."""
    digests = record_digests(b, "t", "c")
    value, payload_len = segment_value(77, digests, b)
    payload = ipc_stream(b)
    assert payload_len == len(payload)
    assert value.to_pybytes() == encode_segment(77, digests, payload, 0)


def test_segment_checksums_are_zlibs_crc32_whichever_implementation_computed_them():
    """The WAL checksums with zlib-ng where installed and zlib where not (--py-files): a WAL written by
    one must read under the other, so the header holds zlib's CRC32 of the rest of the segment."""
    b = batch([b"x" * 5000, b"", None], keys=[b"k", None, b""])
    value = segment_value(9, record_digests(b, "t", "c"), b)[0].to_pybytes()
    size = wal_format.SEG_HEADER.size
    count, first, payload_len, flags = wal_format.SEG_HEADER.unpack_from(value)[2:]
    assert wal_format.SEG_HEADER.unpack_from(value)[1] == \
        zlib.crc32(value[size:], zlib.crc32(struct.pack("<IQQI", count, first, payload_len, flags)))
    assert wal_format.crc32.__module__.startswith("zlib_ng"), "make setup installs zlib-ng: a quiet fallback?"


def test_compaction_by_the_appending_handle_stores_what_a_fresh_handle_would(wal_dir):
    """The handle that appended a segment compacts it from the digests it remembers, without reading the
    payload back; another handle (a later attempt's finish) reads it. Both must leave the same bytes."""
    wal = open_wal(wal_dir)
    b = batch([b"x" * 300, b"y" * 20, None])
    own, other = wal.begin_attempt("w1", 0, 0, {}), wal.begin_attempt("w1", 1, 0, {})
    append(wal, own, 5, b)
    append(wal, other, 5, b)
    wal.save_acks(own, {5: bytearray(b"\x01" * 3)})
    open_wal(wal_dir).save_acks(other, {5: bytearray(b"\x01" * 3)})
    with wal.env.begin() as txn:
        stored = [bytes(txn.get(b"s/%s/%012d" % (k.encode(), 5))) for k in (own, other)]
    assert stored[0] == stored[1] == encode_segment(5, record_digests(b, "t", "c"), b"", 1)
    assert wal.used_bytes() == 0 == wal.stats().payload_bytes
    wal.save_acks(own, {5: bytearray(b"\x01" * 3)})  # told twice: nothing more to free, nothing goes negative
    assert wal.used_bytes() == 0 and next(wal.segments(own)).batch is None


def test_a_segment_purged_before_its_compaction_is_not_brought_back(wal_dir):
    wal = open_wal(wal_dir)
    key = wal.begin_attempt("w1", 0, 0, {})
    append(wal, key, 0, batch([b"a", b"b"]))
    open_wal(wal_dir).purge([key])  # by hand, from another handle, while the attempt still runs
    with pytest.raises(WalError, match="no longer in the log"):
        wal.save_acks(key, {0: bytearray(b"\x01\x01")})
    assert wal.stats().orphaned_entries == 0 and wal.used_bytes() == 0


def test_finish_keeps_only_acknowledged_digests_of_superseded_attempts(wal_dir):
    wal = open_wal(wal_dir)
    old = wal.begin_attempt("w1", 0, 0, {})
    b = batch([b"a", b"b", b"c"])
    append(wal, old, 0, b, acks={})
    wal.save_acks(old, {0: bytearray(b"\x01\x00\x01")})
    new = wal.begin_attempt("w1", 0, 1, {})
    wal.finish(new, [old])
    assert {a.state for a in wal.attempts("w1/")} == {DONE}
    [seg] = wal.segments(old)
    digests = record_digests(b, "t", "c")
    assert seg.batch is None and seg.digests == digests[:16] + digests[32:]
    assert wal.used_bytes() == 0 == wal.stats().payload_bytes


def test_finish_deletes_dropped_attempts_in_the_same_transaction(wal_dir):
    wal = open_wal(wal_dir)
    aborted = wal.begin_attempt("w1", 0, 0, {})
    append(wal, aborted, 0, batch([b"a", b"b"]))
    new = wal.begin_attempt("w1", 0, 1, {})
    wal.finish(new, [], dropped=[aborted])
    assert [(a.key, a.state) for a in wal.attempts("w1/")] == [(new, DONE)]
    assert wal.used_bytes() == 0 == wal.stats().payload_bytes and wal.stats().orphaned_entries == 0


def test_a_committed_attempt_counts_every_logged_record_as_delivered(wal_dir):
    wal = open_wal(wal_dir)
    key = wal.begin_attempt("w1", 0, 0, {})
    b = batch([b"a", b"b"])
    append(wal, key, 0, b)
    [attempt] = wal.attempts("w1/")
    digests = record_digests(b, "t", "c")
    assert wal.delivered([attempt.key]).take([digests[:16], digests[16:]]).skip == [False, False]
    assert wal.delivered([attempt.key], all_acknowledged=True).take([digests[16:], digests[:16]]).skip == [True, True]


def test_sweep_removes_old_proof_of_finished_attempts_only(wal_dir):
    wal = open_wal(wal_dir)
    proof = wal.begin_attempt("done", 0, 0, {})
    append(wal, proof, 0, batch([b"a"]))
    wal.save_acks(proof, {0: bytearray(b"\x01")})
    wal.finish(proof, [])
    pending = wal.begin_attempt("failed", 0, 0, {})
    append(wal, pending, 0, batch([b"b"]))
    # Older than the retention, everything acknowledged, still open: a task that waited long for its first batch.
    running = wal.begin_attempt("running", 0, 0, {})
    append(wal, running, 0, batch([b"c"]))
    wal.save_acks(running, {0: bytearray(b"\x01")})
    removed, kept, _ = sweep(wal, retention_s=3600, now=time.time() + 7200)
    assert (removed, kept) == (1, 2)
    assert sorted(a.write_id for a in wal.attempts()) == ["failed", "running"]
    append(wal, running, 1, batch([b"d"]))  # it goes on writing


def test_proof_past_wal_proof_max_bytes_goes_oldest_first_and_the_records_stay(wal_dir):
    wal = open_wal(wal_dir)
    finished = []
    for write_id in ("oldest", "older", "newest"):
        key = wal.begin_attempt(write_id, 0, 0, {})
        append(wal, key, 0, batch([b"%s-%d" % (write_id.encode(), i) for i in range(100)]))
        wal.save_acks(key, {0: bytearray(b"\x01" * 100)})
        wal.finish(key, [])
        finished.append(key)
    pending = wal.begin_attempt("failed", 0, 0, {})  # records Kafka never acknowledged: never trimmed
    append(wal, pending, 0, batch([b"x" * 4000]))
    wal.end_attempt(pending)
    running = wal.begin_attempt("running", 0, 0, {})  # this process's, still open: never trimmed
    append(wal, running, 0, batch([b"c"]))
    wal.save_acks(running, {0: bytearray(b"\x01")})
    one = wal.proof_bytes([finished[0]])[finished[0]]
    assert one >= 100 * 16

    assert sweep(wal, 1e9, later(), proof_max_bytes=3 * one).trimmed == 0  # under the limit: nothing goes
    result = sweep(wal, 1e9, later(), proof_max_bytes=one + one // 2)
    assert result.trimmed == 2
    by_write = {a.write_id: a for a in wal.attempts()}
    assert sorted(by_write) == ["failed", "newest", "older", "oldest", "running"]  # every record stays
    assert [w for w, a in sorted(by_write.items()) if a.trimmed] == ["older", "oldest"]
    assert wal.record_count(finished[0]) == wal.record_count(finished[1]) == 0
    assert not wal.delivered([by_write["oldest"].key], all_acknowledged=True)
    assert sum(wal.delivered([by_write["newest"].key], all_acknowledged=True).acked.values()) == 100
    assert wal.holding_payload([pending]) == {pending}
    assert sweep(wal, 1e9, later(), proof_max_bytes=1).trimmed == 1  # the newest; never a running one
    assert not by_write["running"].trimmed and wal.record_count(running) == 1


def test_purging_or_sweeping_an_attempt_holds_one_segment_in_memory_at_a_time_not_its_whole_proof(wal_dir):
    wal = open_wal(wal_dir)
    key = wal.begin_attempt("big", 0, 0, {})
    n, segments = 10_000, 40  # 6.4 MB of digests once acknowledged
    for s in range(segments):
        b = batch([b"%d" % i for i in range(s * n, (s + 1) * n)])
        append(wal, key, s * n, b, max_bytes=1 << 30, acks={})
        wal.save_acks(key, {s * n: bytearray(b"\x01" * n)})
    wal.finish(key, [])
    assert wal.proof_bytes([key])[key] >= segments * n * 16
    tracemalloc.start()
    try:
        assert wal.holding_payload([key]) == set()
        wal.purge([key])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert wal.attempts() == []
    assert peak < segments * n * 16 // 8, peak  # about one segment's 160 KB, not the attempt's 6.4 MB


def test_a_write_to_an_attempt_no_longer_in_the_log_fails_at_once(wal_dir):
    wal = open_wal(wal_dir)
    key = wal.begin_attempt("w1", 0, 0, {})
    append(wal, key, 0, batch([b"a"]))
    wal.purge([key])
    with pytest.raises(WalError, match="no longer in the log"):
        append(wal, key, 1, batch([b"b"]))
    assert wal.stats().orphaned_entries == 0


def test_stats_counts_orphaned_entries(wal_dir):
    wal = open_wal(wal_dir)
    key = wal.begin_attempt("w1", 0, 0, {})
    append(wal, key, 0, batch([b"a"]))
    with wal.env.begin(write=True) as txn:
        txn.delete(f"m/{key}".encode())
    stats = wal.stats()
    assert (stats.attempts, stats.orphaned_entries) == (0, 2)


def test_the_map_fits_a_capped_address_space_and_is_large_otherwise(tmp_path):
    # A child process, so the cap (what spark.executor.pyspark.memory sets) does not bind the test runner.
    code = (
        "import resource, sys\n"
        "from recoverable_sink.wal import map_size\n"
        "print(map_size())\n"
        "resource.setrlimit(resource.RLIMIT_AS, (2 << 30, resource.RLIM_INFINITY))\n"
        "print(map_size())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    unlimited, capped = (int(line) for line in out.stdout.split())
    assert unlimited == 1 << 40
    assert capped == 512 << 20


def test_a_wal_directory_deleted_while_open_is_opened_anew_not_written_through_the_old_handle(wal_dir, caplog):
    wal = open_wal(wal_dir)
    key = wal.begin_attempt("w", 0, 0, {})
    append(wal, key, 0, batch([b"v"]))
    shutil.rmtree(wal_dir)
    with caplog.at_level(logging.WARNING, logger="recoverable_sink.wal"):
        fresh = open_wal(wal_dir)
    assert "was removed or replaced while open" in caplog.text
    assert fresh.attempts() == []
    assert os.path.exists(os.path.join(wal_dir, "data.mdb"))


def test_record_count_reads_the_segment_headers(wal_dir):
    wal = open_wal(wal_dir)
    key = wal.begin_attempt("w", 0, 0, {})
    append(wal, key, 0, batch([b"a", b"b"]))
    append(wal, key, 2, batch([b"c"]))
    assert wal.record_count(key) == sum(s.count for s in wal.segments(key)) == 3


def test_the_map_starts_small_and_doubles_when_full_up_to_its_limit(wal_dir, monkeypatch):
    """Under an address-space cap the map reserves little until the WAL needs it; past the limit a write fails
    with WalFullError and the WAL keeps what it had."""
    monkeypatch.setattr(wal_env, "_MIN_MAP_SIZE", 1 << 20)
    monkeypatch.setattr(wal_env, "map_size", lambda: 8 << 20)
    wal = open_wal(wal_dir)
    assert wal.env.info()["map_size"] == 1 << 20
    key = wal.begin_attempt("w", 0, 0, {})
    big = batch([os.urandom(1 << 20)])
    for i in range(4):
        append(wal, key, i, big, max_bytes=1 << 30)
    assert wal.env.info()["map_size"] == 8 << 20
    with pytest.raises(WalFullError, match="memory map is full"):
        for i in range(4, 16):
            append(wal, key, i, big, max_bytes=1 << 30)
    assert [s.count for s in wal.segments(key)] == [1] * (wal.record_count(key))
    assert wal.record_count(key) >= 4


def test_a_map_grown_by_another_process_is_adopted(wal_dir, monkeypatch):
    """Python workers share one WAL: when another one grows the map past this process's, LMDB says so
    (MDB_MAP_RESIZED) and this process takes the new size instead of failing."""
    monkeypatch.setattr(wal_env, "_MIN_MAP_SIZE", 1 << 20)
    wal = open_wal(wal_dir)
    key = wal.begin_attempt("w", 0, 0, {})
    append(wal, key, 0, batch([b"small"]))
    assert wal.env.info()["map_size"] == 1 << 20
    code = (
        "import os, sys\n"
        "import pyarrow as pa\n"
        "from recoverable_sink import wal as w\n"
        "from recoverable_sink.wal import env\n"
        "from recoverable_sink.identity import record_digests\n"
        "env._MIN_MAP_SIZE = 1 << 20\n"
        "wal = w.open_wal(sys.argv[1])\n"
        "key = wal.begin_attempt('other', 0, 0, {})\n"
        "for i in range(6):\n"
        "    b = pa.RecordBatch.from_arrays([pa.array([os.urandom(1 << 20)], pa.binary())], names=['value'])\n"
        "    wal.append(key, i, b, record_digests(b, 't', 'c'), 1 << 30, {})\n"
        "print(wal.env.info()['map_size'])\n"
    )
    out = subprocess.run([sys.executable, "-c", code, wal_dir], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) > 1 << 20
    assert wal.record_count(wal.attempts("other/")[0].key) == 6  # reading past our old map adopts the new size
    assert wal.env.info()["map_size"] == int(out.stdout)
    append(wal, key, 1, batch([b"after"]), max_bytes=1 << 30)
    assert [s.count for s in wal.segments(key)] == [1, 1]


def test_sweep_removes_an_unfinished_attempt_once_its_process_is_gone_and_it_holds_only_proof(wal_dir):
    # A child process opens an attempt, logs a batch Kafka acknowledged, and dies without finishing it.
    code = (
        "import sys, pyarrow as pa\n"
        "from recoverable_sink.wal import open_wal\n"
        "wal = open_wal(sys.argv[1])\n"
        "key = wal.begin_attempt('gone', 0, 0, {})\n"
        "b = pa.RecordBatch.from_pydict({'value': pa.array([b'a'], pa.binary())})\n"
        "wal.append(key, 0, b, bytes(16), 1 << 20, {})\n"
        "wal.save_acks(key, {0: bytearray(b'\\x01')})\n"
    )
    subprocess.run([sys.executable, "-c", code, str(wal_dir)], check=True)
    wal = open_wal(wal_dir)
    mine = wal.begin_attempt("running", 0, 0, {})  # this process's: still running
    append(wal, mine, 0, batch([b"c"]))
    wal.save_acks(mine, {0: bytearray(b"\x01")})
    assert sweep(wal, retention_s=3600, now=time.time() + 7200) == (1, 1, 0)
    assert [a.write_id for a in wal.attempts()] == ["running"]


def test_partitions_of_a_rerun_never_both_count_one_delivered_copy(wal_dir):
    """Claims on an earlier run's proof: one delivered copy is counted by one partition only, equal records
    count as a multiset, a retry of a partition takes its own claims again, and another run starts afresh."""
    from collections import Counter

    wal = open_wal(wal_dir)
    d, e, f = b"d" * 16, b"e" * 16, b"f" * 16
    proven = Counter({d: 1, e: 2})
    assert wal.claim("w", "run2", 0, [d, e, f], proven, Counter()) == [True, True, False]
    assert wal.claim("w", "run2", 1, [d, e, e], proven, Counter()) == [False, True, False]
    # Partition 0 retried (its input in another order): the copies it counted are still its own.
    assert wal.claim("w", "run2", 0, [e, f, d], proven, Counter()) == [True, False, True]
    # Within one attempt, batch after batch, a copy is counted once.
    taken = Counter()
    assert wal.claim("w", "run3", 0, [e], proven, taken) == [True]
    assert wal.claim("w", "run3", 0, [e, e], proven, taken) == [True, False]


def test_the_proof_of_a_failed_writes_done_partitions_is_never_trimmed_while_one_partition_is_not_done(wal_dir):
    """A re-run of a failed write skips by the proof of its successful partitions too: trimming them first made an
    at_least_once re-run repeat them and an exactly_once one refuse for ever."""
    wal = open_wal(wal_dir)
    done = []
    for partition in (0, 1, 3):
        key = wal.begin_attempt("failed-write", partition, 0, {})
        append(wal, key, 0, batch([b"p%d-%d" % (partition, i) for i in range(100)]))
        wal.save_acks(key, {0: bytearray(b"\x01" * 100)})
        wal.finish(key, [])
        done.append(key)
    failed = wal.begin_attempt("failed-write", 2, 0, {})
    append(wal, failed, 0, batch([b"p2-%d" % i for i in range(100)]))
    wal.save_acks(failed, {0: bytearray(b"\x01" * 50 + b"\x00" * 50)})
    wal.end_attempt(failed)
    other = wal.begin_attempt("finished-write", 0, 0, {})
    append(wal, other, 0, batch([b"o-%d" % i for i in range(100)]))
    wal.save_acks(other, {0: bytearray(b"\x01" * 100)})
    wal.finish(other, [])

    assert sweep(wal, 1e9, later(), proof_max_bytes=1).trimmed == 1  # the finished write's only
    by_key = {a.key: a for a in wal.attempts()}
    assert by_key[other].trimmed and not any(by_key[k].trimmed for k in done)
    assert sum(wal.delivered(done, all_acknowledged=True).acked.values()) == 300
    wal.finish(failed, [])  # the re-run completed the write: now all of it may go
    assert sweep(wal, 1e9, later(), proof_max_bytes=1).trimmed == 3  # the partitions done first
