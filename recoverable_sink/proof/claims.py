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

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from recoverable_sink.deadlines import MARGIN_S
from recoverable_sink.errors import DeliveryError
from recoverable_sink.identity import DeliveredSet
from recoverable_sink.options import KafkaProof, SinkOptions, short_lived
from recoverable_sink.proof.format import ClaimKey, encode_claims
from recoverable_sink.proof.reader import consumer, partition_ends, read_limit_s, read_range
from recoverable_sink.proof.view import Claim, ProofView


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

    def __init__(self, options: SinkOptions, proof: KafkaProof, view: ProofView, partition: int,
                 proof_partition: int, read_from: int, proven: DeliveredSet) -> None:
        assert view.run is not None, "claims are a run's"
        self.options = options
        self.proof = proof
        self.view = view
        self.partition = partition
        self.proof_partition = proof_partition
        self.position = read_from
        self.proven: Counter[bytes] = proven.acked
        self.seen: Counter[bytes] = Counter()  # this attempt's copies of each record that reached the claims
        self.book = ClaimBook()
        for claim in view.claims:
            self.book.add(claim)
        self._producer: Producer | None = None

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
        undecided = [(i, d, c) for i, d, c in wanted if not self._decided(d, c)]
        if undecided:
            nonce = uuid.uuid4().hex
            self._write(nonce, [(d, c) for _, d, c in undecided])
            self._read_until(nonce)
        for i, d, c in wanted:
            result[i] = self.book.won(d, self.partition, c, self.proven[d])
        return result

    def _decided(self, digest: bytes, copy: int) -> bool:
        """This partition already claimed that copy (an earlier attempt of it, or an earlier batch)."""
        return (self.partition, copy) in self.book.order.get(digest, [])

    def _write(self, nonce: str, copies: list[tuple[bytes, int]]) -> None:
        from recoverable_sink.producer.ledger import delivery_timeout_s

        if self._producer is None:
            conf = short_lived({**self.options.producer_config(), "linger.ms": "0"})
            conf.pop("transactional.id", None)
            self._producer = Producer(conf)
        failed: list[KafkaError] = []
        key = ClaimKey(self.view.scope, self.view.write_id, self.view.run or "", self.partition, nonce).encode()
        self._producer.produce(self.proof.topic, value=encode_claims(copies), key=key,
                               partition=self.proof_partition,
                               on_delivery=lambda err, _m: failed.append(err) if err is not None else None)
        limit = delivery_timeout_s(self.options) + MARGIN_S
        deadline = time.monotonic() + limit
        while len(self._producer) and time.monotonic() < deadline:
            self._producer.flush(min(1.0, max(0.0, deadline - time.monotonic())))
        if failed or len(self._producer):
            self._producer.purge()
            cause = failed[0].str() if failed else f"not acknowledged within {limit:.0f} s"
            raise DeliveryError(f"a claim on delivered records could not be written to the proof topic "
                                f"{self.proof.topic}: {self.options.scrub(cause)}")

    def _read_until(self, nonce: str) -> None:
        limit = read_limit_s(self.options)
        deadline = time.monotonic() + limit
        try:
            with consumer(self.options, committed=False) as c:
                self._read_claims(c, nonce, deadline, limit)
        except (KafkaException, TimeoutError) as exc:
            raise DeliveryError(f"the proof topic {self.proof.topic} could not be read: "
                                f"{self.options.scrub(str(exc))}") from None

    def _read_claims(self, c: Consumer, nonce: str, deadline: float, limit: float) -> None:

        while nonce not in self.book.nonces:
            _low, high = partition_ends(c, TopicPartition(self.proof.topic, self.proof_partition), deadline)
            view = ProofView(self.view.scope, self.view.write_id, self.view.run)
            read_range(c, self.proof.topic, self.proof_partition, self.position, high, deadline, view.first_pass)
            for claim in view.claims:
                self.book.add(claim)
            self.position = max(self.position, high)
            if nonce not in self.book.nonces and time.monotonic() >= deadline:
                raise DeliveryError(f"this partition's claim was not found in the proof topic {self.proof.topic} "
                                    f"within {limit:.0f} s of being acknowledged")

    def close(self) -> None:
        if self._producer is not None:
            self._producer.flush(0)
            self._producer = None
