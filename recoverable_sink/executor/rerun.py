"""Re-runs judged by content (executor): what earlier runs of a write delivered, across all of its partitions.

A re-run with the same ``wal.writeId`` (or a micro-batch re-run by a restarted query) may split the same rows into
other partitions than the run that failed: another cluster size, ``spark.sql.shuffle.partitions``, AQE. So a
re-run's partition is not judged by what the earlier run's partition of the same number held, but against the
proof of delivery of every partition of the earlier runs on this host. Partitions of one run take from that proof
under claims kept in the WAL (:meth:`Wal.claim`): one acknowledged copy of a record is counted by one partition
only, whichever of them runs first, and a retry of a partition takes its own claims again.

Runs are told apart by the ``run`` in an attempt's identity (one driver-side writer), never ordered: which
attempts a task takes from is the resume plan's (:mod:`recoverable_sink.executor.resume_plan`); this module
carries out its claims.
"""

from __future__ import annotations

from collections import Counter

from recoverable_sink.contract import TaskIdentity
from recoverable_sink.errors import StaleAttemptError
from recoverable_sink.executor.resume_plan import TaskAttempt, stand_down_for_micro_batch
from recoverable_sink.identity import DeliveredSet
from recoverable_sink.wal import Wal, release_committed_batches
from recoverable_sink.wal.retention import micro_batch_attempts


class NoEarlierRuns:
    """Not a re-run (or no log of an earlier run on this host): nothing to take."""

    records = 0

    def __bool__(self) -> bool:
        return False

    def take(self, digests: list[bytes]) -> list[bool]:
        return [False] * len(digests)


class EarlierRuns:
    """The earlier runs' proof of delivery on this host (record digest -> acknowledged copies), taken batch by batch
    under claims in the WAL."""

    def __init__(self, wal: Wal, ident: TaskIdentity, proven: DeliveredSet) -> None:
        self.wal = wal
        self.write_id = ident.write_id
        assert ident.run is not None, "claims are a run's"
        self.run = ident.run
        self.partition = ident.partition
        self.proven: Counter[bytes] = proven.acked
        self.taken: Counter[bytes] = Counter()

    def __bool__(self) -> bool:
        return bool(self.proven)

    @property
    def records(self) -> int:
        """Acknowledged records the earlier runs proved, in all partitions."""
        return sum(self.proven.values())

    def take(self, digests: list[bytes]) -> list[bool]:
        """Per record: already delivered by an earlier run (and now counted by this partition)."""
        if not any(d in self.proven for d in digests):
            return [False] * len(digests)
        return self.wal.claim(self.write_id, self.run, self.partition, digests, self.proven, self.taken)


def settle_micro_batches(wal: Wal, ident: TaskIdentity) -> None:
    """For a micro-batch's task, in one read of the query's attempts on this host: stand down
    (:class:`StaleAttemptError`) if a later micro-batch of the query began here, else release the earlier ones'
    logs. Spark starts batch N+1 only once batch N is in the query's commit log, so a task of batch N that finds
    one is a zombie's (a driver that the query moved past), and whatever it sent would repeat records."""
    query_id, batch = ident.query_id, ident.batch_id
    if ident.kind != "stream" or query_id is None or batch is None:
        return
    attempts = micro_batch_attempts(wal, query_id)
    task = TaskAttempt(write_id=ident.write_id, partition=ident.partition, run=None, exactly_once=False,
                       micro_batch=batch)
    later = max((b for a in attempts if (b := a.micro_batch_of(query_id)) is not None), default=None)
    zombie = stand_down_for_micro_batch(task, later, "this host's WAL")
    if zombie is not None:
        raise StaleAttemptError(zombie.reason)
    release_committed_batches(wal, query_id, batch, attempts)
