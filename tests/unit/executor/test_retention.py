"""Retention as tasks start: the sweep of old proof the proof topic holds, and proof trimmed past wal.proofMaxBytes;
the rules are :func:`recoverable_sink.executor.resume_plan.release`'s, carried out on a real WAL."""


import subprocess
import sys
import time

from recoverable_sink.executor.retention import sweep
from recoverable_sink.wal import open_wal
from tests.unit.wal.helpers import append, batch, later


def test_sweep_removes_old_proof_only_where_the_proof_topic_holds_it(wal_dir):
    """The host's clock decides only over published proof: a clock stepped a year ahead takes nothing else."""
    wal = open_wal(wal_dir)
    keys = {}
    for name in ("published", "unpublished"):
        keys[name] = key = wal.begin_attempt(name, 0, 0, {})
        append(wal, key, 0, batch([name.encode()]))
        wal.save_acks(key, {0: bytearray(b"\x01")})
        wal.finish(key, [])
    wal.set_published(keys["published"])
    pending = wal.begin_attempt("failed", 0, 0, {})
    append(wal, pending, 0, batch([b"b"]))
    # Older than the retention, everything acknowledged, still open: a task that waited long for its first batch.
    running = wal.begin_attempt("running", 0, 0, {})
    append(wal, running, 0, batch([b"c"]))
    wal.save_acks(running, {0: bytearray(b"\x01")})
    removed, kept, _ = sweep(wal, retention_s=3600, now=time.time() + 365 * 86400)
    assert (removed, kept) == (1, 2)
    assert sorted(a.write_id for a in wal.attempts()) == ["failed", "running", "unpublished"]
    append(wal, running, 1, batch([b"d"]))  # it goes on writing
    assert sweep(wal, retention_s=3600, now=time.time() - 365 * 86400) == (0, 0, 0)


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


def test_an_unfinished_attempt_whose_process_is_gone_stays_whatever_its_age(wal_dir):
    """A failed attempt's proof is what its write's re-run skips by: no clock takes it (it is kept, and named in the
    sweep's warning, until the write is re-run or purged)."""
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
    assert sweep(wal, retention_s=3600, now=time.time() + 7200) == (0, 2, 0)
    assert sorted(a.write_id for a in wal.attempts()) == ["gone", "running"]


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
