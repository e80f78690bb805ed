"""The resume plan (executor, pure): what one task attempt may send, and what proof of delivery may go, each decided in
one function of the evidence.

:func:`plan` holds every rule of the re-run machinery: which earlier attempts of the write this attempt skips by (its
own partition's of its run, record by record; other runs', any partition, under the run's claims), when it waits for
one still sending, when it stands down as a zombie, when an ``exactly_once`` attempt skips a partition that a committed
transaction already holds, and when it refuses before anything is sent, naming the recovery that is exact.
:func:`release` says which proof may leave this host's WAL and the proof topic, and when. The partition writer
(:mod:`recoverable_sink.executor.partition_writer`) gathers the evidence (:mod:`recoverable_sink.executor.evidence`)
and carries the decisions out; nothing here touches Spark, Kafka or LMDB, so
``tests/unit/executor/test_writer_model.py`` drives the real writer against a model of what a ``read_committed``
reader sees, and ``test_resume_plan.py`` pins the rules one case at a time.

What a record Kafka holds counts as delivered whoever sent it and in whichever mode: an ``at_least_once`` attempt's
acknowledged records are visible to ``read_committed`` readers at once, an ``exactly_once`` attempt's once its
transaction committed. Evidence of an earlier attempt comes from this host's WAL and from the proof topic in Kafka
(the same attempt may be in both: its proof is their union).

No rule orders runs or keeps proof by a clock. A run id only tells runs apart: every other run's proof counts, whether
that run began before or after this one. A task of a run that another run overtook (a zombie) therefore takes the newer
run's proof like any re-run and sends only what Kafka lacks; what tells it apart is what Kafka and the WAL hold, never a
timestamp: a later micro-batch of its query, or a later task attempt of its own run (Spark numbers those in order).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from recoverable_sink.identity import Fingerprint
from recoverable_sink.producer.marker import Marker
from recoverable_sink.wal.attempt import DONE, AttemptState


def attempt_name(attempt_key: str) -> str:
    """An attempt key without its write id and partition (unique on its own); markers and the proof topic name
    attempts so."""
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
    def name(self) -> str | None:
        return attempt_name(self.key) if self.key is not None else None

    @property
    def where(self) -> str:
        return f"partition {self.partition} of write {self.write_id}"


@dataclass(frozen=True)
class Prior:
    """An earlier attempt of the write (any partition, any run), as this host's WAL and the proof topic know it.

    ``state``: ``done`` once all it logged was acknowledged (``exactly_once``: its transaction committed, which is
    also what finding its proof in Kafka means: that proof is written inside the transaction). ``key`` is its entry in
    this host's WAL (None: not here); ``local_records`` the digests that entry holds (0 once ``trimmed``);
    ``kafka_records`` the digests the proof topic holds of it (``at_least_once``: what Kafka acknowledged, as its
    drains checkpointed)."""

    name: str
    partition: int
    run: str | None
    state: AttemptState
    exactly_once: bool
    task_attempt_id: int | None = None
    seq: int | None = None  # the order it began in on this host (None: not here, or recorded before)
    key: str | None = None
    still_sending: bool = False  # its process runs here and it neither finished nor ended
    trimmed: bool = False  # its digests here went to keep wal.proofMaxBytes
    local_records: int = 0
    in_kafka: bool = False  # the proof topic holds its proof (what a drain or its transaction put there)
    kafka_records: int = 0
    micro_batch: int | None = None

    @property
    def records(self) -> int:
        """The digests of it that can be read here or in Kafka."""
        return max(self.local_records, self.kafka_records)

    @property
    def proven(self) -> bool:
        """Whether what it delivered can be told, here or from the proof topic."""
        return (self.key is not None and not self.trimmed) or self.in_kafka

    @property
    def committed(self) -> bool:
        """exactly_once: its transaction committed (its WAL entry is done only after the commit returned)."""
        return self.exactly_once and self.state == DONE


@dataclass(frozen=True)
class Evidence:
    """Everything the plan reads. ``own_marker``: this write's committed marker of this partition (exactly_once);
    ``markers``: the markers of the other partitions the priors wrote; ``later_micro_batch``: the latest micro-batch
    of the query seen on this host, in the marker group or in the proof topic; ``waited_out``: the wait for attempts
    still sending reached its deadline; ``wal`` and ``proof_topic`` name where the evidence was read (for
    messages); ``proof_expired``: the proof topic's retention deleted part of where the write's proof starts, so
    proof of earlier runs may be missing; ``fail_on_expired``: proof.failOnExpired."""

    task: TaskAttempt
    priors: tuple[Prior, ...] = ()
    own_marker: Marker | None = None
    markers: Mapping[int, tuple[Marker, ...]] = field(default_factory=dict)
    later_micro_batch: int | None = None
    waited_out: bool = False
    wal: str | None = None
    proof_topic: str | None = None
    proof_expired: bool = False
    fail_on_expired: bool = True


# ---- the plans ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Take:
    """An earlier attempt whose proof this one takes: every record it logged (``all_logged``: its transaction
    committed) or only what Kafka acknowledged to it."""

    prior: Prior
    all_logged: bool

    @property
    def name(self) -> str:
        return self.prior.name


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
    """Send the input less what is proven delivered: ``resume`` (this partition's earlier attempts of this run) is
    skipped record by record; ``claim`` (attempts of other runs, any partition) is taken under the run's claims, so
    no two partitions of the run count one delivered copy. exactly_once: ``holders`` are the attempts whose committed
    transactions hold records of this partition (the new marker names them), holding ``committed_records``.
    ``unproven``: attempts whose proof is gone (their records are sent again, at_least_once only); ``overdue``:
    attempts still sending when the wait ran out."""

    resume: tuple[Take, ...] = ()
    claim: tuple[Take, ...] = ()
    holders: tuple[Prior, ...] = ()
    committed_records: int = 0
    unproven: tuple[Prior, ...] = ()
    overdue: tuple[str, ...] = ()


@dataclass(frozen=True)
class SkipIfCommitted:
    """exactly_once: a committed transaction holds this partition and neither this host nor the proof topic can say
    record by record what it holds. Send nothing; at the end the input must be the one committed
    (:func:`judge_skipped`)."""

    marker: Marker
    reason: str


Plan = StandDown | Wait | Refuse | Send | SkipIfCommitted


# ---- the rules ------------------------------------------------------------------------------------------------
def stand_down_for_micro_batch(task: TaskAttempt, later: int | None) -> StandDown | None:
    """A micro-batch's task that finds a later micro-batch of its query is a zombie's: Spark starts batch N+1 only
    once batch N is in the query's commit log, so whatever it sent would repeat records."""
    if task.micro_batch is None or later is None or later <= task.micro_batch:
        return None
    return StandDown(
        f"{task.where}: this host's WAL or the partition's marker already names micro-batch {later} of this query, "
        f"which Spark starts only once micro-batch {task.micro_batch} is committed: this task belongs to a driver the "
        "query has moved past (a zombie, such as a frozen driver resumed after another took over the checkpoint). It "
        "stands down without sending anything; stop that driver")


def plan(e: Evidence) -> Plan:
    """What this attempt may send, from the evidence alone (see the module's docstring). Called first with what this
    host's WAL holds (a zombie stands down before its producer fences anyone), then with everything."""
    t = e.task
    zombie = stand_down_for_micro_batch(t, e.later_micro_batch)
    if zombie is not None:
        return zombie
    priors = [p for p in e.priors if p.name != t.name]
    if t.run is None:  # outside a Spark task: one run, this partition's attempts only
        own_run = [p for p in priors if p.partition == t.partition]
        others: list[Prior] = []
    else:
        own_run = [p for p in priors if p.partition == t.partition and p.run == t.run]
        others = [p for p in priors if p.run != t.run]
    overdue: tuple[str, ...] = ()
    if t.task_attempt_id is not None and t.run is not None:
        # In either mode: under exactly_once the later attempt's fencing cannot tell once it committed and the
        # brokers expired its marker (a Python worker resumed days later); its chunks in the proof topic still can.
        later = [p for p in own_run if p.task_attempt_id is not None and p.task_attempt_id > t.task_attempt_id]
        if later:
            return StandDown(f"{t.where}: Spark already started a later attempt of this task, so this one's JVM side "
                             "is gone; it stands down without sending anything", by_retry=True)
        # at_least_once: an earlier attempt of this partition still sending from a live Python worker here (Spark does
        # not wait for a failed task's worker) is waited for, then its proof is taken; another run's only if it began
        # before this one on this host (the WAL's order, no clock), or two runs' attempts that each waited for the
        # other would both wait out the deadline. exactly_once: the partition's transactional id has fenced them.
        earlier = [p for p in others if p.partition == t.partition and (t.seq is None or p.seq is None or
                                                                          p.seq < t.seq)]
        waits_for = [] if t.exactly_once else [*own_run, *earlier]
        sending = tuple(p.name for p in waits_for if p.still_sending)
        if sending and not e.waited_out:
            return Wait(sending)
        overdue = sending
    if not t.exactly_once:
        return _at_least_once(e, own_run, others, overdue)
    found = _exactly_once(e, priors, others, overdue)
    if isinstance(found, Send) and e.proof_expired and e.fail_on_expired:
        return _refuse_expired(e)
    return found


def delivered_by(e: Evidence, others: Iterable[Prior]) -> list[Take]:
    """What other runs' attempts delivered, in either mode: an at_least_once attempt's acknowledged records (visible
    to read_committed readers at once), an exactly_once attempt's every record once its transaction committed (done
    in the WAL, found in the proof topic, or named by a marker: killed between its commit and its WAL's done)."""
    others = list(others)
    named = {n for m in _all_markers(e) for n in m.attempts or ()}
    takes = []
    for p in others:
        if p.exactly_once and (p.committed or p.name in named):
            takes.append(Take(p, all_logged=True))
        elif not p.exactly_once:
            takes.append(Take(p, all_logged=False))
    return takes


def _all_markers(e: Evidence) -> list[Marker]:
    markers = [m for ms in e.markers.values() for m in ms]
    if e.own_marker is not None:
        markers.append(e.own_marker)
    return markers


def _at_least_once(e: Evidence, own_run: list[Prior], others: list[Prior], overdue: tuple[str, ...]) -> Send:
    claim = delivered_by(e, others)
    resume = [Take(p, all_logged=False) for p in own_run]
    return Send(resume=tuple(t for t in resume if t.prior.proven), claim=tuple(t for t in claim if t.prior.proven),
                unproven=tuple(t.prior for t in (*resume, *claim) if not t.prior.proven), overdue=overdue)


def _exactly_once(e: Evidence, priors: list[Prior], others: list[Prior], overdue: tuple[str, ...]) -> Plan:
    t, m = e.task, e.own_marker
    delivered = delivered_by(e, others)
    committed = [d.prior for d in delivered if d.all_logged]
    # A committed transaction whose proof is gone leaves its records unknown: skipping could lose them and sending
    # could repeat them. An at_least_once attempt whose proof is gone here and was never checkpointed to Kafka (it
    # died before its first drain's chunk, or delivered nothing) is what its mode already allows: sent again.
    gone = [p for p in committed if not p.proven]
    claim = tuple(d for d in delivered if d.prior.proven)
    unproven = tuple(d.prior for d in delivered if not d.all_logged and not d.prior.proven)
    if m is None:
        # No marker: no transaction holds this partition number, or the brokers expired its marker. This run's
        # attempts of the partition that committed hold all they logged (done comes only after the commit
        # returned; proof in Kafka only with it); other runs may hold some of its rows in other partitions (the rows
        # may be split otherwise now), which only their digests can tell.
        own_done = [p for p in priors if p.partition == t.partition and p.committed and p not in committed
                    and (t.run is None or p.run == t.run)]
        gone += [p for p in own_done if not p.proven]
        if gone and not (e.proof_expired and not e.fail_on_expired):
            return _refuse_unproven(e, gone)
        own_done = [p for p in own_done if p.proven]  # proof.failOnExpired=false: what the retention took is sent
        return Send(resume=tuple(Take(p, all_logged=True) for p in own_done), claim=claim, holders=tuple(own_done),
                    committed_records=sum(p.records for p in own_done), unproven=unproven, overdue=overdue)
    if m.run is None or t.run is None or m.run == t.run:
        # A retry in the run that committed: resume from the committed attempts if their proof is at hand.
        here = {p.name: p for p in priors if p.partition == t.partition}
        holders = [here[n] for n in m.attempts or () if n in here]
        if not _proves(holders, m) or gone:
            return SkipIfCommitted(m, "neither this host's WAL nor the proof topic holds the digests of what the "
                                      "partition's committed transactions hold")
        ours = {d.prior.name for d in claim}
        return Send(resume=tuple(Take(h, all_logged=True) for h in holders if h.name not in ours), claim=claim,
                    holders=tuple(holders), committed_records=m.records, unproven=unproven, overdue=overdue)
    # Another run committed this partition number since; the rows may be split otherwise now, so judge by content.
    # This run's own attempts of the partition that committed hold all they logged too (a zombie of an overtaken run
    # whose marker the brokers expired before the newer run wrote its own): they are skipped record by record.
    own_done = [p for p in priors if p.partition == t.partition and p.committed and p.run == t.run
                and p not in committed]
    by_name = {p.name: p for p in [*committed, *own_done]}
    holders = [by_name[n] for n in m.attempts or () if n in by_name]
    if not _proves(holders, m) or gone or any(not p.proven for p in own_done):
        return SkipIfCommitted(m, f"run {m.run} committed this partition and neither this host's WAL nor the proof "
                                  "topic holds its digests")
    extra = [p for p in own_done if p.name not in set(m.attempts or ())]
    return Send(resume=tuple(Take(p, all_logged=True) for p in own_done), claim=claim, holders=(*holders, *extra),
                committed_records=m.records + sum(p.records for p in extra), unproven=unproven, overdue=overdue)


def _proves(holders: list[Prior], m: Marker) -> bool:
    """Whether these attempts' digests account for every record the marker's transactions hold."""
    return (m.attempts is not None and len(m.attempts) > 0 and len(holders) == len(m.attempts)
            and all(h.proven for h in holders) and sum(h.records for h in holders) == m.records)


def _refuse_unproven(e: Evidence, gone: list[Prior]) -> Refuse:
    t = e.task
    runs = sorted({p.run or "?" for p in gone})
    parts = sorted({p.partition for p in gone})
    where = f"this host's WAL {e.wal}" + (f" nor the proof topic {e.proof_topic}" if e.proof_topic else "")
    kafka = (" and the proof topic's retention (proof.retentionHours) deleted theirs" if e.proof_topic else
             " (proof.kafka=false keeps no copy in Kafka)")
    return Refuse(
        f"{t.where}: earlier run(s) {', '.join(runs)} of write {t.write_id} committed partition(s) "
        f"{', '.join(map(str, parts))} ({len(gone)} attempt(s)), but neither {where} holds their digests any more "
        f"(this host's went to keep wal.proofMaxBytes{kafka}), so which of this partition's records they committed "
        "cannot be told: skipping could lose records and sending could repeat them",
        f"Exact recovery: run `recoverable-kafka-wal purge --path {e.wal} --write-id {t.write_id}`, then re-run with "
        f"the same wal.writeId and the partitioning of run {runs[-1]} while the brokers still hold its markers: each "
        "partition it committed is then recognised by its marker's fingerprint and the rest is sent whole")


def _refuse_expired(e: Evidence) -> Refuse:
    """exactly_once: what earlier runs committed may be in proof the retention deleted, so sending could repeat it;
    as Spark's Kafka source fails on data it can no longer read (failOnDataLoss), so does this, unless told not to."""
    t = e.task
    return Refuse(
        f"{t.where}: the proof topic {e.proof_topic}'s retention deleted part of the proof of delivery of write "
        f"{t.write_id} (it keeps proof for proof.retentionHours, and the brokers' retention.ms), so what its earlier "
        "runs committed cannot all be told: sending could repeat records they delivered",
        "To send it anyway (records whose proof was deleted may be repeated), re-run with proof.failOnExpired=false; "
        "to keep re-runs exact for longer, raise proof.retentionHours")


def judge_skipped(task: TaskAttempt, marker: Marker, fingerprint: Fingerprint, received: int,
                  wal: str | None, expired: bool = False) -> Refuse | None:
    """At the end of a skipped partition: None if its input is the one the marker's transactions committed (its
    fingerprint; its count, for a marker without one), else the refusal. Skipping another input could lose
    records, and re-sending it could repeat them. ``expired``: the proof topic's retention deleted part of the
    write's proof."""
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
    kafka = ("the proof topic's retention deleted theirs (proof.retentionHours)" if expired else
             "the proof topic holds none of their digests")
    anyway = (". Or, to send the whole write again (repeating what it delivered), write it under a new "
              "wal.writeId") if expired else ""
    return Refuse(
        f"{task.where}: earlier transactions committed {marker.records} records of this partition (fingerprint "
        f"{fp}), but the partition now holds {received} (fingerprint {fingerprint.encode()}): {cause}, {here}, and "
        f"{kafka}",
        f"Exact recovery: re-run with the same wal.writeId where {where} is (its tasks then send exactly the rest), "
        f"or with the partitioning of the run that committed (this partition's input then matches the marker){anyway}")


# ---- what proof may go ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Held:
    """An attempt in this host's WAL, as the release rules see it. ``published``: its whole proof is in the proof
    topic (exactly_once: committed with it; at_least_once: its last checkpoint after everything was acknowledged),
    so the WAL's copy is a cache; ``holding``: it holds records Kafka never acknowledged (payload a re-run or
    ``replay`` may need); ``gone``: the process that began it is known to be gone; ``aged``: older than
    ``wal.retentionHours`` by this host's clock, which decides only over published proof (a clock stepped either way
    then changes nothing a reader sees)."""

    key: str
    write_id: str
    partition: int
    run: str | None
    state: AttemptState
    exactly_once: bool
    generated: bool = False
    seq: int | None = None
    trimmed: bool = False
    holding: bool = False
    published: bool = False
    may_be_running: bool = False
    query_id: str | None = None
    micro_batch: int | None = None
    proof_bytes: int = 0
    aged: bool = False


@dataclass(frozen=True)
class Release:
    """What may leave this host's WAL: ``purge`` removes attempts whole, ``trim`` their digests only (the record
    stays, marked trimmed, so a later attempt knows what it was); ``kept`` are old attempts kept because they are
    not finished or hold payload (for the sweep's warning)."""

    purge: tuple[str, ...] = ()
    trim: tuple[str, ...] = ()
    kept: tuple[str, ...] = ()


def release(held: Sequence[Held], *, proof_max_bytes: int | None = None,
            micro_batch: tuple[str, int] | None = None) -> Release:
    """What proof may leave this host's WAL as a task starts (see :class:`Held`):

    - a stream's task of micro-batch N releases the query's earlier micro-batches (Spark starts N only once they are
      in the query's commit log);
    - published proof goes when aged, or at once for a write with a generated id (never re-run);
    - past ``proof_max_bytes``, the done attempts' proof goes, published first, then the oldest begun (the WAL's
      order, no clock); one holding payload neither goes nor counts, nor does an attempt of a write that has an
      attempt here not done, unless the proof topic holds it (a re-run of a failed write needs the proof of its done
      partitions too).

    Nothing unpublished goes by a clock: an attempt kept by these rules stays until its write is re-run, released by
    the driver, or purged by an operator."""
    purge: list[str] = []
    if micro_batch is not None:
        query, batch = micro_batch
        purge += [h.key for h in held if h.query_id == query and h.micro_batch is not None and h.micro_batch < batch]
    finished = [h for h in held if h.key not in purge and h.state == DONE and not h.holding]
    purge += [h.key for h in finished if h.published and (h.aged or h.generated)]
    kept = [h.key for h in held if h.aged and h.key not in purge and (h.holding or h.state != DONE)]
    trim: list[str] = []
    if proof_max_bytes is not None:
        trim = _over_budget([h for h in held if h.key not in purge], proof_max_bytes)
    return Release(purge=tuple(purge), trim=tuple(trim), kept=tuple(kept))


def _over_budget(held: list[Held], max_bytes: int) -> list[str]:
    unfinished = {h.write_id for h in held if h.state != DONE}
    candidates = [h for h in held if h.state == DONE and not h.trimmed and not h.holding
                  and (h.published or h.write_id not in unfinished)]
    total = sum(h.proof_bytes for h in candidates)
    chosen: list[str] = []
    for h in sorted(candidates, key=lambda h: (not h.published, h.seq if h.seq is not None else -1)):
        if total <= max_bytes:
            break
        chosen.append(h.key)
        total -= h.proof_bytes
    return chosen


@dataclass(frozen=True)
class Finish:
    """What a committing attempt changes in this host's WAL (decided by :func:`finishing`): ``superseded`` attempts
    keep only the digests of what Kafka acknowledged to them and are done; ``dropped`` are removed whole (their
    transactions did not commit); ``committed`` are marked done (a marker names them); ``purge_own``: this attempt
    sent nothing, so its entry goes too."""

    superseded: tuple[str, ...] = ()
    dropped: tuple[str, ...] = ()
    committed: tuple[str, ...] = ()
    purge_own: bool = False


def finishing(task: TaskAttempt, priors: Sequence[Prior], plan_taken: Send | SkipIfCommitted | None,
              sent: bool) -> Finish:
    """At an attempt's commit, what becomes of the other attempts of its partition on this host. at_least_once: this
    run's earlier attempts of the partition are superseded: everything their input held (the same rows) is now in
    Kafka. Another run's attempts of the same partition number are not: its rows may have been split otherwise, and
    the rest of them belong to partitions of this run that may yet fail. exactly_once: the holders the marker names
    are committed; this run's other attempts of the partition are dropped (their transactions were aborted); an
    earlier run's stay whatever their marker says, as proof for the other partitions of this run (and of a later
    one)."""
    here = [p for p in priors if p.key is not None and p.partition == task.partition and p.name != task.name]
    this_run = [p for p in here if task.run is None or p.run == task.run]
    if not task.exactly_once:
        return Finish(superseded=tuple(p.key for p in this_run if not p.exactly_once and p.key is not None))
    if isinstance(plan_taken, SkipIfCommitted):
        m = plan_taken.marker
        if m.run is None or m.run == task.run:
            return Finish(dropped=tuple(p.key for p in this_run if p.key is not None), purge_own=True)
        return Finish(purge_own=True)
    holders = plan_taken.holders if isinstance(plan_taken, Send) else ()
    kept = {h.name for h in holders}
    dropped = tuple(p.key for p in this_run if p.name not in kept and p.key is not None)
    committed = tuple(h.key for h in holders if h.key is not None and h.state != DONE)
    return Finish(dropped=dropped, committed=committed, purge_own=not sent)
