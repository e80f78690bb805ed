"""Proof of delivery as a task takes it (executor): the digests of what earlier attempts delivered, read from this
host's WAL and the proof topic, and the claims that keep two partitions of a run from both counting one delivered copy.

A resume plan names the attempts to take (:class:`~recoverable_sink.executor.resume_plan.Take`); :func:`delivered`
reads their proof as one multiset, an attempt found in both places as the union of the two (its WAL may hold
acknowledgements its last checkpoint to Kafka missed, or the reverse, when a kill came between the two). Attempts of
the task's own partition and run hold the same rows, so a retry takes their proof record by record; other runs' attempts
may hold any of the write's rows (the rows may be split otherwise now), so their proof is taken under claims
(:class:`Claims`): of all the partitions of one run, one counts each delivered copy.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Protocol

import pyarrow as pa

from recoverable_sink.executor.evidence import RemoteAttempt
from recoverable_sink.executor.resume_plan import Take
from recoverable_sink.identity import DIGEST_SIZE, DeliveredSet
from recoverable_sink.producer.marker import Marker
from recoverable_sink.proof.format import ChunkSegment
from recoverable_sink.wal import Wal

# One checkpointed segment of an attempt as the proof topic holds it: (segment's first position, its record count,
# its acknowledgement bitmap (one byte per record), the digests of its acknowledged records in order).
RemoteSegment = tuple[int, int, bytes, bytes]


class RemoteSegments(Protocol):
    """What the proof topic holds of one attempt, segment by segment (:mod:`recoverable_sink.executor.kafka_proof`)."""

    def segments(self, name: str) -> Iterable[RemoteSegment]: ...


class ProofTopic(Protocol):
    """The proof topic as the partition writer uses it: :class:`~recoverable_sink.executor.kafka_proof.KafkaProofLog`,
    a test's scripted broker, or :class:`NoProofTopic` (``proof.kafka=false``). What it holds is read once, when first
    asked; ``partition`` is the write's proof partition; ``read_from`` where this attempt began to read (None: it read
    nothing)."""

    topic: str | None
    partition: int
    read_from: int | None

    def attempts(self) -> Sequence[RemoteAttempt]: ...

    def latest_micro_batch(self) -> int | None: ...

    def markers(self) -> dict[int, Marker]: ...

    def expired(self) -> bool:
        """Whether the topic's retention deleted part of where this write's proof starts (a re-run may lack some)."""
        ...

    def segments(self, name: str) -> Iterable[RemoteSegment]: ...

    def claims(self, proven: DeliveredSet) -> Claims: ...

    def chunk_batches(self, attempt: str, seq: int, segments: list[ChunkSegment], last: bool,
                      exactly_once: bool) -> list[pa.RecordBatch]: ...

    def marker_batch(self, marker: Marker) -> pa.RecordBatch: ...

    def older_keys(self, partition: int) -> list[bytes]:
        """Proof keys of earlier micro-batches of this query's ``partition``, which this one's commit releases."""
        ...

    def low(self) -> int | None:
        """The lowest offset of this write's proof read (None: none read)."""
        ...

    def read_cost(self) -> tuple[int, int, float]:
        """What reading the write's proof cost: records, bytes, seconds."""
        ...

    def chunks_known(self, partition: int) -> list[tuple[str, str, bool, int]]:
        """The proof chunks of ``partition``'s earlier attempts of this write that were read: (attempt, run,
        exactly_once, chunks)."""
        ...


class NoProofTopic:
    """``proof.kafka=false``: nothing beyond the WAL."""

    topic: str | None = None
    partition = 0
    read_from: int | None = None

    def attempts(self) -> Sequence[RemoteAttempt]:
        return ()

    def latest_micro_batch(self) -> int | None:
        return None

    def markers(self) -> dict[int, Marker]:
        return {}

    def expired(self) -> bool:
        return False

    def segments(self, name: str) -> Iterable[RemoteSegment]:
        return ()

    def claims(self, proven: DeliveredSet) -> Claims:
        raise AssertionError("without a proof topic, claims are the WAL's")

    def chunk_batches(self, attempt: str, seq: int, segments: list[ChunkSegment], last: bool,
                      exactly_once: bool) -> list[pa.RecordBatch]:
        return []

    def marker_batch(self, marker: Marker) -> pa.RecordBatch:
        raise AssertionError("no proof topic")

    def older_keys(self, partition: int) -> list[bytes]:
        return []

    def low(self) -> int | None:
        return None

    def read_cost(self) -> tuple[int, int, float]:
        return (0, 0, 0.0)

    def chunks_known(self, partition: int) -> list[tuple[str, str, bool, int]]:
        return []


def delivered(takes: Sequence[Take], wal: Wal | None, remote: RemoteSegments) -> DeliveredSet:
    """The multiset of records these attempts delivered (every record they logged, for a take of ``all_logged``), with
    what they logged without an acknowledgement (for the ``replayed`` count)."""
    found = DeliveredSet()
    for take in takes:
        prior = take.prior
        local: dict[int, tuple[bytes, bytes | bytearray | None]] = {}
        if wal is not None and prior.key is not None and not prior.trimmed:
            for seg in wal.segments(prior.key, payload=False):
                local[seg.first] = (seg.digests, seg.acked)
        extra: dict[int, tuple[int, bytes, bytes]] = {}
        if prior.in_kafka:
            for first, count, bitmap, digests in remote.segments(prior.name):
                extra[first] = (count, bitmap, digests)
        for first, (digests, acked) in local.items():
            more = extra.pop(first, None)
            if take.all_logged or acked is None:
                found.add(digests, None)
            elif more is not None and len(more[1]) == len(acked):
                found.add(digests, bytes(a | b for a, b in zip(acked, more[1], strict=True)))
            else:
                found.add(digests, acked)
        for _first, (_count, _bitmap, digests) in extra.items():
            found.add(digests, None)  # only what was acknowledged is in the proof topic
    return found


class Claims(Protocol):
    """Other runs' proof, taken batch by batch under the run's claims."""

    @property
    def records(self) -> int:
        """Delivered records the other runs proved, in all partitions."""
        ...

    def __bool__(self) -> bool: ...

    def take(self, digests: list[bytes]) -> list[bool]:
        """Per record: already delivered by another run (and now counted by this partition)."""
        ...


class NoClaims:
    """Not a re-run (or nothing proven by another run): nothing to take."""

    @property
    def records(self) -> int:
        return 0

    def __bool__(self) -> bool:
        return False

    def take(self, digests: list[bytes]) -> list[bool]:
        return [False] * len(digests)


class WalClaims:
    """Other runs' proof (record digest -> delivered copies), taken under claims kept in this host's WAL
    (:meth:`Wal.claim`): exact where every partition of the run that takes from it runs on this host."""

    def __init__(self, wal: Wal, write_id: str, run: str, partition: int, proven: DeliveredSet) -> None:
        self.wal = wal
        self.write_id = write_id
        self.run = run
        self.partition = partition
        self.proven: Counter[bytes] = proven.acked
        self.taken: Counter[bytes] = Counter()

    def __bool__(self) -> bool:
        return bool(self.proven)

    @property
    def records(self) -> int:
        return sum(self.proven.values())

    def take(self, digests: list[bytes]) -> list[bool]:
        if not any(d in self.proven for d in digests):
            return [False] * len(digests)
        return self.wal.claim(self.write_id, self.run, self.partition, digests, self.proven, self.taken)


def digests_of(blob: bytes) -> list[bytes]:
    return [blob[i:i + DIGEST_SIZE] for i in range(0, len(blob), DIGEST_SIZE)]
