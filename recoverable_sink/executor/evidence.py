"""The evidence (executor): everything the resume plan reads about earlier attempts of a write, gathered in one place
from this host's WAL, the partition's markers and the proof topic in Kafka.

Gathered in two steps, for one reason: a stream's task that a later micro-batch of its query already passed on this host
must stand down before its transactional producer fences the query's current one. So :meth:`Gatherer.local` reads the
host's WAL alone (called before the delivery mode opens), :meth:`Gatherer.full` adds what opening the mode found (the
partition's marker), the other partitions' markers and the proof topic. An attempt found both here and in Kafka is one
:class:`~recoverable_sink.executor.resume_plan.Prior`, its proof the union of both.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from recoverable_sink.executor.resume_plan import Evidence, Prior, TaskAttempt, attempt_name
from recoverable_sink.producer.marker import Marker
from recoverable_sink.wal.attempt import DONE, OPEN, AttemptInfo, AttemptState


@dataclass(frozen=True)
class RemoteAttempt:
    """What the proof topic holds of one attempt of a write: its identity, how many digests it proves, and whether it
    finished (at_least_once: its last checkpoint came after everything was acknowledged; exactly_once: found at all,
    since its proof is committed with its transaction)."""

    name: str
    partition: int
    run: str | None
    exactly_once: bool
    records: int
    done: bool
    task_attempt_id: int | None = None
    micro_batch: int | None = None
    proven: bool = True  # False: an exactly_once attempt of this task seen only uncommitted, known to exist, no proof


class RemoteProof(Protocol):
    """The proof topic as the evidence sees it (:class:`recoverable_sink.executor.proof.KafkaProof`, or nothing)."""

    topic: str | None

    def attempts(self) -> Sequence[RemoteAttempt]:
        """Every attempt of this task's write that the proof topic holds."""
        ...

    def latest_micro_batch(self) -> int | None:
        """The latest micro-batch of this task's query the proof topic names (None for a batch write's)."""
        ...

    def markers(self) -> dict[int, Marker]:
        """This write's committed markers the proof topic holds, by partition (exactly_once)."""
        ...

    def expired(self) -> bool:
        """Whether the topic's retention deleted part of where this write's proof starts."""
        ...


class LocalAttempts(Protocol):
    """This host's WAL as the evidence sees it (:class:`recoverable_sink.executor.attempt_log.AttemptLog`)."""

    path: str | None

    def write_attempts(self) -> list[AttemptInfo]:
        """Every attempt of this task's write in the WAL (any partition), this one included."""
        ...

    def record_count(self, key: str) -> int:
        """How many records an attempt logged (digests it holds)."""
        ...

    def latest_micro_batch(self, query_id: str) -> int | None:
        """The latest micro-batch of ``query_id`` begun on this host."""
        ...


def prior_of(a: AttemptInfo, records: int) -> Prior:
    """An attempt found in this host's WAL."""
    return Prior(name=attempt_name(a.key), partition=a.partition, run=a.run, state=a.state,
                 exactly_once=a.exactly_once, task_attempt_id=a.task_attempt_id, seq=a.seq, key=a.key,
                 still_sending=a.still_sending(), trimmed=a.trimmed, local_records=0 if a.trimmed else records,
                 micro_batch=a.batch_id)


def merge(local: Sequence[Prior], remote: Sequence[RemoteAttempt]) -> tuple[Prior, ...]:
    """This host's priors with what the proof topic holds of them, and the attempts only the proof topic knows."""
    by_name = {p.name: p for p in local}
    merged = dict(by_name)
    for r in remote:
        found = by_name.get(r.name)
        if found is None:
            merged[r.name] = Prior(name=r.name, partition=r.partition, run=r.run,
                                   state=DONE if r.done else OPEN, exactly_once=r.exactly_once,
                                   task_attempt_id=r.task_attempt_id, in_kafka=r.proven,
                                   kafka_records=r.records if r.proven else 0, micro_batch=r.micro_batch)
        elif r.proven:
            state: AttemptState = DONE if r.done else found.state
            merged[r.name] = replace(found, in_kafka=True, kafka_records=r.records, state=state)
    return tuple(merged.values())


class Gatherer:
    """Gathers one task attempt's evidence (see the module's docstring). ``task`` gives the attempt as it now is (its
    WAL key and sequence once begun); ``markers`` reads other partitions' markers (exactly_once re-runs only);
    ``cluster_id`` is the cluster the attempt writes to (the WAL's attempts of another cluster are no evidence)."""

    def __init__(self, task: Callable[[], TaskAttempt], log: LocalAttempts, remote: RemoteProof,
                 markers: Callable[[list[int], str | None], Mapping[int, tuple[Marker, ...]]],
                 topic: str | None, query_id: str | None, cluster_id: str | None = None,
                 fail_on_expired: bool = True) -> None:
        self._task = task
        self.fail_on_expired = fail_on_expired
        self.cluster_id = cluster_id
        self.log = log
        self.remote = remote
        self._markers = markers
        self.topic = topic
        self.query_id = query_id
        self._local: tuple[Prior, ...] | None = None

    def local(self) -> Evidence:
        """What this host's WAL holds: its attempts of the write and the latest micro-batch of the query here."""
        task = self._task()
        # An attempt of this write aimed at another cluster (a run sent there by mistake) delivered nothing here.
        found = [a for a in self.log.write_attempts() if a.cluster_id in (None, self.cluster_id)
                 or self.cluster_id is None]
        self._local = tuple(prior_of(a, self.log.record_count(a.key) if a.partition == task.partition else 0)
                            for a in found if a.key != task.key)
        later = self.log.latest_micro_batch(self.query_id) if self.query_id is not None else None
        return Evidence(task=task, priors=self._local, later_micro_batch=later, wal=self.log.path,
                        proof_topic=self.remote.topic)

    def full(self, own_marker: Marker | None, marker_batch: int | None, waited_out: bool,
             reread: bool = False) -> Evidence:
        """Everything: the WAL (read again when ``reread``, after a wait), the partition's marker as opening the mode
        found it, the markers of the other partitions that other runs wrote, and the proof topic."""
        if reread or self._local is None:
            self.local()
        assert self._local is not None
        task = self._task()
        priors = merge(self._local, [r for r in self.remote.attempts() if r.name != task.name])
        others = sorted({p.partition for p in priors if p.run != task.run and p.partition != task.partition})
        # The proof topic's copies, which outlive the marker groups' offsets (for this topic only, as the groups').
        kept = {p: m for p, m in self.remote.markers().items() if self.topic is None or (m.topic or self.topic) ==
                self.topic}
        own_marker = own_marker or kept.get(task.partition)
        markers: dict[int, tuple[Marker, ...]] = {}
        if task.exactly_once and task.run is not None and others:
            markers = {p: tuple(ms) for p, ms in self._markers(others, self.topic).items()}
            for p in others:
                if p in kept and not markers.get(p):
                    markers[p] = (kept[p],)
        here = self.log.latest_micro_batch(self.query_id) if self.query_id is not None else None
        later = max((b for b in (here, marker_batch, self.remote.latest_micro_batch()) if b is not None),
                    default=None)
        return Evidence(task=task, priors=priors, own_marker=own_marker, markers=markers, later_micro_batch=later,
                        waited_out=waited_out, wal=self.log.path, proof_topic=self.remote.topic,
                        proof_expired=self.remote.expired(), fail_on_expired=self.fail_on_expired)


class NoRemoteProof:
    """No proof topic (``proof.kafka=false``, or a writer driven outside Spark): nothing is known beyond the WAL."""

    topic: str | None = None

    def attempts(self) -> Sequence[RemoteAttempt]:
        return ()

    def latest_micro_batch(self) -> int | None:
        return None

    def markers(self) -> dict[int, Marker]:
        return {}

    def expired(self) -> bool:
        return False
