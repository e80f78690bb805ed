"""Retention: which attempt logs may go. The sweep of old attempts that hold only proof of delivery, the release
of generated-id writes' proof, and of committed micro-batches' logs; each judges an attempt by its record's rules
(:mod:`.attempt`)."""

from __future__ import annotations

import time
from typing import NamedTuple

from recoverable_sink._logging import get_logger
from recoverable_sink.wal.attempt import DONE, AttemptInfo
from recoverable_sink.wal.store import Wal

log = get_logger("wal")

_SWEEP_EVERY_S = 600.0
_last_sweep: dict[str, float] = {}


class SweepResult(NamedTuple):
    removed: int  # attempts that held only proof of delivery
    kept: int  # old attempts kept: not finished, or holding records Kafka never acknowledged
    trimmed: int = 0  # attempts whose proof went to keep wal.proofMaxBytes


def sweep(wal: Wal, retention_s: float, now: float | None = None, proof_max_bytes: int | None = None) -> SweepResult:
    """Remove attempts older than ``retention_s`` that hold no unacknowledged record (proof of delivery
    only) and are finished, or whose process is known to be gone. One that is not finished while its process
    may still run it is kept (a task can wait longer than the retention for its first batch), and so is one
    holding records Kafka never acknowledged; those are counted and logged. Then, given ``proof_max_bytes``,
    :func:`trim_proof` keeps the proof left under it."""
    now = time.time() if now is None else now
    old = [a for a in wal.attempts() if now - a.created > retention_s]
    trimmed = trim_proof(wal, proof_max_bytes, now) if proof_max_bytes is not None else 0
    if not old:
        return SweepResult(0, 0, trimmed)
    # Not finished: kept while its process may still run it; once that process is gone it is a failed
    # attempt's proof of delivery, kept for the retention like a finished one's.
    unfinished = {a.key for a in old if a.may_be_running()}
    holding = wal.holding_payload([a.key for a in old if a.key not in unfinished])
    kept = [a for a in old if a.key in unfinished or a.key in holding]
    removable = [a for a in old if a.key not in unfinished and a.key not in holding]
    wal.purge([a.key for a in removable])
    wal.drop_claims({a.write_id for a in removable})
    if removable:
        log.info("WAL %s: removed %d finished attempt log(s) older than wal.retentionHours=%g that held only "
                 "proof of delivery", wal.path, len(removable), retention_s / 3600)
    if kept:
        log.warning("WAL %s: %d attempt log(s) older than wal.retentionHours=%g are kept because they are not "
                    "finished (still running, or of a write that failed) or hold records Kafka never "
                    "acknowledged (writes %s): finish a failed write by re-running it with its wal.writeId or "
                    "with `recoverable-kafka-wal replay`, or purge it", wal.path, len(kept), retention_s / 3600,
                    sorted({a.write_id for a in kept}))
    return SweepResult(removed=len(removable), kept=len(kept), trimmed=trimmed)


# A write with an attempt begun or finished this recently on the host may be in the middle of a re-run whose other
# partitions have yet to start and take from its proof: it is not trimmed.
_QUIET_S = 600.0


def trim_proof(wal: Wal, max_bytes: int, now: float | None = None) -> int:
    """Keep done attempts' proof of delivery under ``max_bytes`` (``wal.proofMaxBytes``): past it, the proof of the
    attempts done first goes (:meth:`Wal.trim_proof`), their records stay. Attempts of a write that has an attempt
    here not done (failed, or still running), and those holding records Kafka never acknowledged, are neither
    trimmed nor counted: a re-run of a failed write needs the proof of its successful partitions too. Returns
    attempts trimmed.

    A long ``wal.writeId`` history is what this bounds: its proof (16 bytes a record) would otherwise stay for
    ``wal.retentionHours``. A re-run of a trimmed write can no longer tell what it delivered: under at_least_once
    it sends those partitions again, under exactly_once it goes by the brokers' markers and refuses once they
    expired too."""
    attempts = wal.attempts()
    candidates = trimmable(attempts, time.time() if now is None else now)
    if not candidates:
        return 0
    sizes = wal.proof_bytes([a.key for a in candidates])
    chosen = choose_trims(candidates, sizes, wal.holding_payload([a.key for a in candidates]), max_bytes)
    wal.trim_proof([a.key for a in chosen])
    if chosen:
        log.warning("WAL %s: the proof of delivery of %d finished attempt(s) went to keep wal.proofMaxBytes=%d "
                    "(writes %s): a re-run of these writes sends their partitions again under at_least_once; under "
                    "exactly_once it goes by the markers, or refuses naming the exact recovery. Raise "
                    "wal.proofMaxBytes to keep more history", wal.path, len(chosen), max_bytes,
                    sorted({a.write_id for a in chosen}))
    return len(chosen)


def trimmable(attempts: list[AttemptInfo], now: float | None = None) -> list[AttemptInfo]:
    """The attempts whose proof may go: done, not yet trimmed, of a write whose every attempt here is done and (given
    ``now``) none began or finished in the last 10 minutes. A write with an attempt not done (failed, or still
    running) may be re-run, and that re-run skips by the proof of all of its partitions, the done ones included; a
    write active just now may be in such a re-run, whose later partitions have yet to start."""
    unfinished = {a.write_id for a in attempts if a.state != DONE}
    if now is not None:
        unfinished |= {a.write_id for a in attempts if now - max(a.created, a.done_at or 0, a.ended or 0) < _QUIET_S}
    return [a for a in attempts if not a.trimmed and a.state == DONE and a.write_id not in unfinished]


def choose_trims(candidates: list[AttemptInfo], sizes: dict[str, int], holding: set[str],
                 max_bytes: int) -> list[AttemptInfo]:
    """Of the trimmable attempts (with their proof's ``sizes``), those whose proof goes to keep the total under
    ``max_bytes``: the first done first; one ``holding`` records Kafka never acknowledged neither goes nor counts."""
    total = sum(sizes[a.key] for a in candidates if a.key not in holding)
    chosen = []
    for a in sorted((a for a in candidates if a.key not in holding), key=_finished_at):
        if total <= max_bytes:
            break
        chosen.append(a)
        total -= sizes[a.key]
    return chosen


def _finished_at(attempt: AttemptInfo) -> float:
    return attempt.done_at or attempt.ended or attempt.created


def sweep_now_and_then(wal: Wal, retention_s: float, proof_max_bytes: int | None = None) -> None:
    """Run :func:`sweep` at most every 10 minutes per WAL and process (tasks call this as they start)."""
    now = time.time()
    if now - _last_sweep.get(wal.path, 0.0) < _SWEEP_EVERY_S:
        return
    _last_sweep[wal.path] = now
    sweep(wal, retention_s, now, proof_max_bytes)


_RELEASE_EVERY_S = 30.0
_last_release: dict[str, float] = {}


def release_generated_proof(wal: Wal, grace_s: float, now: float | None = None) -> int:
    """Remove the finished attempts of writes with a generated id once they are done for ``grace_s``
    (``wal.proofGraceSeconds``); at most every 30 s per WAL and process (tasks call this as they start), so that
    the proof of committed writes leaves every executor host within minutes, without the driver reaching it.
    Such a write is never re-run: its proof serves only Spark's re-run of a finished task whose result was lost
    with its executor, which comes within ``spark.network.timeout``. ``wal.writeId`` writes, streams and
    unfinished attempts keep theirs for ``wal.retentionHours``. Returns attempts removed."""
    now = time.time() if now is None else now
    if now - _last_release.get(wal.path, 0.0) < min(_RELEASE_EVERY_S, grace_s):
        return 0
    _last_release[wal.path] = now
    done = [a.key for a in wal.attempts() if a.generated_proof_expired(now, grace_s)]
    if done:
        freed = wal.purge(done)
        log.debug("WAL %s: released the proof of %d finished attempt(s) of generated-id writes (%d payload bytes)",
                  wal.path, len(done), freed)
    return len(done)


def micro_batch_attempts(wal: Wal, query_id: str) -> list[AttemptInfo]:
    """The attempts of every micro-batch of ``query_id`` logged here."""
    return [a for a in wal.attempts(f"{query_id}-b") if a.query_id == query_id]


def release_committed_batches(wal: Wal, query_id: str, batch_id: int,
                              attempts: list[AttemptInfo] | None = None) -> int:
    """Remove the logs of micro-batches of ``query_id`` before ``batch_id``: Spark starts a batch only after
    every earlier one is in the query's commit log, so their proof of delivery is no longer needed (and any
    payload left by a failed attempt was delivered by the attempt that succeeded). ``attempts``: the query's, as
    :func:`micro_batch_attempts` read them (read here when not given). Returns attempts removed."""
    found = micro_batch_attempts(wal, query_id) if attempts is None else attempts
    stale = [a.key for a in found if (batch := a.micro_batch_of(query_id)) is not None and batch < batch_id]
    if stale:
        freed = wal.purge(stale)
        log.debug("WAL %s: released %d attempt log(s) of committed micro-batches of query %s (%d payload bytes)",
                  wal.path, len(stale), query_id, freed)
    return len(stale)
