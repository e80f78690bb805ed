"""The evidence a task's resume plan reads, gathered from this host's WAL, the partition's markers and the proof topic:
what each source contributes, what is left out (the attempt itself, another cluster's attempts, another topic's
markers) and how the two tiers of proof combine into one prior per attempt."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from recoverable_sink.executor.evidence import Gatherer, NoRemoteProof, RemoteAttempt, merge, prior_of
from recoverable_sink.executor.resume_plan import TaskAttempt
from recoverable_sink.producer.marker import Marker
from recoverable_sink.wal.attempt import DONE, LOGGED, OPEN, AttemptInfo

TASK = TaskAttempt(write_id="w", partition=1, run="r2", exactly_once=True, key="w/1/own", seq=9)


def info(key: str, partition: int = 1, run: str = "r1", cluster: str | None = "c1", **kw) -> AttemptInfo:
    return AttemptInfo(key=key, write_id="w", partition=partition, attempt=0, host="h", created=1.0, run=run,
                       cluster_id=cluster, guarantee="exactly_once", **kw)


@dataclass
class Wal:
    attempts: list[AttemptInfo]
    counts: dict[str, int] = field(default_factory=dict)
    latest: int | None = None
    path: str | None = "/wal"

    def write_attempts(self) -> list[AttemptInfo]:
        return list(self.attempts)

    def record_count(self, key: str) -> int:
        return self.counts.get(key, 0)

    def latest_micro_batch(self, query_id: str) -> int | None:
        return self.latest


@dataclass
class Remote:
    found: Sequence[RemoteAttempt] = ()
    kept: dict[int, Marker] = field(default_factory=dict)
    latest: int | None = None
    deleted: bool = False
    topic: str | None = "proof"

    def attempts(self) -> Sequence[RemoteAttempt]:
        return self.found

    def latest_micro_batch(self) -> int | None:
        return self.latest

    def markers(self) -> dict[int, Marker]:
        return self.kept

    def expired(self) -> bool:
        return self.deleted


def marker(partition: int, topic: str | None = "t", batch_write: str = "w") -> Marker:
    return Marker(write_id=batch_write, topic=topic, records=5, attempts=("x",), partition=partition)


def gatherer(wal: Wal, remote: Remote | NoRemoteProof, task: TaskAttempt = TASK, read=None, query: str | None = None):
    calls: list[list[int]] = []

    def markers(partitions: list[int], topic: str | None):
        calls.append(partitions)
        return read(partitions) if read is not None else {p: () for p in partitions}

    return Gatherer(lambda: task, wal, remote, markers, "t", query, cluster_id="c1"), calls


def test_the_wal_gives_every_earlier_attempt_of_this_write_on_this_cluster_but_not_the_attempt_itself():
    wal = Wal([info("w/1/own"), info("w/1/a"), info("w/2/b", partition=2), info("w/1/elsewhere", cluster="c9"),
               info("w/1/old", cluster=None)], counts={"w/1/a": 40, "w/2/b": 30, "w/1/old": 7})
    found = gatherer(wal, NoRemoteProof())[0].local()
    assert {p.name: p.local_records for p in found.priors} == {"a": 40, "b": 0, "old": 7}  # records: this partition's
    assert found.wal == "/wal" and found.proof_topic is None


def test_a_trimmed_attempt_counts_no_local_records():
    assert prior_of(info("w/1/a", trimmed=True), 40).local_records == 0


def test_an_attempt_in_both_tiers_is_one_prior_done_if_either_says_so():
    local = [prior_of(info("w/1/a", state=LOGGED), 40), prior_of(info("w/1/b"), 10)]
    remote = [RemoteAttempt("a", 1, "r1", True, records=40, done=True),
              RemoteAttempt("b", 1, "r1", False, records=6, done=False),
              RemoteAttempt("c", 3, "r0", False, records=12, done=True, micro_batch=4)]
    merged = {p.name: p for p in merge(local, remote)}
    assert (merged["a"].state, merged["a"].in_kafka, merged["a"].records) == (DONE, True, 40)
    assert (merged["b"].state, merged["b"].kafka_records, merged["b"].records) == (OPEN, 6, 10)  # the larger tier
    c = merged["c"]
    assert (c.key, c.state, c.partition, c.run, c.exactly_once, c.micro_batch, c.local_records) == \
        (None, DONE, 3, "r0", False, 4, 0)  # known to the proof topic only: on another host, or its WAL lost


def test_an_attempt_known_only_to_exist_proves_nothing():
    local = [prior_of(info("w/1/a", state=LOGGED), 40)]
    remote = [RemoteAttempt("a", 1, "r1", True, 0, False, task_attempt_id=7, proven=False),
              RemoteAttempt("b", 1, "r1", True, 0, False, task_attempt_id=9, proven=False)]
    merged = {p.name: p for p in merge(local, remote)}
    assert merged["a"] == local[0]  # its WAL entry stands as it is
    b = merged["b"]
    assert (b.state, b.in_kafka, b.proven, b.records, b.task_attempt_id) == (OPEN, False, False, 0, 9)


def test_the_full_evidence_adds_the_proof_topic_and_other_runs_markers_where_an_exactly_once_rerun_needs_them():
    wal = Wal([info("w/2/x", partition=2, run="r1"), info("w/3/y", partition=3, run="r2")])
    remote = Remote(found=[RemoteAttempt("own", 1, "r2", True, 0, False),
                           RemoteAttempt("z", 4, "r1", True, 9, True)],
                    kept={1: marker(1), 4: marker(4), 5: marker(5, topic="u")}, deleted=True)
    g, calls = gatherer(wal, remote, read=lambda ps: {p: (marker(p),) if p == 2 else () for p in ps})
    full = g.full(own_marker=None, marker_batch=None, waited_out=True)
    assert {p.name for p in full.priors} == {"x", "y", "z"}  # not its own proof, read back from Kafka
    assert calls == [[2, 4]]  # other runs' partitions only: run r2's partition 3 is this run's own
    assert set(full.markers) == {2, 4} and full.markers[4] == (marker(4),)  # the proof topic's copy fills the gap
    assert full.own_marker == marker(1)  # the marker group's offsets expired; the proof topic's copy stands in
    assert (full.waited_out, full.proof_expired, full.fail_on_expired, full.proof_topic) == (True, True, True, "proof")


def test_an_at_least_once_attempt_or_a_first_run_reads_no_other_markers():
    wal = Wal([info("w/2/x", partition=2, run="r1")])
    for task in (TaskAttempt("w", 1, "r2", exactly_once=False, key="w/1/own"),
                 TaskAttempt("w", 1, None, exactly_once=True, key="w/1/own")):
        g, calls = gatherer(wal, Remote(), task=task)
        assert g.full(None, None, False).markers == {} and calls == []


def test_another_topics_marker_in_the_proof_topic_is_not_this_partitions():
    g, _ = gatherer(Wal([]), Remote(kept={1: marker(1, topic="u")}))
    assert g.full(None, None, False).own_marker is None
    g, _ = gatherer(Wal([]), Remote(kept={1: marker(1, topic=None)}))  # a marker that names no topic counts
    assert g.full(None, None, False).own_marker == marker(1, topic=None)


def test_the_latest_micro_batch_is_the_latest_any_source_names():
    task = TaskAttempt("q-b000000000003", 1, "r2", exactly_once=True, key="w/1/own", micro_batch=3)
    for here, group, kafka in ((5, 2, 4), (2, 6, 4), (2, 4, 7), (None, None, None)):
        g, _ = gatherer(Wal([], latest=here), Remote(latest=kafka), task=task, query="q")
        expected = max((b for b in (here, group, kafka) if b is not None), default=None)
        assert g.full(None, group, False).later_micro_batch == expected
    assert gatherer(Wal([], latest=5), Remote(), task=task)[0].local().later_micro_batch is None  # not a stream's


def test_a_wait_rereads_the_wal():
    wal = Wal([info("w/1/a")])
    g, _ = gatherer(wal, Remote())
    g.local()
    wal.attempts.append(info("w/1/b"))
    assert {p.name for p in g.full(None, None, False).priors} == {"a"}
    assert {p.name for p in g.full(None, None, False, reread=True).priors} == {"a", "b"}
