"""Two attempts of one partition that overlap on a host (at_least_once): Spark does not wait for a failed task's
Python worker, which goes on sending what its input had buffered while the retry runs, and may even start its
writer after the retry started. Neither order may put a record in Kafka twice."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest

from recoverable_sink.contract import SinkCommitMessage, TaskIdentity
from recoverable_sink.errors import InputCutShortError
from recoverable_sink.executor.task import open_writer
from recoverable_sink.wal import open_wal
from tests.unit.executor.test_writer import PLAN, batches, options, rows
from tests.unit.fakes import FakeProducer, sink_producer


def _ident(task_attempt_id: int, attempt: int) -> TaskIdentity:
    return TaskIdentity("w", 0, attempt, task_attempt_id=task_attempt_id, run="r1")


def test_an_attempt_whose_writer_starts_after_its_retry_stands_down_without_sending(wal_dir):
    opts = options(wal_dir)
    retry = open_writer(opts, PLAN, _ident(7, 1), "c1", producer=sink_producer(FakeProducer()))
    late = FakeProducer()
    with pytest.raises(InputCutShortError, match="later attempt"):
        open_writer(opts, PLAN, _ident(3, 0), "c1", producer=sink_producer(late))
    assert late.delivered == [] and [a.attempt for a in open_wal(wal_dir).attempts("w/")] == [1]
    for b in batches(rows(300)):
        retry.write(b)
    assert retry.commit().published == 300


def test_a_retry_waits_for_an_earlier_attempt_still_sending_then_skips_what_kafka_acknowledged_to_it(wal_dir, caplog):
    opts = options(wal_dir, **{"kafka.delivery.timeout.ms": "10000"})  # a retry waits up to about twice this
    data = rows(500)
    earlier = open_writer(opts, PLAN, _ident(3, 0), "c1", producer=sink_producer(FakeProducer()))
    for b in batches(data[:200]):
        earlier.write(b)
    done: list[SinkCommitMessage] = []

    def retry() -> None:
        writer = open_writer(opts, PLAN, _ident(7, 1), "c1", producer=sink_producer(FakeProducer()))
        for b in batches(data):
            writer.write(b)
        done.append(writer.commit())

    thread = threading.Thread(target=retry)
    thread.start()
    thread.join(0.5)
    assert thread.is_alive() and not done  # waiting, while the earlier attempt goes on sending
    assert "waiting for 1 earlier attempt(s)" in caplog.text
    for b in batches(data[200:400]):
        earlier.write(b)
    earlier.abort()  # its input cut short: 300 produced and acknowledged, the last 100 only logged
    thread.join(30)
    [message] = done
    assert (message.skipped, message.published, message.replayed) == (300, 200, 100)


_BEGIN_AND_DIE = """
import os, sys
from recoverable_sink.contract import TaskIdentity
from recoverable_sink.executor.task import open_writer
from tests.unit.fakes import FakeProducer, sink_producer
from tests.unit.executor.test_writer import PLAN, options
open_writer(options(sys.argv[1]), PLAN, TaskIdentity("w", 0, 1, task_attempt_id=7, run=sys.argv[2]),
            "c1", producer=sink_producer(FakeProducer()))
os._exit(0)  # gone without an abort, as a worker Spark killed
"""


@pytest.mark.parametrize("run_of_the_later", ["r1", "r0"])
def test_a_late_attempt_stands_down_for_a_later_one_of_its_run_even_once_that_ones_process_is_gone(
        wal_dir, run_of_the_later):
    """Spark kills a failed job's workers: the later attempt's process may be gone by the time a stale earlier one
    starts its writer. Within one run the task attempt ids still order them; across runs (a new application
    numbers its attempts from 0 again) a dead process's larger id says nothing, and the attempt goes on."""
    subprocess.run([sys.executable, "-c", _BEGIN_AND_DIE, str(wal_dir), run_of_the_later], check=True,
                   cwd=Path(__file__).resolve().parents[3])
    late = FakeProducer()
    stale = TaskIdentity("w", 0, 0, task_attempt_id=3, run="r1")
    if run_of_the_later == "r1":
        with pytest.raises(InputCutShortError, match="later attempt"):
            open_writer(options(wal_dir), PLAN, stale, "c1", producer=sink_producer(late))
        assert late.delivered == []
    else:
        writer = open_writer(options(wal_dir), PLAN, stale, "c1", producer=sink_producer(late))
        for b in batches(rows(100)):
            writer.write(b)
        assert writer.commit().published == 100


def test_a_new_application_rerunning_the_write_goes_on_beside_an_old_runs_live_worker(wal_dir):
    """Task attempt ids start again in a new application: an old run's finished attempt with a larger id, whose
    (reused) worker still lives, neither makes the new run's attempt stand down nor keeps it waiting."""
    opts = options(wal_dir)
    old = open_writer(opts, PLAN, TaskIdentity("w", 0, 0, task_attempt_id=5000, run="old"), "c1",
                      producer=sink_producer(FakeProducer()))
    for b in batches(rows(300)):
        old.write(b)
    old.commit()
    again = FakeProducer()
    writer = open_writer(opts, PLAN, TaskIdentity("w", 0, 0, task_attempt_id=10, run="new"), "c1",
                         producer=sink_producer(again))
    for b in batches(rows(300)):
        writer.write(b)
    assert (writer.commit().skipped, again.delivered) == (300, [])


def test_an_attempt_whose_entry_was_purged_fails_before_sending_anything(wal_dir):
    """A release may purge an attempt's entry between its begin and its look at the others: it sends nothing."""
    from recoverable_sink.errors import WalError
    from recoverable_sink.executor.attempt_log import AttemptLog

    opts = options(wal_dir)
    zombie = AttemptLog.open(opts, _ident(3, 0))
    zombie.begin(_ident(3, 0), {"kind": "batch"})
    open_wal(wal_dir).purge([zombie.key])
    with pytest.raises(WalError, match="no longer in the log"):
        zombie.write_attempts()
