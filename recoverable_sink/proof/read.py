"""Reading one write's proof (pure over its reads): the two passes :mod:`.view` describes, over the primitives of
:class:`Reads` (:class:`recoverable_sink.proof.io.KafkaIO` on the brokers, the writer's model on a scripted one).

The second pass needs the partition's last stable offset past the point where this run's own records begin: every
transaction below it has then ended, committed or aborted. A transaction left open below it by a dead attempt of
another run of the write (a killed task, a lost executor) would hold the read until the brokers time it out
(``kafka.transaction.timeout.ms``, 15 minutes), and with it every partition of the re-run. Its records name the
write's scope and partition, so its transactional id is known: after a few seconds (that partition's own task of this
run may fence it first, as it starts) the reader fences it, as that task would (``init_transactions`` aborts it, or
completes a commit already under way). A transaction of another scope (another write sharing the proof partition)
is only waited for, up to the read's deadline.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

from recoverable_sink.errors import DeliveryError
from recoverable_sink.proof.format import ChunkKey, MarkerKey, parse_key
from recoverable_sink.proof.view import ProofView

Feed = Callable[[int, bytes | None, bytes | None], None]


class Reads(Protocol):
    """What reading the proof topic takes."""

    topic: str

    def ends(self, partition: int) -> tuple[int, int]:
        """The partition's first offset and its end (the high watermark)."""
        ...

    def stable(self, partition: int) -> int:
        """The partition's last stable offset."""
        ...

    def read(self, partition: int, start: int, end: int, committed: bool, feed: Feed) -> None:
        """Feed the records of [start, end) to ``feed``: every record, or (``committed``) those of committed
        transactions and none of an open one."""
        ...

    def key_at(self, partition: int, offset: int) -> bytes | None:
        """The key of the record at ``offset`` (None: none there)."""
        ...

    def fence(self, transactional_id: str) -> None:
        """Fence that transactional id's producer: its open transaction is aborted, or a commit under way completes."""
        ...

    def read_limit_s(self) -> float: ...


def read_view(reads: Reads, view: ProofView, starts: dict[int, int], transactional_id: Callable[[str, int], str],
              sleep: Callable[[float], None] = time.sleep) -> ProofView:
    """Fill ``view`` from ``starts`` (proof partition -> first offset) to the topic's end now. ``transactional_id(scope,
    partition)`` names a partition's transactional id (for fencing a dead attempt's open transaction)."""
    limit = reads.read_limit_s()
    deadline = time.monotonic() + limit
    ends: dict[int, int] = {}
    froms: dict[int, int | None] = {}
    committed: list[int] = []
    for partition, start in sorted(starts.items()):
        low, high = reads.ends(partition)
        if low > start:
            view.truncated = True  # retention deleted what the write's proof was to start with
        ends[partition] = high
        view.own_run_from, view.needs_committed = None, False
        reads.read(partition, max(start, low), high, False, view.first_pass)
        froms[partition] = view.own_run_from
        if view.needs_committed:
            committed.append(partition)
    view.own_runs_from = froms
    for partition in committed:
        found = froms[partition]
        until = ends[partition] if found is None else found
        _stable_to(reads, view, partition, until, transactional_id, deadline, limit, sleep)
        reads.read(partition, starts[partition], until, True, view.second_pass)
    return view


# How long a reader waits for an open transaction below its point to end by itself before it fences it: that
# partition's own task of this run fences it as it starts (their transactional ids are one), and a fence by a reader
# fails that task if it has already started.
FENCE_AFTER_S = 5.0


def _stable_to(reads: Reads, view: ProofView, partition: int, until: int,
               transactional_id: Callable[[str, int], str], deadline: float, limit: float,
               sleep: Callable[[float], None]) -> None:
    fenced: set[str] = set()
    fence_from = time.monotonic() + min(FENCE_AFTER_S, limit / 4)
    while True:
        stable = reads.stable(partition)
        if stable >= until:
            return
        key = parse_key(reads.key_at(partition, stable)) if time.monotonic() >= fence_from else None
        if isinstance(key, ChunkKey | MarkerKey) and key.scope == view.scope:
            txn = transactional_id(key.scope, key.partition)
            if txn not in fenced:  # below this run's own records: another run's, and its attempt is gone or a zombie
                fenced.add(txn)
                reads.fence(txn)
                continue
        if time.monotonic() >= deadline:
            raise DeliveryError(
                f"partition {partition} of the proof topic {reads.topic} has a transaction open below offset {until} "
                f"for over {limit:.0f} s (its last stable offset is {stable}), so which earlier transactions committed "
                "cannot be read yet; it ends within its kafka.transaction.timeout.ms, or abort it with "
                "`recoverable-kafka-wal transactions --prefix <transactional.id.prefix> --abort`. Spark retries the "
                "task")
        sleep(0.05)
