"""The attempt store on its own: segments, acknowledgements, purge, bound, proof of delivery, corruption."""


import os
import tracemalloc

import pytest

from recoverable_sink.errors import WalCorruptionError, WalError, WalFullError
from recoverable_sink.identity import record_digests
from recoverable_sink.wal import DONE, close_wals, open_wal
from recoverable_sink.wal.format import encode_segment
from tests.unit.wal.helpers import append, batch, reopen


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


def test_record_count_reads_the_segment_headers(wal_dir):
    wal = open_wal(wal_dir)
    key = wal.begin_attempt("w", 0, 0, {})
    append(wal, key, 0, batch([b"a", b"b"]))
    append(wal, key, 2, batch([b"c"]))
    assert wal.record_count(key) == sum(s.count for s in wal.segments(key)) == 3


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
