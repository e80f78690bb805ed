"""Claims of a re-run's partitions on other runs' proof, kept in the proof topic (executor): of all the partitions of
one run, on any hosts, one counts each delivered copy of a record.

A re-run's partitions may hold any of the write's rows, and equal records may sit in several of them; a record Kafka
holds ``n`` times may be skipped by at most ``n`` of them. A partition about to skip records claims them first: it
writes one claim record per Arrow batch, each claimed copy named by (partition, its count of that record so far), to
the write's proof partition, and reads the partition up to its own claim. The log's order decides: of the distinct
claims on one record, the first ``n`` win. A claim's outcome depends only on what precedes it, so every partition
reads the same outcome, and a retry of a partition, which recomputes the same input, claims the same copies again and
finds them already decided. Claims are written outside any transaction (an aborted attempt's claim still counts, and
its retry takes it again).
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from typing import Protocol

from recoverable_sink.errors import DeliveryError
from recoverable_sink.identity import DeliveredSet
from recoverable_sink.proof.format import ClaimKey, encode_claims
from recoverable_sink.proof.view import Claim, ProofView


class ClaimLog(Protocol):
    """Where claims are written and read (:class:`recoverable_sink.proof.io.KafkaIO`, or a test's scripted broker)."""

    topic: str

    def claim(self, partition: int, key: bytes, value: bytes) -> None:
        """Write a claim and return once Kafka acknowledged it."""
        ...

    def read_since(self, view: ProofView, partition: int, position: int) -> int:
        """Feed the records of ``partition`` from ``position`` to its end to ``view.first_pass``; returns the end."""
        ...

    def read_limit_s(self) -> float: ...


class ClaimBook:
    """The order of one run's claims (pure): per record digest, the distinct (partition, copy) claims in the log's
    order; the first ``proven`` of them win."""

    def __init__(self) -> None:
        self.order: dict[bytes, list[tuple[int, int]]] = {}
        self.nonces: set[str] = set()

    def add(self, claim: Claim) -> None:
        if claim.nonce in self.nonces:
            return
        self.nonces.add(claim.nonce)
        for digest, copy in claim.copies:
            seen = self.order.setdefault(digest, [])
            if (claim.partition, copy) not in seen:
                seen.append((claim.partition, copy))

    def won(self, digest: bytes, partition: int, copy: int, proven: int) -> bool:
        return (partition, copy) in self.order.get(digest, [])[:proven]


class KafkaClaims:
    """Other runs' proof, taken batch by batch under claims in the proof topic (see the module's docstring)."""

    def __init__(self, log: ClaimLog, view: ProofView, partition: int, proof_partition: int, read_from: int,
                 proven: DeliveredSet) -> None:
        assert view.run is not None, "claims are a run's"
        self.log = log
        self.view = view
        self.partition = partition
        self.proof_partition = proof_partition
        self.position = read_from
        self.proven: Counter[bytes] = proven.acked
        self.seen: Counter[bytes] = Counter()  # this attempt's copies of each record that reached the claims
        self.book = ClaimBook()
        for claim in view.claims:
            self.book.add(claim)

    def __bool__(self) -> bool:
        return bool(self.proven)

    @property
    def records(self) -> int:
        return sum(self.proven.values())

    def take(self, digests: list[bytes]) -> list[bool]:
        """Per record: already delivered by another run, and this partition's claim on that copy won."""
        wanted: list[tuple[int, bytes, int]] = []
        for i, d in enumerate(digests):
            if self.proven.get(d, 0):
                self.seen[d] += 1
                if self.seen[d] <= self.proven[d]:
                    wanted.append((i, d, self.seen[d]))
        result = [False] * len(digests)
        if not wanted:
            return result
        undecided = [(d, c) for _, d, c in wanted if not self._decided(d, c)]
        if undecided:
            nonce = uuid.uuid4().hex
            key = ClaimKey(self.view.scope, self.view.write_id, self.view.run or "", self.partition, nonce)
            self.log.claim(self.proof_partition, key.encode(), encode_claims(undecided))
            self._read_until(nonce)
        for i, d, c in wanted:
            result[i] = self.book.won(d, self.partition, c, self.proven[d])
        return result

    def _decided(self, digest: bytes, copy: int) -> bool:
        """This partition already claimed that copy (an earlier attempt of it, or an earlier batch)."""
        return (self.partition, copy) in self.book.order.get(digest, [])

    def _read_until(self, nonce: str) -> None:
        limit = self.log.read_limit_s()
        deadline = time.monotonic() + limit
        while nonce not in self.book.nonces:
            view = ProofView(self.view.scope, self.view.write_id, self.view.run)
            self.position = self.log.read_since(view, self.proof_partition, self.position)
            for claim in view.claims:
                self.book.add(claim)
            if nonce not in self.book.nonces and time.monotonic() >= deadline:
                raise DeliveryError(f"this partition's claim was not found in the proof topic {self.log.topic} within "
                                    f"{limit:.0f} s of being acknowledged")
