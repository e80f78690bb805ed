"""The LMDB write-ahead log on its own: durability layout, bound, permissions, purge, corruption, replay plan."""

import os
import stat

import pyarrow as pa
import pytest

from recoverable_sink import wal as wal_module
from recoverable_sink.errors import WalCorruptionError, WalError, WalFullError
from recoverable_sink.task import ReplayPlan
from recoverable_sink.wal import open_wal


def batch(values, keys=None):
    arrays, names = [pa.array(values, pa.binary())], ["value"]
    if keys is not None:
        arrays.append(pa.array(keys, pa.binary()))
        names.append("key")
    return pa.RecordBatch.from_arrays(arrays, names=names)


@pytest.fixture
def wal_dir(tmp_path):
    path = tmp_path / "wal"
    yield str(path)
    env = wal_module._envs.pop(os.path.abspath(path), None)
    if env is not None:
        env.close()


def reopen(path):
    wal_module._envs.pop(os.path.abspath(path)).close()
    return open_wal(path)


def test_segments_round_trip_with_their_acknowledgements(wal_dir):
    wal = open_wal(wal_dir)
    key = wal.begin_attempt("w1", 3, 0, {"kind": "batch"})
    wal.append(key, 0, batch([b"a", b"b"]), 1 << 20, {})
    wal.append(key, 2, batch([b"c"]), 1 << 20, {0: bytearray(b"\x01\x00")})
    wal = reopen(wal_dir)
    segments = list(wal.segments(key))
    assert [(s.first, s.batch.column("value").to_pylist(), bytes(s.acked)) for s in segments] == [
        (0, [b"a", b"b"], b"\x01\x00"),
        (2, [b"c"], b"\x00"),
    ]
    [info] = wal.attempts("w1/")
    assert (info.write_id, info.partition, info.attempt, info.extra["kind"]) == ("w1", 3, 0, "batch")


def test_purge_removes_everything_of_the_attempt_and_frees_its_bytes(wal_dir):
    wal = open_wal(wal_dir)
    key = wal.begin_attempt("w1", 0, 0, {})
    other = wal.begin_attempt("w2", 0, 0, {})
    wal.append(key, 0, batch([b"x" * 100]), 1 << 20, {})
    wal.append(other, 0, batch([b"y"]), 1 << 20, {})
    before = wal.used_bytes()
    freed = wal.purge([key])
    assert freed > 100 and wal.used_bytes() == before - freed
    assert [a.write_id for a in wal.attempts()] == ["w2"]
    assert list(wal.segments(key)) == []


def test_max_bytes_refuses_the_batch_and_keeps_what_was_accepted(wal_dir):
    wal = open_wal(wal_dir)
    key = wal.begin_attempt("w1", 0, 0, {})
    size = wal.append(key, 0, batch([b"x" * 1000]), 4000, {})
    with pytest.raises(WalFullError, match=r"wal\.maxBytes=4000.*nothing was dropped"):
        wal.append(key, 1, batch([b"y" * 5000]), 4000, {})
    assert wal.used_bytes() == size
    assert [s.batch.num_rows for s in wal.segments(key)] == [1]


def test_directory_is_owner_only_and_files_are_0600(wal_dir):
    wal = open_wal(wal_dir)
    wal.append(wal.begin_attempt("w", 0, 0, {}), 0, batch([b"v"]), 1 << 20, {})
    assert stat.S_IMODE(os.stat(wal_dir).st_mode) == 0o700
    for name in ("data.mdb", "lock.mdb"):
        assert stat.S_IMODE(os.stat(os.path.join(wal_dir, name)).st_mode) == 0o600


def test_unusable_wal_path_is_a_clear_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(WalError, match=r"wal\.path=.*cannot be created"):
        open_wal(str(blocker / "wal"))


def test_flipped_byte_in_a_record_is_detected_with_its_location(wal_dir):
    wal = open_wal(wal_dir)
    key = wal.begin_attempt("w1", 0, 0, {})
    marker = b"PAYLOAD-" + b"z" * 64
    wal.append(key, 0, batch([b"ok"] * 10), 1 << 20, {})
    wal.append(key, 10, batch([marker] * 5), 1 << 20, {})
    wal.env.close()
    wal_module._envs.clear()
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
        wal.append(key, i * 1000, batch([os.urandom(200) for _ in range(1000)]), 1 << 30, {})
    wal.env.close()
    wal_module._envs.clear()
    data = os.path.join(wal_dir, "data.mdb")
    os.truncate(data, os.path.getsize(data) // 2)
    with pytest.raises(WalCorruptionError, match="data.mdb is truncated"):
        open_wal(wal_dir)


def test_corrupt_ack_bitmap_is_never_trusted(wal_dir):
    wal = open_wal(wal_dir)
    key = wal.begin_attempt("w1", 0, 0, {})
    wal.append(key, 0, batch([b"a", b"b"]), 1 << 20, {})
    with wal.env.begin(write=True) as txn:
        ack_key = f"a/{key}/{0:012d}".encode()
        value = bytearray(txn.get(ack_key))
        value[-1] ^= 1
        txn.put(ack_key, bytes(value))
    with pytest.raises(WalCorruptionError, match="acknowledgement bitmap"):
        list(wal.segments(key))


def test_replay_plan_skips_only_acknowledged_identical_records(wal_dir):
    wal = open_wal(wal_dir)
    old = wal.begin_attempt("w1", 0, 0, {})
    wal.append(old, 0, batch([b"r0", b"r1", b"r2", b"r3"]), 1 << 20, {})
    wal.save_acks(old, {0: bytearray(b"\x01\x01\x00\x01")})
    plan = ReplayPlan(wal, wal.prior_attempts("w1", 0))
    # r3 was acknowledged but the recomputed record at that position differs (non-deterministic source).
    skip, replayed, diverged = plan.mask(0, batch([b"r0", b"r1", b"r2", b"CHANGED", b"r4"]))
    assert skip == [True, True, False, False, False]
    assert (replayed, diverged) == (1, 1)


def test_replay_plan_handles_batches_that_straddle_old_segments(wal_dir):
    wal = open_wal(wal_dir)
    old = wal.begin_attempt("w1", 0, 0, {})
    wal.append(old, 0, batch([b"a", b"b", b"c"]), 1 << 20, {})
    wal.append(old, 3, batch([b"d", b"e"]), 1 << 20, {0: bytearray(b"\x01\x01\x01")})
    wal.save_acks(old, {3: bytearray(b"\x01\x00")})
    plan = ReplayPlan(wal, wal.prior_attempts("w1", 0))
    assert plan.mask(0, batch([b"a", b"b"]))[0] == [True, True]
    assert plan.mask(2, batch([b"c", b"d", b"e"]))[0] == [True, True, False]
