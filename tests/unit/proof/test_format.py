"""The proof topic's chunk format: what a drain publishes reads back whole, partly acknowledged segments included, and
a value this version cannot read is skipped rather than misread."""

from __future__ import annotations

import os

from recoverable_sink.identity import DIGEST_SIZE
from recoverable_sink.proof.format import (
    Chunk,
    ChunkSegment,
    acked_digests,
    chunk_task_attempt_id,
    decode_chunk,
    encode_chunk,
)


def test_only_the_acknowledged_records_digests_are_kept_in_order():
    digests = b"".join(bytes([i]) * DIGEST_SIZE for i in range(6))
    acked = bytes([1, 0, 1, 1, 0, 0])
    assert acked_digests(digests, acked) == bytes([0]) * DIGEST_SIZE + bytes([2]) * DIGEST_SIZE + \
        bytes([3]) * DIGEST_SIZE
    assert acked_digests(digests, bytes([1] * 6)) is digests  # a whole segment: no copy
    assert acked_digests(digests, bytes(6)) == b""


def test_a_chunk_reads_back_as_it_was_written_with_partly_acknowledged_segments():
    digests = os.urandom(10 * DIGEST_SIZE)
    partial = bytes([1, 1, 0, 1, 0, 0, 0, 1, 1, 0])
    chunk = Chunk((ChunkSegment(0, 10, bytes([1] * 10), digests),
                   ChunkSegment(10, 10, partial, acked_digests(digests, partial))),
                  last=True, task_attempt_id=17, micro_batch=3)
    back = decode_chunk(encode_chunk(chunk))
    assert back == chunk and back.records == 15


def test_a_value_that_does_not_add_up_is_skipped_not_misread():
    chunk = Chunk((ChunkSegment(0, 4, bytes([1, 1, 0, 1]), os.urandom(3 * DIGEST_SIZE)),))
    value = encode_chunk(chunk)
    assert decode_chunk(value[:-1]) is None  # a digest short
    assert decode_chunk(bytes([99]) + value[1:]) is None  # another version's
    assert chunk_task_attempt_id(value) == (True, None) and chunk_task_attempt_id(bytes([99]) + value[1:])[0] is False
    assert chunk_task_attempt_id(encode_chunk(Chunk((), task_attempt_id=17))) == (True, 17)
