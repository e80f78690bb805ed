"""Targeted cases of the resume plan (test_writer_model.py drives the real writer through the rest): waits that cannot
deadlock, stand-downs that need no clock, what proof deleted by the retention allows."""

from __future__ import annotations

from dataclasses import replace

from recoverable_sink.executor import resume_plan as rp
from recoverable_sink.identity import Fingerprint
from recoverable_sink.producer.marker import Marker
from recoverable_sink.wal.attempt import DONE, OPEN


def _prior(key: str, partition: int, run: str, *, seq: int, sending: bool = True, tid: int = 0,
           exactly_once: bool = False, state=OPEN, records: int = 0) -> rp.Prior:
    return rp.Prior(name=key, key=f"w/{partition:06d}/{key}", partition=partition, run=run, state=state,
                    exactly_once=exactly_once, task_attempt_id=tid, still_sending=sending, seq=seq,
                    local_records=records)


def _task(partition: int, run: str, seq: int | None, tid: int = 0, exactly_once: bool = False) -> rp.TaskAttempt:
    return rp.TaskAttempt("w", partition, run, exactly_once, task_attempt_id=tid, key=f"w/{partition:06d}/me",
                          seq=seq)


def test_what_an_at_least_once_run_delivered_counts_for_an_exactly_once_rerun_and_the_reverse():
    """A record Kafka holds is delivered whichever mode sent it: an at_least_once run's acknowledged records are
    visible to read_committed readers, so an exactly_once re-run takes them (before, it repeated all of them); an
    exactly_once run's count only once committed."""
    failed_alo = _prior("a", 1, "run-1", seq=1, sending=False)
    plan = rp.plan(rp.Evidence(_task(0, "run-2", seq=2, exactly_once=True), priors=(failed_alo,)))
    assert isinstance(plan, rp.Send) and [(t.prior.key, t.all_logged) for t in plan.claim] == [(failed_alo.key, False)]
    aborted_eo = _prior("b", 1, "run-1", seq=1, sending=False, exactly_once=True)
    committed_eo = _prior("c", 2, "run-1", seq=1, sending=False, exactly_once=True, state=DONE)
    plan = rp.plan(rp.Evidence(_task(0, "run-2", seq=2), priors=(aborted_eo, committed_eo)))
    assert isinstance(plan, rp.Send) and [(t.prior.key, t.all_logged) for t in plan.claim] == [(committed_eo.key, True)]


def test_proof_found_only_in_the_proof_topic_counts_like_proof_in_the_wal():
    """A re-run on a host without the earlier run's WAL: the attempts the proof topic holds are taken as if here."""
    remote = rp.Prior(name="x", partition=3, run="run-1", state=DONE, exactly_once=True, in_kafka=True,
                      kafka_records=5)
    plan = rp.plan(rp.Evidence(_task(0, "run-2", seq=1, exactly_once=True), priors=(remote,)))
    assert isinstance(plan, rp.Send) and [t.prior.name for t in plan.claim] == ["x"]
    trimmed = rp.Prior(name="y", key="w/000003/y", partition=3, run="run-1", state=DONE, exactly_once=True,
                       trimmed=True)
    plan = rp.plan(rp.Evidence(_task(0, "run-2", seq=1, exactly_once=True), priors=(trimmed,), wal="/w",
                               proof_topic="p"))
    assert isinstance(plan, rp.Refuse) and "proof topic p" in plan.reason


def _held(key: str, write: str, *, state=DONE, seq: int, published: bool = False, holding: bool = False,
          generated: bool = False, aged: bool = False, size: int = 10, query: str | None = None,
          batch: int | None = None) -> rp.Held:
    return rp.Held(key=key, write_id=write, partition=0, run="r", state=state, exactly_once=False, seq=seq,
                   published=published, holding=holding, generated=generated, aged=aged, proof_bytes=size,
                   query_id=query, micro_batch=batch)


def test_no_clock_keeps_or_drops_unpublished_proof_and_published_proof_may_go_at_any_age():
    """A host clock stepped by any amount changes nothing a reader sees: it decides only over proof the proof topic
    holds anyway."""
    unpublished = _held("a", "w1", seq=1, aged=True)
    published = _held("b", "w2", seq=2, aged=True, published=True)
    fresh = _held("c", "w3", seq=3, published=True)
    generated = _held("d", "w4", seq=4, published=True, generated=True)
    assert rp.release([unpublished, published, fresh, generated]).purge == ("b", "d")


def test_over_the_budget_published_proof_goes_first_then_the_oldest_begun_and_never_a_failed_writes():
    failed_write = [_held("a", "w1", seq=1), _held("b", "w1", seq=2, state=OPEN)]
    done = [_held("c", "w2", seq=3), _held("d", "w3", seq=4, published=True), _held("e", "w4", seq=5)]
    assert rp.release([*failed_write, *done], proof_max_bytes=15).trim == ("d", "c")
    assert rp.release([*failed_write, *done], proof_max_bytes=100).trim == ()


def test_a_micro_batch_releases_its_querys_earlier_micro_batches_whatever_their_state():
    held = [_held("a", "q-b1", seq=1, query="q", batch=1, state=OPEN, holding=True),
            _held("b", "q-b2", seq=2, query="q", batch=2), _held("c", "p-b1", seq=3, query="p", batch=1)]
    assert rp.release(held, micro_batch=("q", 2)).purge == ("a",)


def test_of_two_runs_attempts_still_sending_only_the_one_begun_later_on_the_host_waits():
    """A zombie of run 1 and run 2's task of the same partition began one after the other on a host: each sees the
    other still sending. Waiting both ways held each for the whole final delivery wait; the one that began first
    goes on."""
    first = _prior("a", 2, "run-1", seq=7)
    second = _prior("b", 2, "run-2", seq=8)
    assert isinstance(rp.plan(rp.Evidence(_task(2, "run-2", seq=8), priors=(first,))), rp.Wait)
    assert isinstance(rp.plan(rp.Evidence(_task(2, "run-1", seq=7, tid=5), priors=(second,))), rp.Send)


def test_an_attempt_finds_a_later_task_attempt_of_its_own_run_and_stands_down_whatever_the_clocks():
    later = _prior("b", 1, "run-1", seq=3, tid=9, sending=False)
    plan = rp.plan(rp.Evidence(_task(1, "run-1", seq=4, tid=2), priors=(later,)))
    assert isinstance(plan, rp.StandDown) and plan.by_retry


def test_an_exactly_once_attempt_resumed_after_a_later_one_committed_and_its_marker_expired_stands_down():
    """A Python worker paused past the brokers' offsets retention: the later attempt (on another host) committed the
    partition, its marker is gone, so opening the transaction finds nothing; the later attempt's chunks in the proof
    topic, committed or not, say it exists (the model found this sending the partition twice)."""
    seen = rp.Prior(name="b", partition=1, run="run-1", state=OPEN, exactly_once=True, task_attempt_id=9)
    plan = rp.plan(rp.Evidence(_task(1, "run-1", seq=4, tid=2, exactly_once=True), priors=(seen,)))
    assert isinstance(plan, rp.StandDown) and plan.by_retry
    earlier = replace(seen, task_attempt_id=1)  # the later attempt finds the earlier one: it is the retry, and sends
    assert isinstance(rp.plan(rp.Evidence(_task(1, "run-1", seq=4, tid=2, exactly_once=True), priors=(earlier,))),
                      rp.Send)


def test_another_runs_proof_counts_whichever_run_began_first():
    done = _prior("a", 3, "run-9", seq=1, sending=False, state=DONE)
    plan = rp.plan(rp.Evidence(_task(0, "run-1", seq=2), priors=(done,)))
    assert isinstance(plan, rp.Send) and [t.prior.key for t in plan.claim] == [done.key]


def test_exactly_once_waits_for_no_other_attempt_its_transactional_id_has_fenced():
    other = _prior("a", 0, "run-1", seq=1, exactly_once=True)
    assert isinstance(rp.plan(rp.Evidence(_task(0, "run-2", seq=None, exactly_once=True), priors=(other,))),
                      rp.Send)


def test_a_zombie_whose_own_commit_lost_its_marker_skips_it_though_another_run_marked_the_partition_since():
    """Run 1 committed partition 0 (done in the WAL); the brokers expired its marker; run 2, one partition, took
    run 1's proof and committed its own marker for partition 0. A zombie task of run 1's partition 0 finds run 2's
    marker: its own run's committed attempt still proves its rows (found by the model test)."""
    from recoverable_sink.producer.marker import Marker

    own = _prior("a", 0, "run-1", seq=1, sending=False, state=DONE, exactly_once=True, records=2)
    newer = _prior("b", 0, "run-2", seq=2, sending=False, state=DONE, exactly_once=True, records=2)
    marker = Marker(write_id="w", topic="t", records=2, attempts=("b",), run="run-2", partition=0)
    plan = rp.plan(rp.Evidence(_task(0, "run-1", seq=None, tid=9, exactly_once=True), priors=(own, newer),
                               own_marker=marker))
    assert isinstance(plan, rp.Send) and all(t.all_logged for t in (*plan.resume, *plan.claim))
    assert [t.prior.key for t in plan.resume] == [own.key] and [t.prior.key for t in plan.claim] == [newer.key]
    assert ([p.key for p in plan.holders], plan.committed_records) == ([newer.key, own.key], 4)


def test_proof_the_retention_deleted_refuses_an_exactly_once_send_unless_told_and_only_warns_at_least_once():
    """Issue 62: a refusal remains only where Kafka no longer holds what is needed, and names it; the option it names
    (proof.failOnExpired=false) then lets the write complete, repeats accepted."""
    earlier = rp.Prior(name="x", partition=3, run="run-1", state=DONE, exactly_once=True, in_kafka=True,
                       kafka_records=5)
    expired = rp.Evidence(_task(0, "run-2", seq=1, exactly_once=True), priors=(earlier,), proof_topic="p",
                          proof_expired=True)
    refused = rp.plan(expired)
    assert isinstance(refused, rp.Refuse)
    assert "retention deleted" in refused.reason and "proof.failOnExpired=false" in refused.message
    assert isinstance(rp.plan(replace(expired, fail_on_expired=False)), rp.Send)
    assert isinstance(rp.plan(replace(expired, task=_task(0, "run-2", seq=1))), rp.Send)  # at_least_once
    assert isinstance(rp.plan(replace(expired, proof_expired=False)), rp.Send)


def test_a_partition_a_marker_names_is_still_skipped_by_fingerprint_when_the_retention_deleted_proof():
    """Skipping a partition whose input is the one committed is exact without any digests, so it stays the plan with
    proof.failOnExpired=false too; a different input is refused naming the retention and a recovery."""
    marker = Marker(write_id="w", partition=0, topic="t", records=4, attempts=("gone",), run="run-1")
    expired = rp.Evidence(_task(0, "run-2", seq=1, exactly_once=True), own_marker=marker, proof_topic="p",
                          proof_expired=True)
    found = rp.plan(expired)
    assert isinstance(found, rp.SkipIfCommitted)
    refusal = rp.judge_skipped(expired.task, marker, Fingerprint(), 3, "/w", expired=True)
    assert refusal is not None and "retention deleted" in refusal.reason
    assert "new wal.writeId" in refusal.message
    assert isinstance(rp.plan(replace(expired, fail_on_expired=False)), rp.SkipIfCommitted)
