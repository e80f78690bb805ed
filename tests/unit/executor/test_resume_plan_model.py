"""The resume plan against a model of what a ``read_committed`` reader sees (hypothesis stateful testing).

A write of a small multiset of records (equal records included) runs again and again: runs with random
partitionings and driver clocks skewed both ways, tasks on hosts that hold or lack the earlier WAL, failures at
random rows (retried, or in every attempt), kills between a transaction's commit and its WAL's done, proof trims,
marker expiries, lost WALs, zombie tasks of earlier runs, and runs aimed at the wrong cluster. Each task attempt is
planned by :func:`recoverable_sink.executor.resume_plan.plan` and carried out here as the writers do, with the
sink's own claim rule, trim choice, delivered multiset and fingerprints; Kafka is a multiset of committed copies.

Invariants, checked at every send or commit and after every run that completes:
- nothing is lost: once a run to the right cluster completes, every record is there at least as often as the
  input holds it;
- under ``exactly_once`` nothing is repeated; under ``at_least_once`` a repeat is a record whose acknowledgement a
  kill lost (the documented window) or whose proof this host cannot see;
- the only other failures allowed are the named known gaps of docs/guarantees.md (:data:`KNOWN_GAPS`), each
  needing a proof that this host lacks.

``make unit`` runs a bounded number of sequences; ``make chaos`` the long profile (RESUME_MODEL_EXAMPLES, with the
seed printed).
"""

from __future__ import annotations

import hashlib
import itertools
import os
import random
from collections import Counter
from dataclasses import dataclass, field, replace

from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule

from recoverable_sink.executor import resume_plan as rp
from recoverable_sink.identity import DeliveredSet, Fingerprint
from recoverable_sink.producer.marker import Marker
from recoverable_sink.wal.attempt import DONE, OPEN, AttemptInfo, AttemptState
from recoverable_sink.wal.retention import choose_trims, trimmable
from recoverable_sink.wal.store import claim_copies

WRITE, TOPIC = "w", "t"
RIGHT, WRONG = "cluster-a", "cluster-b"

# The documented known gaps (docs/guarantees.md, "Known gaps"): a failure is excused only by one of these, and only
# where this host lacks the proof it names.
KNOWN_GAPS = {
    "expired-markers-proof-elsewhere": "a re-run after the brokers expired the markers, on a host without the "
                                       "earlier run's WAL",
    "other-partitioning-proof-elsewhere": "a re-run on another partitioning whose tasks run where the earlier "
                                          "run's WAL is not",
    "equal-records-proof-spread": "equal records in more than one partition, the earlier WAL spread over hosts",
    "expired-markers-commit-unrecorded": "an exactly_once attempt killed between its commit and its WAL's done, "
                                         "no retry on its host, and the markers expired before a re-run",
}


def digest(cluster: str, value: int) -> bytes:
    """A record's identity, as the sink's: its content and its destination's cluster."""
    return hashlib.blake2b(f"{cluster}/{TOPIC}/{value}".encode(), digest_size=16).digest()


def fingerprint(digests: list[bytes]) -> Fingerprint:
    fp = Fingerprint()
    fp.add(b"".join(digests))
    return fp


@dataclass
class Logged:
    """One attempt's entry in a host's WAL."""

    key: str
    partition: int
    run: str
    exactly_once: bool
    task_attempt_id: int
    digests: list[bytes] = field(default_factory=list)
    acked: list[bool] = field(default_factory=list)
    state: AttemptState = OPEN
    trimmed: bool = False
    done_at: float = 0.0

    def prior(self) -> rp.Prior:
        return rp.Prior(key=self.key, partition=self.partition, run=self.run, state=self.state,
                        exactly_once=self.exactly_once, task_attempt_id=self.task_attempt_id, still_sending=False,
                        trimmed=self.trimmed, records=0 if self.trimmed else len(self.digests))

    def info(self) -> AttemptInfo:
        return AttemptInfo(key=self.key, write_id=WRITE, partition=self.partition, attempt=0, host="h",
                           created=self.done_at, state=self.state, done_at=self.done_at or None, run=self.run,
                           trimmed=self.trimmed)

    def proof(self, all_acknowledged: bool) -> list[bytes]:
        if self.trimmed:
            return []
        return [d for d, a in zip(self.digests, self.acked, strict=True) if all_acknowledged or a]


class Book:
    """A run's claims on one host (the WAL's ``k/`` keys)."""

    def __init__(self, claims: dict[bytes, dict[int, int]]) -> None:
        self.claims = claims

    def get(self, digest: bytes) -> dict[int, int]:
        return dict(self.claims.get(digest, {}))

    def put(self, digest: bytes, claims: dict[int, int]) -> None:
        self.claims[digest] = dict(claims)


@dataclass
class Host:
    attempts: dict[str, Logged] = field(default_factory=dict)
    claims: dict[str, dict[bytes, dict[int, int]]] = field(default_factory=dict)


@dataclass(frozen=True)
class Copy:
    """One copy a read_committed reader sees, and who sent it."""

    host: int
    key: str
    index: int


@dataclass
class Run:
    run_id: str
    partitions: list[list[int]]
    cluster: str
    shape: tuple[tuple[int, ...], ...]  # the partitioning: each partition number's values, sorted


class Violation(AssertionError):
    pass


class ResumeModel(RuleBasedStateMachine):
    """The world: hosts' WALs, Kafka's committed copies and markers per cluster, the runs so far."""

    def __init__(self) -> None:
        super().__init__()
        self.hosts: list[Host] = []
        self.committed: dict[str, Counter[bytes]] = {RIGHT: Counter(), WRONG: Counter()}
        self.copies: dict[str, dict[bytes, list[Copy]]] = {RIGHT: {}, WRONG: {}}
        self.markers: dict[str, dict[int, Marker]] = {RIGHT: {}, WRONG: {}}
        self.runs: list[Run] = []
        self.expired = False
        self.keys = itertools.count()
        self.clock = 1_000_000.0
        self.excused: Counter[str] = Counter()
        self.refusals: Counter[str] = Counter()

    # ---- set-up ---------------------------------------------------------------------------------------------
    RUN_ARGS = dict(partitions=st.integers(1, 5), seed=st.integers(0, 2**16), failing=st.none() | st.integers(0, 4),
                    every_attempt=st.booleans(), fail_row=st.floats(0.0, 1.0), spread=st.booleans(),
                    wrong_cluster=st.sampled_from([False] * 5 + [True]), kill_after_commit=st.booleans(),
                    skew_s=st.integers(-3600, 3600))

    @initialize(values=st.lists(st.integers(0, 40), min_size=4, max_size=28), exactly_once=st.booleans(),
                hosts=st.integers(1, 3), first=st.fixed_dictionaries(RUN_ARGS))
    def start(self, values: list[int], exactly_once: bool, hosts: int, first: dict[str, object]) -> None:
        """The write's input, its mode and the hosts; every sequence starts with a run (often a failed one)."""
        self.values = values
        self.expected = Counter(values)
        self.exactly_once = exactly_once
        self.hosts = [Host() for _ in range(hosts)]
        self.run(**first)  # type: ignore[arg-type]

    # ---- the runs -------------------------------------------------------------------------------------------
    @rule(**RUN_ARGS)
    def run(self, partitions: int, seed: int, failing: int | None, every_attempt: bool, fail_row: float,
            spread: bool, wrong_cluster: bool, kill_after_commit: bool, skew_s: int) -> None:
        """One run of the write: a new driver-side writer (its id made from a clock skewed by ``skew_s``; nothing
        may read an order from it), its rows split at random, each partition retried up to 4 times."""
        rnd = random.Random(seed)
        shuffled = list(self.values)
        rnd.shuffle(shuffled)
        cuts = sorted(rnd.randint(0, len(shuffled)) for _ in range(partitions - 1))
        parts = [shuffled[a:b] for a, b in zip([0, *cuts], [*cuts, len(shuffled)], strict=True)]
        self.clock += 60
        run = Run(run_id=f"{int((self.clock + skew_s) * 1e9):020d}-{next(self.keys)}", partitions=parts,
                  cluster=WRONG if wrong_cluster else RIGHT,
                  shape=tuple(tuple(sorted(p)) for p in parts))
        self.runs.append(run)
        complete = True
        order = list(range(partitions))
        rnd.shuffle(order)
        for p in order:
            outcome = "failed"
            for attempt in range(4):
                host = rnd.randrange(len(self.hosts)) if spread else 0
                rows = list(parts[p])
                rnd.shuffle(rows)  # a shuffle's output comes in another order on a retry
                fail = p == failing and (every_attempt or attempt == 0) and rows
                outcome = self.attempt(run, p, host, rows, int(fail_row * len(rows)) if fail else None,
                                       kill_after_commit and attempt == 0, tid=attempt)
                if outcome in ("committed", "refused"):
                    break
            complete = complete and outcome == "committed"
        if complete and run.cluster == RIGHT:
            self.check_nothing_lost(run)

    @precondition(lambda self: bool(self.runs))
    @rule(which=st.integers(0, 100), partition=st.integers(0, 4), host=st.integers(0, 2), seed=st.integers(0, 99))
    def zombie(self, which: int, partition: int, host: int, seed: int) -> None:
        """A task of an earlier run that starts late (its driver was frozen), after later runs."""
        run = self.runs[which % len(self.runs)]
        p = partition % len(run.partitions)
        rows = list(run.partitions[p])
        random.Random(seed).shuffle(rows)
        self.attempt(run, p, host % len(self.hosts), rows, None, False, tid=9)

    @rule(host=st.integers(0, 2), max_records=st.integers(0, 20))
    def trim(self, host: int, max_records: int) -> None:
        """wal.proofMaxBytes reached on a host: the sink's own choice of which proof goes."""
        h = self.hosts[host % len(self.hosts)]
        infos = [a.info() for a in h.attempts.values()]
        candidates = trimmable(infos)
        sizes = {a.key: 16 * len(h.attempts[a.key].digests) for a in candidates}
        holding = {a.key for a in candidates if not all(h.attempts[a.key].acked)}
        for chosen in choose_trims(candidates, sizes, holding, 16 * max_records):
            h.attempts[chosen.key].trimmed = True

    def teardown(self) -> None:
        for name in self.excused:
            event(f"excused: {name}")
        for reason in self.refusals:
            event(f"refused: {reason}")
        mode = "exactly_once" if getattr(self, "exactly_once", False) else "at_least_once"
        event(f"runs: {len(self.runs)}, mode: {mode}")

    @rule()
    def expire_markers(self) -> None:
        """A week passes: the brokers drop the marker groups' offsets (and the transactional ids)."""
        self.markers[RIGHT].clear()
        self.expired = True

    @rule(host=st.integers(0, 2))
    def lose_wal(self, host: int) -> None:
        """A host's disk (its WAL) is lost, or the re-run's executor has a fresh one."""
        self.hosts[host % len(self.hosts)] = Host()

    # ---- one task attempt, as the writers carry out a plan --------------------------------------------------
    def attempt(self, run: Run, p: int, host: int, rows: list[int], fail_at: int | None, kill_after_commit: bool,
                tid: int) -> str:
        h, eo, cluster = self.hosts[host], self.exactly_once, run.cluster
        digests = [digest(cluster, v) for v in rows]
        task = rp.TaskAttempt(WRITE, p, run.run_id, eo, task_attempt_id=tid)
        key = None
        if not eo:  # at_least_once begins its entry before it reads the others
            key = self.begin(h, run, p, tid)
            task = replace(task, key=key)
        priors = tuple(a.prior() for a in h.attempts.values() if a.key != key)
        markers = self.markers[cluster]
        others = {a.partition for a in priors if a.run != run.run_id and a.partition != p}
        evidence = rp.Evidence(task=task, priors=priors, own_marker=markers.get(p) if eo else None,
                               markers={q: (markers[q],) for q in others if q in markers} if eo else {}, wal="wal")
        plan = rp.plan(evidence)
        assert not isinstance(plan, rp.Wait), "no attempt still sends in this model"
        if isinstance(plan, rp.StandDown | rp.Refuse):
            if key is not None:
                del h.attempts[key]
            if isinstance(plan, rp.Refuse):
                self.refusals["trimmed proof" if "wal.proofMaxBytes" in plan.reason else plan.reason] += 1
                return "refused"
            return "stood down"
        if isinstance(plan, rp.SkipIfCommitted):
            if fail_at is not None:
                return "failed"
            refusal = rp.judge_skipped(task, plan.marker, fingerprint(digests), len(digests), "wal")
            if refusal is not None:
                self.refusals["skipped partition's input differs"] += 1
                return "refused"
            if plan.marker.run == run.run_id:
                for a in [a for a in h.attempts.values() if a.partition == p and a.run == run.run_id]:
                    del h.attempts[a.key]
            return "committed"
        return self.send(run, p, host, plan, digests, fail_at, kill_after_commit, key, tid)

    def begin(self, h: Host, run: Run, p: int, tid: int) -> str:
        key = f"{WRITE}/{p:06d}/{next(self.keys):08d}"
        h.attempts[key] = Logged(key, p, run.run_id, self.exactly_once, tid)
        return key

    def send(self, run: Run, p: int, host: int, plan: rp.Send, digests: list[bytes], fail_at: int | None,
             kill_after_commit: bool, key: str | None, tid: int) -> str:
        h, eo, cluster = self.hosts[host], self.exactly_once, run.cluster
        delivered = DeliveredSet()
        for prior in plan.resume:
            a = h.attempts[prior.key]
            delivered.add(b"".join(a.digests), None if plan.all_acknowledged else bytes(a.acked))
        proven: Counter[bytes] = Counter()
        for prior in plan.claim:
            proven.update(h.attempts[prior.key].proof(all_acknowledged=eo))
        taken: Counter[bytes] = Counter()
        book = Book(h.claims.setdefault(run.run_id, {}))
        if key is None:
            key = self.begin(h, run, p, tid)
        mine = h.attempts[key]
        txn: list[int] = []
        for i, d in enumerate(digests):
            if fail_at is not None and i >= fail_at:
                break
            if delivered.take([d]).skip[0]:
                continue
            if proven[d]:
                [claimed], counted = claim_copies([d], p, proven, taken, book)
                taken.update(counted)
                if claimed:
                    continue
            mine.digests.append(d)
            mine.acked.append(True)
            if eo:
                txn.append(len(mine.digests) - 1)
            else:
                self.deliver(cluster, d, Copy(host, key, len(mine.digests) - 1), host, run)
        if fail_at is not None:
            if not eo:  # acknowledged, but the kill came before the last checkpoint: the documented window
                for j in range(max(0, len(mine.acked) - 2), len(mine.acked)):
                    mine.acked[j] = False
            return "failed"
        holders = {h_.key for h_ in plan.holders}
        dropped = [a.key for a in h.attempts.values()
                   if a.partition == p and a.run == run.run_id and a.key != key and a.key not in holders]
        if not eo:
            mine.state, mine.done_at = DONE, self.clock
            for a in h.attempts.values():  # the superseded attempts of the partition keep their acknowledged proof
                if a.partition == p and a.key != key and not a.exactly_once:
                    a.state = DONE
            return "committed"
        if not txn:
            for k in [key, *dropped]:
                h.attempts.pop(k, None)
            self.mark_done(h, holders)
            return "committed"
        for j in txn:
            self.deliver(cluster, mine.digests[j], Copy(host, key, j), host, run)
        names = [rp.attempt_name(k) for k in holders] + [rp.attempt_name(key)]
        self.markers[cluster][p] = Marker(write_id=WRITE, topic=TOPIC, records=plan.committed_records + len(txn),
                                          attempts=tuple(names), run=run.run_id, fingerprint=fingerprint(digests),
                                          partition=p, host=str(host), wal="wal")
        if kill_after_commit:  # killed between commit_transaction's return and the WAL's done
            return "failed"
        mine.state, mine.done_at = DONE, self.clock
        for k in dropped:
            h.attempts.pop(k, None)
        self.mark_done(h, holders)
        return "committed"

    @staticmethod
    def mark_done(h: Host, keys: set[str]) -> None:
        """A marker names these attempts: their transactions committed, whatever their WAL entries say."""
        for k in keys:
            if k in h.attempts:
                h.attempts[k].state = DONE

    # ---- the reader's view and the invariants ---------------------------------------------------------------
    def deliver(self, cluster: str, d: bytes, copy: Copy, host: int, run: Run) -> None:
        """A copy becomes visible to read_committed readers: a repeat must be excused."""
        seen = self.copies[cluster].setdefault(d, [])
        if cluster == RIGHT and self.committed[cluster][d] >= self.expected[d_value(d, self.values)]:
            self.excuse_repeat(d, seen, copy, run)
        self.committed[cluster][d] += 1
        seen.append(copy)

    def visible(self, copy: Copy, host: int) -> bool:
        """Whether a task on ``host`` can see the proof of this copy."""
        a = self.hosts[host].attempts.get(copy.key)
        return copy.host == host and a is not None and not a.trimmed and copy.index < len(a.acked) and \
            a.acked[copy.index]

    def excuse_repeat(self, d: bytes, seen: list[Copy], sent: Copy, run: Run) -> None:
        host = sent.host
        hidden = [c for c in seen if not self.visible(c, host)]
        if not hidden and self.exactly_once and self.expired and any(
                self.hosts[c.host].attempts[c.key].state != DONE for c in seen):
            self.excused["expired-markers-commit-unrecorded"] += 1
            return
        if not hidden:
            raise Violation(f"a record repeated although this host held the proof of every copy ({run.run_id})")
        if not self.exactly_once:
            self.excused["at_least_once: acknowledgement lost in the kill window" if all(
                self.window_lost(c) for c in hidden) else "at_least_once: proof on another host, lost or trimmed"] += 1
            return
        self.excused[self.gap(run, sent, seen)] += 1

    def window_lost(self, c: Copy) -> bool:
        a = self.hosts[c.host].attempts.get(c.key)
        return a is not None and not a.acked[c.index]

    def gap(self, run: Run, sent: Copy, seen: list[Copy]) -> str:
        """The known gap that excuses a repeat or a loss under exactly_once; a Violation if none does."""
        host, p = sent.host, self.hosts[sent.host].attempts[sent.key].partition
        if any(self.could_prove(c, host, run, p) and self.hosts[host].attempts[c.key].trimmed for c in seen):
            raise Violation("exactly_once sent a record whose committed copy's proof was trimmed on this host")
        if self.expired:
            return "expired-markers-proof-elsewhere"
        if any(r.shape != run.shape for r in self.runs if r.cluster == RIGHT):
            return "other-partitioning-proof-elsewhere"
        if len(self.values) != len(set(self.values)):
            return "equal-records-proof-spread"
        raise Violation(f"exactly_once repeated a record with no known gap to excuse it ({run.run_id})")

    def could_prove(self, c: Copy, host: int, run: Run, p: int) -> bool:
        """Whether ``c`` was sent from ``host`` by an attempt whose proof a task of ``run``'s partition ``p`` may
        use: any other run's, or its own partition's (a run's other partitions hold other rows, whatever their
        values)."""
        a = self.hosts[host].attempts.get(c.key) if c.host == host else None
        return a is not None and (a.run != run.run_id or a.partition == p)

    def check_nothing_lost(self, run: Run) -> None:
        for value, n in self.expected.items():
            if self.committed[RIGHT][digest(RIGHT, value)] < n:
                if n > 1 and len(self.hosts) > 1:
                    self.excused["equal-records-proof-spread"] += 1
                    continue
                raise Violation(f"record {value} lost: {self.committed[RIGHT][digest(RIGHT, value)]} of {n} "
                                f"after run {run.run_id} completed")


def d_value(d: bytes, values: list[int]) -> int:
    """The input value a right-cluster digest stands for."""
    for v in set(values):
        if digest(RIGHT, v) == d:
            return v
    raise AssertionError("a digest of no input record")


EXAMPLES = int(os.environ.get("RESUME_MODEL_EXAMPLES", "150"))
ResumeModel.TestCase.settings = settings(max_examples=EXAMPLES, stateful_step_count=12, deadline=None,
                                         suppress_health_check=[HealthCheck.too_slow], print_blob=True)
test_resume_plan_against_the_model = ResumeModel.TestCase


def test_the_named_gaps_are_the_documented_ones():
    """docs/guarantees.md's "Known gaps" and the model's exceptions are one list: each bullet there opens with the
    name of one of KNOWN_GAPS, and each of KNOWN_GAPS has its bullet."""
    import re
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[3] / "docs" / "guarantees.md").read_text()
    section = doc.split("### Known gaps\n", 1)[1].split("\n### ", 1)[0]
    bullets = [line for line in section.splitlines() if line.startswith("- ")]
    named = [m.group(1) for line in bullets if (m := re.match(r"- \*\*`([a-z-]+)`", line))]
    assert len(named) == len(bullets) and sorted(named) == sorted(KNOWN_GAPS)
