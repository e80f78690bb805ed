"""Retention as tasks start (executor): which attempt logs leave this host's WAL, decided by
:func:`recoverable_sink.executor.resume_plan.release` and carried out here.

A stream's task releases its query's earlier micro-batches every time (a prefix scan of the query's attempts); the
whole WAL is swept at most every 10 minutes per WAL and process (a scan of every attempt). What an attempt is to
the rules (:class:`~recoverable_sink.executor.resume_plan.Held`) is read from its WAL record and segments; the host's
clock only says which published proof is older than ``wal.retentionHours``, which the proof topic holds anyway.
"""

from __future__ import annotations

import time
from typing import NamedTuple

from recoverable_sink._logging import get_logger
from recoverable_sink.executor.resume_plan import Held, Release, release
from recoverable_sink.wal import attempt as wal_attempt
from recoverable_sink.wal.attempt import AttemptInfo
from recoverable_sink.wal.store import Wal

log = get_logger("wal")

_SWEEP_EVERY_S = 600.0
_last_sweep: dict[str, float] = {}


class SweepResult(NamedTuple):
    removed: int  # attempts removed whole
    kept: int  # old attempts kept: not finished, or holding records Kafka never acknowledged
    trimmed: int = 0  # attempts whose proof went to keep wal.proofMaxBytes


def held(wal: Wal, attempts: list[AttemptInfo], retention_s: float | None = None, now: float | None = None,
         sizes: bool = True) -> list[Held]:
    """The attempts as the release rules see them (``sizes``: with their proof's bytes, one more read)."""
    keys = [a.key for a in attempts]
    holding = wal.holding_payload(keys)
    proof = wal.proof_bytes(keys) if sizes else {}
    now = wal_attempt.host.now() if now is None else now
    return [Held(key=a.key, write_id=a.write_id, partition=a.partition, run=a.run, state=a.state,
                 exactly_once=a.exactly_once, generated=a.generated, seq=a.seq, trimmed=a.trimmed,
                 holding=a.key in holding, published=a.published, may_be_running=a.may_be_running(),
                 query_id=a.query_id, micro_batch=a.batch_id, proof_bytes=proof.get(a.key, 0),
                 aged=retention_s is not None and now - a.created > retention_s)
            for a in attempts]


def apply(wal: Wal, decided: Release) -> None:
    """Carry a release out: purges in one transaction, then trims in another."""
    if decided.purge:
        wal.purge(list(decided.purge))
    if decided.trim:
        wal.trim_proof(list(decided.trim))


def sweep(wal: Wal, retention_s: float, now: float | None = None, proof_max_bytes: int | None = None) -> SweepResult:
    """Release what the rules allow of the whole WAL (:func:`~recoverable_sink.executor.resume_plan.release`), and log
    what goes and what is kept."""
    attempts = wal.attempts()
    decided = release(held(wal, attempts, retention_s, now, sizes=proof_max_bytes is not None),
                      proof_max_bytes=proof_max_bytes)
    apply(wal, decided)
    gone = {a.write_id for a in attempts if a.key in set(decided.purge)}
    wal.drop_claims(gone)
    if decided.purge:
        log.info("WAL %s: removed %d attempt log(s) whose proof of delivery the proof topic holds", wal.path,
                 len(decided.purge))
    if decided.trim:
        log.warning("WAL %s: the proof of delivery of %d finished attempt(s) went to keep wal.proofMaxBytes=%d; what "
                    "the proof topic holds of them still counts (without it, proof.kafka=false, a re-run of their "
                    "writes sends those partitions again under at_least_once, and under exactly_once goes by the "
                    "markers or refuses naming the exact recovery)", wal.path, len(decided.trim), proof_max_bytes)
    if decided.kept:
        by_key = {a.key: a for a in attempts}
        log.warning("WAL %s: %d attempt log(s) older than wal.retentionHours=%g are kept because they are not finished "
                    "(still running, or of a write that failed) or hold records Kafka never acknowledged (writes %s): "
                    "finish a failed write by re-running it with its wal.writeId or with `recoverable-kafka-wal "
                    "replay`, or purge it", wal.path, len(decided.kept), retention_s / 3600,
                    sorted({by_key[k].write_id for k in decided.kept}))
    return SweepResult(removed=len(decided.purge), kept=len(decided.kept), trimmed=len(decided.trim))


def as_task_starts(wal: Wal, retention_s: float, proof_max_bytes: int, micro_batch: tuple[str, int] | None) -> None:
    """What a task runs as it opens its log: a micro-batch's task releases its query's earlier micro-batches; the
    whole WAL is swept at most every 10 minutes per WAL and process."""
    if micro_batch is not None:
        query, batch = micro_batch
        mine = [a for a in wal.attempts(f"{query}-b") if a.query_id == query]
        decided = release(held(wal, mine, sizes=False), micro_batch=micro_batch)
        if decided.purge:
            wal.purge(list(decided.purge))
            log.debug("WAL %s: released %d attempt log(s) of committed micro-batches of query %s", wal.path,
                      len(decided.purge), query)
    now = time.monotonic()
    if now - _last_sweep.get(wal.path, -_SWEEP_EVERY_S) < _SWEEP_EVERY_S:
        return
    _last_sweep[wal.path] = now
    sweep(wal, retention_s, proof_max_bytes=proof_max_bytes)
