"""The resume plan (executor, pure): what one task attempt may send, decided in one place.

Every rule of the re-run machinery lives here: which earlier attempts of the write this attempt skips by (its own
partition's, record by record; earlier runs', any partition, under the run's claims), when it waits for one still
sending, when it stands down as a zombie, when an ``exactly_once`` attempt skips a partition that a committed
transaction already holds, and when it refuses before anything is sent, naming the recovery that is exact. The
writers gather the evidence (the host's WAL, the markers in Kafka) and carry the plan out; nothing here touches
Spark, Kafka or LMDB, so ``tests/unit/executor/test_resume_plan_model.py`` checks it against a model of what a
``read_committed`` reader sees.

No rule orders runs by a clock. A run id only tells runs apart: every other run's proof of delivery counts, whether
that run began before or after this one, since a record Kafka holds is delivered whoever sent it. A task of a run
that another run overtook (a zombie) therefore takes the newer run's proof like any re-run and sends only what
Kafka lacks; what tells it apart is what Kafka and the WAL hold, never a timestamp: a later micro-batch of its
query, or a later task attempt of its own run (Spark numbers those in order).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from recoverable_sink.identity import Fingerprint
from recoverable_sink.producer.marker import Marker
from recoverable_sink.wal.attempt import DONE, AttemptInfo, AttemptState


def attempt_name(attempt_key: str) -> str:
    """An attempt key without its write id and partition (unique on its own: time, attempt and a random part);
    markers name attempts so."""
    return attempt_key.rsplit("/", 1)[-1]


# ---- the evidence ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TaskAttempt:
    """The attempt being planned. ``run`` is None for a writer driven outside a Spark task (no runs, no order);
    ``task_attempt_id`` is Spark's (ordered within one run); ``micro_batch`` a stream's batch id."""

    write_id: str
    partition: int
    run: str | None
    exactly_once: bool
    task_attempt_id: int | None = None
    micro_batch: int | None = None
    key: str | None = None  # its own WAL attempt key, once begun
    seq: int | None = None  # the order it began in on this host (the WAL's), once begun

    @property
    def where(self) -> str:
        return f"partition {self.partition} of write {self.write_id}"


@dataclass(frozen=True)
class Prior:
    """An earlier attempt of the write found in this host's WAL (any partition, any run)."""

    key: str
    partition: int
    run: str | None
    state: AttemptState
    exactly_once: bool
    task_attempt_id: int | None = None
    still_sending: bool = False  # its process runs here and it neither finished nor ended
    trimmed: bool = False  # its digests went to keep wal.proofMaxBytes: what it delivered is unknown here
    records: int = 0  # the digests it holds (every record it logged)
    seq: int | None = None  # the order it began in on this host (None: recorded before sequence numbers)

    @property
    def name(self) -> str:
        return attempt_name(self.key)

    @classmethod
    def of(cls, attempt: AttemptInfo, records: int = 0) -> Prior:
        return cls(key=attempt.key, partition=attempt.partition, run=attempt.run, state=attempt.state,
                   exactly_once=attempt.exactly_once, task_attempt_id=attempt.task_attempt_id,
                   still_sending=attempt.still_sending(), trimmed=attempt.trimmed, records=records, seq=attempt.seq)


@dataclass(frozen=True)
class Evidence:
    """Everything the plan reads. ``own_marker``: this write's committed marker of this partition (exactly_once);
    ``markers``: the markers of the other partitions the priors wrote; ``later_micro_batch``: the latest micro-batch
    of the query seen on this host or in the marker group; ``waited_out``: the wait for attempts still sending
    reached its deadline."""

    task: TaskAttempt
    priors: tuple[Prior, ...] = ()
    own_marker: Marker | None = None
    markers: Mapping[int, tuple[Marker, ...]] = field(default_factory=dict)
    later_micro_batch: int | None = None
    waited_out: bool = False
    wal: str | None = None  # where the priors were read (for messages)


# ---- the plans ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class StandDown:
    """Send nothing and fail: this attempt is superseded (``by_retry``: Spark already started a later attempt of
    this task, so this one's JVM side is gone; else a zombie of a micro-batch the query moved past)."""

    reason: str
    by_retry: bool = False


@dataclass(frozen=True)
class Wait:
    """Attempts of the write still send from live processes on this host: wait for them to end with their
    acknowledgements saved, then plan again (with ``waited_out`` once the deadline passed)."""

    attempts: tuple[str, ...]


@dataclass(frozen=True)
class Refuse:
    """Send nothing and fail: no exact completion is possible from here. ``recovery`` is one that is."""

    reason: str
    recovery: str

    @property
    def message(self) -> str:
        return f"{self.reason}. Nothing of this partition was sent. {self.recovery}"


@dataclass(frozen=True)
class Send:
    """Send the input less what is proven delivered: ``resume`` (this partition's earlier attempts; every record
    they logged counts when ``all_acknowledged``, else only what Kafka acknowledged) is skipped record by record;
    ``claim`` (attempts of other runs, any partition) is taken under the run's claims, so no two partitions of the
    run count one delivered copy. exactly_once: ``holders`` are the attempts whose committed transactions hold
    records of this partition (the new marker names them), holding ``committed_records``. ``unproven``: attempts
    whose proof is gone (their records are sent again, at_least_once only); ``overdue``: attempts still sending when
    the wait ran out."""

    resume: tuple[Prior, ...] = ()
    all_acknowledged: bool = False
    claim: tuple[Prior, ...] = ()
    holders: tuple[Prior, ...] = ()
    committed_records: int = 0
    unproven: tuple[Prior, ...] = ()
    overdue: tuple[str, ...] = ()


@dataclass(frozen=True)
class SkipIfCommitted:
    """exactly_once: a committed transaction holds this partition and this host cannot say record by record what it
    holds. Send nothing; at the end the input must be the one committed (:func:`judge_skipped`)."""

    marker: Marker
    reason: str


Plan = StandDown | Wait | Refuse | Send | SkipIfCommitted


# ---- the rules ------------------------------------------------------------------------------------------------
def stand_down_for_micro_batch(task: TaskAttempt, later: int | None, seen: str) -> StandDown | None:
    """A micro-batch's task that finds a later micro-batch of its query (``seen``: where) is a zombie's: Spark starts
    batch N+1 only once batch N is in the query's commit log, so whatever it sent would repeat records."""
    if task.micro_batch is None or later is None or later <= task.micro_batch:
        return None
    return StandDown(
        f"{task.where}: {seen} already names micro-batch {later} of this query, which Spark starts only once "
        f"micro-batch {task.micro_batch} is committed: this task belongs to a driver the query has moved past (a "
        "zombie, such as a frozen driver resumed after another took over the checkpoint). It stands down without "
        "sending anything; stop that driver")


def plan(e: Evidence) -> Plan:
    """What this attempt may send, from the evidence alone (see the module's docstring)."""
    t = e.task
    zombie = stand_down_for_micro_batch(t, e.later_micro_batch, "this host's WAL or the partition's marker")
    if zombie is not None:
        return zombie
    priors = [p for p in e.priors if p.key != t.key]
    if t.run is None:  # outside a Spark task: one run, this partition's attempts only
        own_run = [p for p in priors if p.partition == t.partition]
        others: list[Prior] = []
    else:
        own_run = [p for p in priors if p.partition == t.partition and p.run == t.run]
        others = [p for p in priors if p.run != t.run]
    if t.task_attempt_id is not None and t.run is not None:
        later = [p for p in own_run if p.task_attempt_id is not None and p.task_attempt_id > t.task_attempt_id]
        if later and not t.exactly_once:  # exactly_once: the transaction's fencing decides
            return StandDown(f"{t.where}: Spark already started a later attempt of this task, so this one's JVM side "
                             "is gone; it stands down without sending anything", by_retry=True)
        # at_least_once: an earlier attempt of this partition still sending from a live Python worker (Spark does not
        # wait for a failed task's worker) is waited for, then its proof is taken; another run's only if it began
        # before this one on this host (the WAL's order, no clock), or two runs' attempts that each waited for the
        # other would both wait out the deadline. exactly_once: the partition's transactional id has fenced them.
        earlier = [p for p in others if p.partition == t.partition and (t.seq is None or p.seq is None or
                                                                          p.seq < t.seq)]
        waits_for = [] if t.exactly_once else [*own_run, *earlier]
        sending = tuple(p.name for p in waits_for if p.still_sending)
        if sending and not e.waited_out:
            return Wait(sending)
        overdue = sending
    else:
        overdue = ()
    if not t.exactly_once:
        return _at_least_once(own_run, others, overdue)
    return _exactly_once(e, priors, others, overdue)


def _at_least_once(own_run: list[Prior], others: list[Prior], overdue: tuple[str, ...]) -> Send:
    # An exactly_once attempt of another run counts only once committed (done): an aborted transaction's records
    # are not visible to read_committed readers.
    claim = [p for p in others if not p.exactly_once or p.state == DONE]
    return Send(resume=tuple(p for p in own_run if not p.trimmed), claim=tuple(p for p in claim if not p.trimmed),
                unproven=tuple(p for p in (*own_run, *claim) if p.trimmed), overdue=overdue)


def committed_attempts(e: Evidence, others: Iterable[Prior]) -> list[Prior]:
    """The attempts of other runs (any partition) whose transactions committed: those done in the WAL (an attempt
    is marked done only once its commit returned: this holds after the brokers expired the markers) and those a
    marker names (killed between its commit and its WAL's done)."""
    by_name = {p.name: p for p in others}
    committed = {n: p for n, p in by_name.items() if p.exactly_once and p.state == DONE}
    markers = [m for ms in e.markers.values() for m in ms]
    if e.own_marker is not None:
        markers.append(e.own_marker)
    for m in markers:
        committed.update({n: by_name[n] for n in m.attempts or () if n in by_name})
    return list(committed.values())


def _exactly_once(e: Evidence, priors: list[Prior], others: list[Prior], overdue: tuple[str, ...]) -> Plan:
    t, m = e.task, e.own_marker
    committed = committed_attempts(e, others)
    trimmed = [p for p in committed if p.trimmed]
    if m is None:
        # No marker: no transaction holds this partition number, or the brokers expired its marker. This run's
        # attempts of the partition marked done committed all they logged (done comes only after the commit
        # returned); other runs may hold some of its rows in other partitions (the rows may be split otherwise
        # now), which only their digests can tell.
        own_done = [p for p in priors if p.partition == t.partition and p.exactly_once and p.state == DONE
                    and p not in committed and (t.run is None or p.run == t.run)]
        trimmed += [p for p in own_done if p.trimmed]
        if trimmed:
            return _refuse_trimmed(e, trimmed)
        return Send(resume=tuple(own_done), all_acknowledged=True, claim=tuple(committed), holders=tuple(own_done),
                    committed_records=sum(p.records for p in own_done), overdue=overdue)
    if m.run is None or t.run is None or m.run == t.run:
        # A retry in the run that committed: resume from the committed attempts if this WAL holds all they hold.
        here = {p.name: p for p in priors if p.partition == t.partition}
        holders = [here[n] for n in m.attempts or () if n in here]
        if not _proves(holders, m) or trimmed:
            return SkipIfCommitted(m, "this host's WAL lacks the digests of what the partition's committed "
                                      "transactions hold")
        ours = {p.key for p in committed}
        return Send(resume=tuple(h for h in holders if h.key not in ours), all_acknowledged=True,
                    claim=tuple(committed), holders=tuple(holders), committed_records=m.records, overdue=overdue)
    # Another run committed this partition number since; the rows may be split otherwise now, so judge by content.
    # This run's own attempts of the partition marked done committed all they logged too (a zombie of an overtaken
    # run whose marker the brokers expired before the newer run wrote its own): they are skipped record by record.
    own_done = [p for p in priors if p.partition == t.partition and p.exactly_once and p.state == DONE
                and p.run == t.run and p not in committed]
    by_name = {p.name: p for p in [*committed, *own_done]}
    holders = [by_name[n] for n in m.attempts or () if n in by_name]
    if not _proves(holders, m) or trimmed or any(p.trimmed for p in own_done):
        return SkipIfCommitted(m, f"run {m.run} committed this partition and this host's WAL lacks its digests")
    extra = [p for p in own_done if p.name not in set(m.attempts or ())]
    return Send(resume=tuple(own_done), all_acknowledged=True, claim=tuple(committed), holders=(*holders, *extra),
                committed_records=m.records + sum(p.records for p in extra), overdue=overdue)


def _proves(holders: list[Prior], m: Marker) -> bool:
    """Whether these attempts' digests account for every record the marker's transactions hold."""
    return (m.attempts is not None and len(m.attempts) > 0 and len(holders) == len(m.attempts)
            and not any(h.trimmed for h in holders) and sum(h.records for h in holders) == m.records)


def _refuse_trimmed(e: Evidence, trimmed: list[Prior]) -> Refuse:
    t = e.task
    runs = sorted({p.run or "?" for p in trimmed})
    parts = sorted({p.partition for p in trimmed})
    return Refuse(
        f"{t.where}: earlier run(s) {', '.join(runs)} of write {t.write_id} committed partition(s) "
        f"{', '.join(map(str, parts))} ({len(trimmed)} attempt(s)), but this host's WAL {e.wal} no longer holds "
        "their digests (they went to keep wal.proofMaxBytes), so which of this partition's records they committed "
        "cannot be told: skipping could lose records and sending could repeat them",
        f"Exact recovery: run `recoverable-kafka-wal purge --path {e.wal} --write-id {t.write_id}`, then re-run with "
        f"the same wal.writeId and the partitioning of run {runs[-1]} while the brokers still hold its markers "
        "(offsets.retention.minutes): each partition it committed is then recognised by its marker's fingerprint "
        "and the rest is sent whole. Raise wal.proofMaxBytes to keep a longer history")


def judge_skipped(task: TaskAttempt, marker: Marker, fingerprint: Fingerprint, received: int,
                  wal: str | None) -> Refuse | None:
    """At the end of a skipped partition: None if its input is the one the marker's transactions committed (its
    fingerprint; its count, for a marker without one), else the refusal. Skipping another input could lose
    records, and re-sending it could repeat them."""
    if marker.fingerprint is not None and marker.fingerprint == fingerprint:
        return None
    if marker.fingerprint is None and marker.records == received:
        return None
    if marker.run is not None and task.run is not None and marker.run != task.run:
        cause = ("this re-run split the write's rows into other partitions than run "
                 f"{marker.run}, which committed it (another spark.sql.shuffle.partitions, cluster size, AQE or "
                 "repartition()), or its source changed")
    else:
        cause = "an earlier input was cut short (an upstream failure, e.g. a shuffle fetch) or the input changed"
    where = (f"the WAL {marker.wal} on host {marker.host}" if marker.wal else "the WAL of the host that committed it")
    here = f"this host's WAL {wal} lacks their digests" if wal else "the WAL is disabled"
    fp = marker.fingerprint.encode() if marker.fingerprint else "not recorded"
    return Refuse(
        f"{task.where}: earlier transactions committed {marker.records} records of this partition (fingerprint "
        f"{fp}), but the partition now holds {received} (fingerprint {fingerprint.encode()}): {cause}, and {here}",
        f"Exact recovery: re-run with the same wal.writeId where {where} is (its tasks then send exactly the rest), "
        "or with the partitioning of the run that committed (this partition's input then matches the marker)")
