"""A task's view of its write's proof in the proof topic: what it reads as proof, and what it releases."""

from __future__ import annotations

import os

from recoverable_sink.contract import stream_write_id
from recoverable_sink.identity import DIGEST_SIZE
from recoverable_sink.proof.format import Chunk, ChunkKey, ChunkSegment, encode_chunk
from recoverable_sink.proof.view import ProofView


def test_a_micro_batch_releases_the_earlier_ones_live_proof_only():
    """A stream's task tombstones the proof of its query's earlier micro-batches that it reads; one another task
    already tombstoned is released, not released again (else each micro-batch would tombstone every key the ones
    before it ever had, and the proof topic would grow with the square of the query's length)."""
    def chunk_key(batch: int, partition: int, seq: int = 0) -> bytes:
        return ChunkKey("q", stream_write_id("q", batch), "r", partition, f"a{batch}", False, seq).encode()

    value = encode_chunk(Chunk((ChunkSegment(0, 1, b"\x01", os.urandom(DIGEST_SIZE)),)))
    log = [(chunk_key(5, 0), value), (chunk_key(5, 1), value),  # micro-batch 5's proof
           (chunk_key(5, 0), None), (chunk_key(5, 1), None),  # released by micro-batch 6's tasks
           (chunk_key(6, 0), value), (chunk_key(6, 1), value), (chunk_key(6, 1, 1), value)]
    view = ProofView(scope="q", write_id=stream_write_id("q", 7), run="r", partition=0)
    for offset, (key, v) in enumerate(log):
        view.first_pass(offset, key, v)
    assert list(view.older) == [(0, chunk_key(6, 0)), (1, chunk_key(6, 1)), (1, chunk_key(6, 1, 1))]


def test_this_tasks_other_attempts_are_known_from_any_chunk_of_theirs_committed_or_not():
    """An exactly_once chunk past the run's open transactions is no proof (it may be aborted), but it shows that its
    attempt exists: with a later task attempt id, this attempt is superseded."""
    value = encode_chunk(Chunk((ChunkSegment(0, 1, b"\x01", os.urandom(DIGEST_SIZE)),), task_attempt_id=9))
    log = [ChunkKey("w", "w", "r", 1, "other-partition", True, 0).encode(),  # X: the run's other partition
           ChunkKey("w", "w", "r", 0, "later", True, 0).encode(),
           ChunkKey("w", "w", "r0", 0, "other-run", True, 0).encode()]
    view = ProofView(scope="w", write_id="w", run="r", partition=0)
    for offset, key in enumerate(log):
        view.first_pass(offset, key, value)
    assert view.siblings == {"later": 9} and view.attempts == {}
