"""The proof topic as one task attempt uses it (executor): where its write's proof is read from, what it holds of
earlier attempts (for the evidence and the proof the plan takes), the chunks this attempt writes, its claims on other
runs' proof, and what it reports to the driver for the release.

Where to read: a batch write's driver says (:class:`ProofStart`, the write's directory entry and this run's own start);
a stream's task asks the directory of its query, and where a query has none yet, notes the partition's end first and
writes that (a first micro-batch's tasks may race; each writes a start below anything written after its own look).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import pyarrow as pa

from recoverable_sink._logging import get_logger
from recoverable_sink.contract import TaskIdentity
from recoverable_sink.executor.evidence import RemoteAttempt
from recoverable_sink.executor.proof import Claims, NoClaims, RemoteSegment
from recoverable_sink.identity import DeliveredSet
from recoverable_sink.options import KafkaProof, SinkOptions
from recoverable_sink.producer.marker import Marker
from recoverable_sink.producer.transactions import transactional_id
from recoverable_sink.proof.claims import KafkaClaims
from recoverable_sink.proof.format import (
    MAX_CHUNK_RECORDS,
    Chunk,
    ChunkKey,
    ChunkSegment,
    DirectoryKey,
    MarkerKey,
    encode_chunk,
    encode_directory,
    partition_of,
)
from recoverable_sink.proof.io import KafkaIO, ProofIO
from recoverable_sink.proof.read import read_view
from recoverable_sink.proof.view import ProofView

log = get_logger("proof")


@dataclass(frozen=True)
class ProofStart:
    """Where a batch write's tasks read its proof (decided on the driver): ``starts``, per proof partition, the lowest
    offset of the write's live proof (earlier runs' and this run's); ``fresh``: no earlier run of the write left any,
    so a first attempt reads nothing."""

    partition: int
    starts: dict[int, int] = field(default_factory=dict)
    fresh: bool = True


def scope_of(ident: TaskIdentity) -> str:
    return ident.transaction_scope


class KafkaProofLog:
    """One attempt's side of the proof topic (see the module's docstring). Read once, when the evidence first asks."""

    def __init__(self, options: SinkOptions, proof: KafkaProof, ident: TaskIdentity,
                 start: ProofStart | None, io: ProofIO | None = None) -> None:
        self.options = options
        self.proof = proof
        self.io: ProofIO = io if io is not None else KafkaIO(options, proof)
        self.topic: str | None = proof.topic
        self.ident = ident
        self.scope = scope_of(ident)
        partitions = proof.known_partitions or proof.partitions
        self.partition = start.partition if start is not None else partition_of(self.scope, partitions)
        self._start = start
        self._view: ProofView | None = None
        self.read_from: int | None = None  # where this attempt began to read (a stream's start)
        self.read_seconds = 0.0

    # ---- reading ---------------------------------------------------------------------------------------------
    def view(self) -> ProofView:
        if self._view is None:
            self._view = self._read()
        return self._view

    def _read(self) -> ProofView:
        view = ProofView(self.scope, self.ident.write_id, self.ident.run, self.ident.partition)
        start = self._start
        if start is not None and start.fresh and self.ident.attempt == 0:
            # A first attempt of a write no earlier run wrote: nothing to read. (A stage Spark re-submits after a
            # shuffle fetch failure numbers its tasks from 0 again, and pyspark does not say so: such a task on
            # another host is taken for a first attempt; docs/guarantees.md.)
            return view
        starts = dict(start.starts) if start is not None else self._stream_starts()
        self.read_from = min(starts.values(), default=None)
        began = time.monotonic()  # measured only (the commit message reports the read's cost)
        read = read_view(self.io, view, starts, lambda scope, p: transactional_id(self.options, scope, p))
        self.read_seconds = time.monotonic() - began
        return read

    def _stream_starts(self) -> dict[int, int]:
        """A stream's: its query's directory entry, or this partition's end now, written as the entry where there is
        none (read before the directory, so that it is below anything a racing task of the query writes)."""
        end = self.io.high_watermark(self.partition)
        found = self.io.lookup(self.scope)
        if found is not None:
            return found
        starts = {self.partition: end}
        self.io.produce([(0, DirectoryKey(self.scope).encode(), encode_directory(starts))], "a directory entry")
        return starts

    def attempts(self) -> Sequence[RemoteAttempt]:
        view = self.view()
        found = [RemoteAttempt(name=a.name, partition=a.partition, run=a.run, exactly_once=a.exactly_once,
                               records=a.records, done=a.exactly_once or a.last, task_attempt_id=a.task_attempt_id,
                               micro_batch=a.micro_batch)
                 for a in view.attempts.values()]
        # This task's other attempts whose proof the view does not hold (exactly_once, past the run's open
        # transactions): known to exist, so a later one supersedes this attempt.
        found += [RemoteAttempt(name=name, partition=self.ident.partition, run=self.ident.run or "-", exactly_once=True,
                                records=0, done=False, task_attempt_id=tid, proven=False)
                  for name, tid in view.siblings.items() if name not in view.attempts]
        return found

    def latest_micro_batch(self) -> int | None:
        return self.view().latest_micro_batch

    def markers(self) -> dict[int, Marker]:
        """This write's committed markers the proof topic holds, by partition."""
        return dict(self.view().markers)

    def expired(self) -> bool:
        return self.view().truncated

    def segments(self, name: str) -> list[RemoteSegment]:
        found = self.view().attempts.get(name)
        if found is None:
            return []
        return [(s.first, s.count, s.acked, s.digests) for s in found.segments.values()]

    def claims(self, proven: DeliveredSet) -> Claims:
        """Other runs' proof, taken under this run's claims in the proof topic."""
        if not proven or self.ident.run is None:
            return NoClaims()
        view = self.view()
        found = view.own_runs_from.get(self.partition)
        read_from = found if found is not None else self.io.high_watermark(self.partition)
        return KafkaClaims(self.io, view, self.ident.partition, self.partition, read_from, proven)

    # ---- writing ---------------------------------------------------------------------------------------------
    def chunk_batches(self, attempt: str, seq: int, segments: list[ChunkSegment], last: bool,
                      exactly_once: bool) -> list[pa.RecordBatch]:
        """Proof records of this attempt's segments (its ``seq``-th chunk onwards), each of at most
        :data:`MAX_CHUNK_RECORDS` records, as batches for the ledger."""
        chunks: list[list[ChunkSegment]] = [[]]
        size = 0
        for s in segments:
            if chunks[-1] and size + s.count > MAX_CHUNK_RECORDS:
                chunks.append([])
                size = 0
            chunks[-1].append(s)
            size += s.count
        keys, values = [], []
        for i, group in enumerate(chunks):
            key = ChunkKey(self.scope, self.ident.write_id, self.ident.run or "-", self.ident.partition, attempt,
                           exactly_once, seq + i)
            keys.append(key.encode())
            values.append(encode_chunk(Chunk(tuple(group), last=last and i == len(chunks) - 1,
                                             task_attempt_id=self.ident.task_attempt_id,
                                             micro_batch=self.ident.batch_id)))
        return [self._batch(keys, values)]

    def marker_batch(self, marker: Marker) -> pa.RecordBatch:
        """The partition's commit marker, for its transaction."""
        return self._batch([MarkerKey(self.scope, self.ident.partition).encode()], [marker.encode().encode()])

    def _batch(self, keys: list[bytes], values: list[bytes]) -> pa.RecordBatch:
        return pa.RecordBatch.from_pydict({"key": pa.array(keys, pa.binary()), "value": pa.array(values, pa.binary()),
                                           "partition": pa.array([self.partition] * len(keys), pa.int32())})

    def older_keys(self, partition: int) -> list[bytes]:
        return [k for p, k in (self._view.older if self._view is not None else ()) if p == partition]

    def low(self) -> int | None:
        return self._view.low if self._view is not None else None

    def read_cost(self) -> tuple[int, int, float]:
        view = self._view
        return (view.records_read, view.bytes_read, self.read_seconds) if view is not None else (0, 0, 0.0)

    def chunks_known(self, partition: int) -> list[tuple[str, str, bool, int]]:
        if self._view is None:
            return []
        return [(a.name, a.run, a.exactly_once, a.chunks) for a in self._view.attempts.values()
                if a.partition == partition]
