"""What the proof topic holds of one write, as a task sees it (pure): built from the records of the write's scope in
two passes over its proof partition, by :mod:`.reader` from Kafka or by a test's scripted broker from memory.

The first pass reads every record (``read_uncommitted``): at_least_once chunks, written outside any transaction, are
facts once there, and so are claims; the first record of another partition of this task's own run marks where the
evidence ends (``X``): from there on, transactions of this run may still be open. The second pass reads committed
records only (``read_committed``) below ``X``: exactly_once chunks and markers count only if their transaction
committed; earlier runs' records, and this partition's earlier attempts' (which opening this attempt fenced), lie
below ``X``, and once the partition's last stable offset passed it, every transaction among them has ended.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from recoverable_sink.contract import stream_batch_of
from recoverable_sink.producer.marker import Marker
from recoverable_sink.proof.format import (
    Chunk,
    ChunkKey,
    ChunkSegment,
    ClaimKey,
    MarkerKey,
    chunk_task_attempt_id,
    decode_chunk,
    decode_claims,
    parse_key,
)


@dataclass
class AttemptProof:
    """One attempt's proof as the proof topic holds it."""

    name: str
    partition: int
    run: str
    exactly_once: bool
    segments: dict[int, ChunkSegment] = field(default_factory=dict)  # by first position
    last: bool = False
    task_attempt_id: int | None = None
    micro_batch: int | None = None
    keys: list[bytes] = field(default_factory=list)
    chunks: int = 0  # one past the highest chunk number seen


    @property
    def records(self) -> int:
        return sum(len(s.digests) // 16 for s in self.segments.values())

    def add(self, key: bytes, chunk: Chunk, seq: int) -> None:
        self.keys.append(key)
        self.chunks = max(self.chunks, seq + 1)
        for s in chunk.segments:
            known = self.segments.get(s.first)
            if known is None or sum(s.acked) > sum(known.acked):
                self.segments[s.first] = s
        self.last = self.last or chunk.last
        self.task_attempt_id = chunk.task_attempt_id if chunk.task_attempt_id is not None else self.task_attempt_id
        self.micro_batch = chunk.micro_batch if chunk.micro_batch is not None else self.micro_batch


@dataclass(frozen=True)
class Claim:
    offset: int
    partition: int
    nonce: str
    copies: tuple[tuple[bytes, int], ...]


@dataclass
class ProofView:
    """One write's proof (``write_id``, in ``scope``), as a task attempt of ``run`` and ``partition`` reads it."""

    scope: str
    write_id: str
    run: str | None
    partition: int | None = None
    attempts: dict[str, AttemptProof] = field(default_factory=dict)
    markers: dict[int, Marker] = field(default_factory=dict)  # this write's committed markers, by partition
    claims: list[Claim] = field(default_factory=list)  # this run's, in the log's order
    latest_micro_batch: int | None = None  # of the query, among every record of the scope
    own_run_from: int | None = None  # X: the first offset of a record of this run in the partition being read
    own_runs_from: dict[int, int | None] = field(default_factory=dict)  # X of each partition read
    low: int | None = None  # the lowest offset of a record of this write seen
    truncated: bool = False  # retention deleted records where the write's proof was to start
    # (partition, key) of earlier micro-batches' live proof, in the log's order (a dict: a later tombstone drops one)
    older: dict[tuple[int, bytes], None] = field(default_factory=dict)
    # This task's exactly_once attempts in this run (same write, run and partition) by name, with Spark's task attempt
    # id, from any chunk of theirs, committed or not: a later one means this attempt is superseded, whatever became of
    # it. (at_least_once attempts are in ``attempts`` with theirs.)
    siblings: dict[str, int | None] = field(default_factory=dict)
    needs_committed: bool = False  # the first pass saw transactional records of other runs below X
    records_read: int = 0  # what reading it cost: records and bytes (keys and values) over both passes
    bytes_read: int = 0

    def _note(self, offset: int, write_id: str) -> None:
        batch = stream_batch_of(write_id)
        if batch is not None and stream_batch_of(self.write_id) is not None:
            self.latest_micro_batch = max(batch, self.latest_micro_batch or batch)
        if write_id == self.write_id and (self.low is None or offset < self.low):
            self.low = offset

    def _count(self, raw_key: bytes | None, value: bytes | None) -> None:
        self.records_read += 1
        self.bytes_read += len(raw_key or b"") + len(value or b"")

    def first_pass(self, offset: int, raw_key: bytes | None, value: bytes | None) -> None:
        """A record as ``read_uncommitted`` returns it."""
        self._count(raw_key, value)
        key = parse_key(raw_key)
        if key is None or key.scope != self.scope:
            return
        if isinstance(key, MarkerKey):
            if self.own_run_from is None:
                self.needs_committed = True
            if value:  # a later micro-batch's marker, even uncommitted, means that batch began: this one is done
                marker = Marker.parse(value.decode(errors="replace"))
                if marker.write_id is not None and marker.write_id != self.write_id:
                    self._note(offset, marker.write_id)
            return
        if not isinstance(key, ChunkKey | ClaimKey):
            return
        self._note(offset, key.write_id)
        mine, theirs = stream_batch_of(self.write_id), stream_batch_of(key.write_id)
        if mine is not None and theirs is not None and theirs < mine and raw_key is not None:
            # Released by this micro-batch's tasks, unless a tombstone already did: taking tombstones for proof would
            # make each micro-batch tombstone again every key the ones before it had, without end.
            if value is None:
                self.older.pop((key.partition, raw_key), None)
            else:
                self.older[(key.partition, raw_key)] = None
        own = self.run is not None and key.run == self.run and key.write_id == self.write_id
        # X: the first record of another partition of this run, whose transaction may still be open. This partition's
        # earlier attempts of the run are below or past it alike: opening this attempt fenced them, so theirs ended.
        if own and key.partition != self.partition and self.own_run_from is None:
            self.own_run_from = offset
        if key.write_id != self.write_id or value is None:
            return
        if own and key.partition == self.partition and isinstance(key, ChunkKey) and key.exactly_once:
            readable, tid = chunk_task_attempt_id(value)  # the header only: these chunks prove nothing here
            if readable and (key.attempt not in self.siblings or tid is not None):
                self.siblings[key.attempt] = tid
        if isinstance(key, ClaimKey):
            if own:
                copies = decode_claims(value)
                if copies is not None:
                    self.claims.append(Claim(offset, key.partition, key.nonce, tuple(copies)))
            return
        if key.exactly_once:
            if self.own_run_from is None:
                self.needs_committed = True
            return
        chunk = decode_chunk(value)
        if chunk is not None:
            self._attempt(key).add(raw_key or b"", chunk, key.seq)

    def second_pass(self, offset: int, raw_key: bytes | None, value: bytes | None) -> None:
        """A committed record below X, as ``read_committed`` returns it."""
        self._count(raw_key, value)
        key = parse_key(raw_key)
        if key is None or key.scope != self.scope or value is None:
            return
        if isinstance(key, MarkerKey):
            marker = Marker.parse(value.decode(errors="replace"))
            if marker.write_id is not None:
                self._note(offset, marker.write_id)
            if marker.write_id == self.write_id:
                self.markers[key.partition] = marker
            return
        if isinstance(key, ChunkKey) and key.exactly_once and key.write_id == self.write_id and (
                key.run != self.run or key.partition == self.partition):
            chunk = decode_chunk(value)
            if chunk is not None:
                self._attempt(key).add(raw_key or b"", chunk, key.seq)

    def _attempt(self, key: ChunkKey) -> AttemptProof:
        found = self.attempts.get(key.attempt)
        if found is None:
            found = self.attempts[key.attempt] = AttemptProof(key.attempt, key.partition, key.run, key.exactly_once)
        return found
