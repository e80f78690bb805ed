"""Mutants of the writer's rules that the model (``test_writer_model.py``) must catch: each is a plausible mistake in
the plan, the claims or the release, and the model, run on it for a bounded, fixed set of sequences, must fail with a
violation of its invariants. A mutant that survives means the model no longer looks where the mistake would hurt.

``make mutants`` runs them alone; they are part of ``make unit`` too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
from hypothesis import HealthCheck, Phase, settings

from recoverable_sink.contract import stream_batch_of
from recoverable_sink.driver import proof_place
from recoverable_sink.executor import partition_writer, resume_plan
from recoverable_sink.proof.claims import KafkaClaims
from recoverable_sink.proof.format import ChunkKey, parse_key
from recoverable_sink.proof.view import ProofView
from tests.unit.executor import test_writer_model as model

EXAMPLES = 400  # sequences each mutant gets; the fixed seed makes them the same sequences every run


def _refuses_everything() -> Iterator[None]:
    """A planner that refuses every attempt: nothing is ever lost or repeated, and nothing completes."""
    real = partition_writer.plan

    def refusing(evidence: resume_plan.Evidence) -> resume_plan.Plan:
        found = real(evidence)
        if isinstance(found, resume_plan.Send | resume_plan.SkipIfCommitted):
            return resume_plan.Refuse("mutant", "none")
        return found

    partition_writer.plan = refusing
    try:
        yield
    finally:
        partition_writer.plan = real


def _logged_as_acknowledged() -> Iterator[None]:
    """at_least_once takes every record an earlier attempt logged as delivered, acknowledged or not: what a kill left
    logged but never delivered is skipped by the retry, and lost."""
    real = resume_plan.delivered_by

    def all_logged(e: resume_plan.Evidence, others):  # type: ignore[no-untyped-def]
        return [resume_plan.Take(t.prior, all_logged=True) for t in real(e, others)]

    real_alo = resume_plan._at_least_once

    def alo(e, own_run, others, overdue):  # type: ignore[no-untyped-def]
        found = real_alo(e, own_run, others, overdue)
        return resume_plan.Send(resume=tuple(resume_plan.Take(t.prior, True) for t in found.resume),
                                claim=tuple(resume_plan.Take(t.prior, True) for t in found.claim),
                                unproven=found.unproven, overdue=found.overdue)

    resume_plan.delivered_by, resume_plan._at_least_once = all_logged, alo
    try:
        yield
    finally:
        resume_plan.delivered_by, resume_plan._at_least_once = real, real_alo


def _ignores_claims() -> Iterator[None]:
    """Every partition of a re-run skips any record another run delivered, without claiming the copy: equal records in
    two partitions both skip one delivered copy, and one is lost."""
    real = KafkaClaims.take

    def unclaimed(self: KafkaClaims, digests: list[bytes]) -> list[bool]:
        return [self.proven.get(d, 0) > 0 for d in digests]

    KafkaClaims.take = unclaimed  # type: ignore[method-assign]
    try:
        yield
    finally:
        KafkaClaims.take = real  # type: ignore[method-assign]


def _never_skips_committed() -> Iterator[None]:
    """exactly_once ignores the markers and the committed attempts: a retry of a committed partition sends it again."""
    real = resume_plan._exactly_once

    def resend(e, priors, others, overdue):  # type: ignore[no-untyped-def]
        return resume_plan.Send(overdue=overdue)

    resume_plan._exactly_once = resend
    try:
        yield
    finally:
        resume_plan._exactly_once = real


def _releases_a_live_writes_proof() -> Iterator[None]:
    """The driver releases a wal.writeId write's proof at its commit as if its id were generated: a re-run of the
    committed write (which must send nothing) finds no proof once the topic is compacted."""
    real = proof_place.finish_write

    def as_generated(options, write_id, start, generated, messages, io=None):  # type: ignore[no-untyped-def]
        real(options, write_id, start, True, messages, io)

    proof_place.finish_write = as_generated
    try:
        yield
    finally:
        proof_place.finish_write = real


def _generated_id_unlisted() -> Iterator[None]:
    """A write under a generated id gets no directory entry, at its start nor at its abort: its re-run under that id
    (what its abort advises) reads no proof, and where the WAL released what the proof topic held, sends committed
    partitions again."""
    real, real_refresh = proof_place.start_for, proof_place.refresh_entry

    def not_refreshed(options, write_id, start, io=None):  # type: ignore[no-untyped-def]
        if options.write_id is not None:  # a wal.writeId write's; a generated id's is left unwritten
            real_refresh(options, write_id, start, io)

    def unlisted(options, write_id, generated, io=None):  # type: ignore[no-untyped-def]
        if not generated:
            return real(options, write_id, generated, io)
        found_io = proof_place._io(options, io)
        if found_io is None:
            return None
        partition = proof_place.partition_of(write_id, options.proof.known_partitions)
        return proof_place.ProofStart(partition, {partition: found_io.high_watermark(partition)}, fresh=True)

    proof_place.start_for, proof_place.refresh_entry = unlisted, not_refreshed
    try:
        yield
    finally:
        proof_place.start_for, proof_place.refresh_entry = real, real_refresh


def _releases_released_proof() -> Iterator[None]:
    """A stream's task takes the earlier micro-batches' tombstones for proof to release: each micro-batch tombstones
    again every key the ones before it had, and the proof topic grows with the square of the query's length."""
    real = ProofView.first_pass

    def retombstoning(self: ProofView, offset: int, raw_key: bytes | None, value: bytes | None) -> None:
        real(self, offset, raw_key, value)
        key = parse_key(raw_key)
        if value is None and isinstance(key, ChunkKey) and raw_key is not None and key.scope == self.scope:
            mine, theirs = stream_batch_of(self.write_id), stream_batch_of(key.write_id)
            if mine is not None and theirs is not None and theirs < mine:
                self.older[(key.partition, raw_key)] = None

    ProofView.first_pass = retombstoning  # type: ignore[method-assign]
    try:
        yield
    finally:
        ProofView.first_pass = real  # type: ignore[method-assign]


# Each mutant, and the invariant it must break (words of the model's violation).
MUTANTS: dict[str, tuple[Callable[[], Iterator[None]], tuple[str, ...]]] = {
    "refuses-everything": (_refuses_everything, ("liveness",)),
    "logged-as-acknowledged": (_logged_as_acknowledged, ("lost",)),
    "ignores-claims": (_ignores_claims, ("lost",)),
    "never-skips-committed": (_never_skips_committed, ("repeated", "more often")),
    "releases-a-live-writes-proof": (_releases_a_live_writes_proof, ("repeated", "more often", "liveness")),
    "generated-id-unlisted": (_generated_id_unlisted, ("repeated", "more often", "liveness", "lost")),
    "releases-released-proof": (_releases_released_proof, ("released again",)),
}


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_the_model_catches_the_mutant(name: str) -> None:
    case = model.WriterModel.TestCase
    saved = case.settings
    case.settings = settings(saved, max_examples=EXAMPLES, phases=[Phase.generate], derandomize=True, database=None,
                             suppress_health_check=list(HealthCheck))
    mutant, breaks = MUTANTS[name]
    try:
        with contextmanager(mutant)():
            with pytest.raises(BaseException) as caught:
                case().runTest()
    finally:
        case.settings = saved
    found = [str(v) for v in _violations(caught.value)]
    assert any(word in v for v in found for word in breaks), \
        f"mutant {name} did not break what it should ({' or '.join(breaks)}): {found or repr(caught.value)}"


def _violations(exc: BaseException) -> list[model.Violation]:
    if isinstance(exc, model.Violation):
        return [exc]
    found = []
    for inner in getattr(exc, "exceptions", ()):
        found += _violations(inner)
    if exc.__context__ is not None and exc.__context__ is not exc:
        found += _violations(exc.__context__)
    return found
