"""Targeted cases of the resume plan (the model test, test_resume_plan_model.py, explores the rest): waits that
cannot deadlock, stand-downs that need no clock."""

from __future__ import annotations

from recoverable_sink.executor import resume_plan as rp
from recoverable_sink.wal.attempt import DONE, OPEN


def _prior(key: str, partition: int, run: str, *, seq: int, sending: bool = True, tid: int = 0,
           exactly_once: bool = False, state=OPEN) -> rp.Prior:
    return rp.Prior(key=f"w/{partition:06d}/{key}", partition=partition, run=run, state=state,
                    exactly_once=exactly_once, task_attempt_id=tid, still_sending=sending, seq=seq)


def _task(partition: int, run: str, seq: int | None, tid: int = 0, exactly_once: bool = False) -> rp.TaskAttempt:
    return rp.TaskAttempt("w", partition, run, exactly_once, task_attempt_id=tid, key=f"w/{partition:06d}/me",
                          seq=seq)


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


def test_another_runs_proof_counts_whichever_run_began_first():
    done = _prior("a", 3, "run-9", seq=1, sending=False, state=DONE)
    plan = rp.plan(rp.Evidence(_task(0, "run-1", seq=2), priors=(done,)))
    assert isinstance(plan, rp.Send) and [p.key for p in plan.claim] == [done.key]


def test_exactly_once_waits_for_no_other_attempt_its_transactional_id_has_fenced():
    other = _prior("a", 0, "run-1", seq=1, exactly_once=True)
    assert isinstance(rp.plan(rp.Evidence(_task(0, "run-2", seq=None, exactly_once=True), priors=(other,))),
                      rp.Send)


def test_a_zombie_whose_own_commit_lost_its_marker_skips_it_though_another_run_marked_the_partition_since():
    """Run 1 committed partition 0 (done in the WAL); the brokers expired its marker; run 2, one partition, took
    run 1's proof and committed its own marker for partition 0. A zombie task of run 1's partition 0 finds run 2's
    marker: its own run's committed attempt still proves its rows (found by the model test)."""
    from recoverable_sink.producer.marker import Marker

    own = rp.Prior(key="w/000000/a", partition=0, run="run-1", state=DONE, exactly_once=True, records=2, seq=1)
    newer = rp.Prior(key="w/000000/b", partition=0, run="run-2", state=DONE, exactly_once=True, records=2, seq=2)
    marker = Marker(write_id="w", topic="t", records=2, attempts=("b",), run="run-2", partition=0)
    plan = rp.plan(rp.Evidence(_task(0, "run-1", seq=None, tid=9, exactly_once=True), priors=(own, newer),
                               own_marker=marker))
    assert isinstance(plan, rp.Send) and plan.all_acknowledged
    assert [p.key for p in plan.resume] == [own.key] and [p.key for p in plan.claim] == [newer.key]
    assert ([p.key for p in plan.holders], plan.committed_records) == ([newer.key, own.key], 4)
