"""The partition writer against a model of what a ``read_committed`` reader sees (hypothesis stateful testing).

The real writer runs (:func:`recoverable_sink.executor.task.open_writer`: both delivery modes, the resume plan, the
ledger, the WAL on LMDB in a directory per host, the proof topic's records, views and claims, the driver's proof
placement) over the scripted world of ``world.py``: brokers, a producer, a partition's transaction, the proof topic,
hosts and their clocks, Python workers killed, paused or failed at any call into the world. A sequence writes one
thing, a batch write of a small multiset of records (equal ones included) under a ``wal.writeId``, or a stream of
micro-batches, again and again: runs on random partitionings and hosts, either delivery mode in any run, records
routed by a topic option or a topic column with some of them refused into a dead-letter topic, faults at random
steps, late starts and zombies, clocks stepped either way on any host, WALs lost, proof trimmed, markers expired,
the proof topic compacted.

Invariants:
- safety: under ``exactly_once`` no record is ever visible more often than its input holds it; once a run completes,
  none is missing; under ``at_least_once`` the repeats are bounded by what their senders' proof in Kafka did not
  cover (the kill window) and by what attempts that overlapped others (zombies) sent, and a killed attempt's
  unproven records are at most two drain windows;
- liveness: a run with no fault completes (a refusal fails it), and every sequence ends with such a run.

``make unit`` runs a few sequences; ``make chaos`` the long profile (WRITER_MODEL_EXAMPLES, with the seed and the
plans seen printed). ``test_writer_model_mutants.py`` keeps mutants of the rules that this model must catch.
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import tempfile
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import event as hypothesis_event
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule

from recoverable_sink.columns import SchemaPlan
from recoverable_sink.contract import SinkCommitMessage, TaskIdentity, stream_write_id
from recoverable_sink.driver import proof_place
from recoverable_sink.executor import partition_writer
from recoverable_sink.executor.attempt_log import AttemptLog
from recoverable_sink.executor.kafka_proof import KafkaProofLog
from recoverable_sink.executor.retention import sweep
from recoverable_sink.executor.task import open_writer
from recoverable_sink.options import KafkaProof, parse_options
from recoverable_sink.proof.format import ChunkKey, decode_chunk, parse_key
from recoverable_sink.wal import close_wal, open_wal
from tests.unit.executor.world import (
    Broker,
    Killed,
    ScriptedProducer,
    ScriptedProofIO,
    ScriptedTransaction,
    VirtualClock,
    World,
    installed_hosts,
)

PREFIX = "m-"
PROOF_TOPIC = "m-proof"
PROOF_PARTITIONS = 3
DLQ = "dlq"
WINDOW = 3  # CHECKPOINT_MAX_RECORDS in the model, so that a drain window is a few of its records
MAX_ATTEMPTS = 4  # spark.task.maxFailures
OVERSIZE = 2_000  # bytes of a value the data topics refuse (their max.message.bytes is 1000 in the model)


class Violation(AssertionError):
    pass


PLANS: Counter[str] = Counter()  # every plan the real writer followed, across the sequences of a session
PLANS_SEEN: Counter[str] = Counter()
EVENTS: Counter[str] = Counter()  # what the sequences did (runs, attempts, faults' outcomes), for the statistics


def event(name: str) -> None:
    hypothesis_event(name)
    EVENTS[name] += 1


def counting(real):  # the plan each writer follows, counted
    def counted(evidence):
        found = real(evidence)
        PLANS[type(found).__name__] += 1
        return found
    return counted


class WriterModel(RuleBasedStateMachine):
    """One write (or one stream) through runs and faults; see the module's docstring."""

    def __init__(self) -> None:
        super().__init__()
        self.root = tempfile.mkdtemp(prefix="writer-model-")
        self.world = World(random.Random(0), self.root)
        self._hosts_ctx = installed_hosts(self.world)
        next(self._hosts_ctx)
        self.broker = Broker("cluster-a", PROOF_TOPIC, PROOF_PARTITIONS)
        self.wrong = Broker("cluster-b", PROOF_TOPIC, PROOF_PARTITIONS)
        self.runs = 0
        self.expected: Counter[tuple[str, bytes, bytes]] = Counter()
        self.completed_inputs: list[list[int]] = []
        self.paused: list = []
        self.attempts: list[dict] = []  # every attempt: worker, mode, killed, zombie
        self.retained_cut = False  # the proof topic's retention deleted some of the write's proof
        self.accept_expired = False  # proof.failOnExpired=false: the named recovery, which accepts repeats
        self.undecidable = False  # refused by fingerprint with the digests deleted: no run of this write completes
        self.batch = 0  # a stream's micro-batch
        self.parts_of: dict[int, list[list[int]]] = {}  # each completed (micro-)batch's partitioning
        # The model's drain windows are a few records; each plan the writer follows is counted.
        self.plans_before = Counter(PLANS)
        self.plans_seen = PLANS_SEEN
        self.restore = [(partition_writer, "CHECKPOINT_MAX_RECORDS", partition_writer.CHECKPOINT_MAX_RECORDS),
                        (partition_writer, "plan", partition_writer.plan)]
        partition_writer.CHECKPOINT_MAX_RECORDS = WINDOW
        partition_writer.plan = counting(partition_writer.plan)
        logging.getLogger("recoverable_sink").setLevel(logging.WARNING)  # thousands of tasks' progress lines

    # ---- set-up ---------------------------------------------------------------------------------------------
    RUN = dict(partitions=st.integers(1, 4), exactly_once=st.booleans(), seed=st.integers(0, 2**16),
               faults=st.lists(st.tuples(st.integers(0, 3), st.integers(1, 14),
                                         st.sampled_from(["kill", "pause", "raise"]), st.booleans()), max_size=3),
               spread=st.booleans(), wrong=st.sampled_from([False] * 7 + [True]))

    @initialize(values=st.lists(st.integers(0, 12), min_size=3, max_size=14), stream=st.booleans(),
                hosts=st.integers(1, 3), column=st.booleans(), dead_letters=st.booleans(), seed=st.integers(0, 2**16),
                first=st.fixed_dictionaries(RUN), generated=st.booleans())
    def start(self, values, stream, hosts, column, dead_letters, seed, first, generated) -> None:
        """The write's input, where its records go and the hosts; every sequence begins with a run, often a faulty
        one. ``generated``: a batch write's first run has no wal.writeId (its id generated); the later runs re-run it
        under that id, as its abort says to."""
        self.world.rng.seed(seed)
        self.values = values
        self.stream = stream
        self.column = column
        self.dead_letters = dead_letters
        for i in range(hosts):
            self.world.add_host(f"host-{i}", os.path.join(self.root, f"wal-{i}"))
        self.write_id = "w-model"
        self.query = "q-model"
        self.generated_pending = generated and not stream
        self.generated_committed = False
        event(f"sequence: {'stream' if stream else 'batch write'}, {'topic column' if column else 'topic option'}"
              f"{', dead letters' if dead_letters else ''}, {hosts} host(s)"
              f"{', first run under a generated id' if self.generated_pending else ''}")
        if self.generated_pending and not first["faults"]:
            # A generated id is re-run only once its write failed: the first run fails in one partition.
            first = {**first, "faults": [(0, 3, "raise", True)]}
        self.run(**first)

    # ---- what the input is and where it goes --------------------------------------------------------------------
    def rows_for(self, batch: int) -> list[int]:
        """The input of a batch write (batch 0), or of one micro-batch: its own records."""
        return [v + 100 * batch for v in self.values]

    def destination(self, v: int) -> tuple[str, bytes, bytes]:
        key, value = f"k{v}".encode(), self.value_of(v)
        topic = self.topic_of(v)
        if self.dead_letters and (topic is None or len(value) > 1000):
            return DLQ, key, value
        assert topic is not None
        return topic, key, value

    def value_of(self, v: int) -> bytes:
        return (b"x" * OVERSIZE + b"%d" % v) if self.dead_letters and v % 5 == 3 else b"v%d" % v

    def topic_of(self, v: int) -> str | None:
        if not self.column:
            return "t"
        if self.dead_letters and v % 7 == 6:
            return None
        return "t1" if v % 2 else "t2"

    def arrow(self, rows: list[int]) -> list[pa.RecordBatch]:
        """The input as Spark hands it over: Arrow batches of a few rows, typed as the DataFrame's columns."""
        out = []
        for i in range(0, len(rows), 2):
            part = rows[i:i + 2]
            arrays = [pa.array([f"k{v}".encode() for v in part], pa.binary()),
                      pa.array([self.value_of(v) for v in part], pa.binary())]
            names = ["key", "value"]
            if self.column:
                arrays.append(pa.array([self.topic_of(v) for v in part], pa.string()))
                names.append("topic")
            out.append(pa.RecordBatch.from_arrays(arrays, names=names))
        return out

    def options(self, mode: str, host, wrong: bool, generated: bool = False):
        conf = {"kafka.bootstrap.servers": "scripted:9092", "delivery.guarantee": mode, "wal.path": host.wal_path,
                "transactional.id.prefix": PREFIX, "kafka.delivery.timeout.ms": "200", "wal.retentionHours": "1"}
        if not self.column:
            conf["topic"] = "t"
        if not self.stream and not generated:
            conf["wal.writeId"] = self.write_id
        if self.dead_letters:
            conf.update({"errors.tolerance": "all", "errors.deadletterqueue.topic.name": DLQ})
        if self.accept_expired:
            conf["proof.failOnExpired"] = "false"
        options = parse_options(conf)
        assert isinstance(options.proof, KafkaProof)
        # The data topics take records of up to 1000 bytes (their max.message.bytes); the dead-letter topic more.
        return replace(options, proof=replace(options.proof, topic=PROOF_TOPIC, known_partitions=PROOF_PARTITIONS),
                       topic_max_message_bytes=None if self.column else 1000)

    # ---- runs -----------------------------------------------------------------------------------------------
    @rule(**RUN)
    def run(self, partitions, exactly_once, seed, faults, spread, wrong) -> None:
        """One run of the write (a stream: of its current micro-batch): a new driver-side writer, the rows split at
        random, each partition attempted until it commits or Spark gives up; ``faults``: (partition, step, what,
        in every attempt)."""
        self.timeout_paused()
        mode = "exactly_once" if exactly_once else "at_least_once"
        complete = self.one_run(partitions, mode, seed, faults, spread, wrong)
        if not faults and not wrong and not complete:
            if self.undecidable:
                return  # refused for good, as before: the recovery it names is another partitioning or a new write id
            if not self.retained_cut or self.accept_expired:
                raise Violation("liveness: a run with no fault did not complete")
            # Refused because the retention deleted proof: the refusal's recovery must complete the write.
            self.accept_expired = True
            if not self.one_run(partitions, mode, seed, [], spread, False) and not self.undecidable:
                raise Violation("liveness: the recovery a refusal named (proof.failOnExpired=false) did not complete")

    def timeout_paused(self) -> None:
        """Between runs a paused transaction outlives kafka.transaction.timeout.ms: the brokers abort it."""
        for w in self.paused:
            if w.producer is not None and w.producer.txn is not None and w.producer.txn.state == "open":
                w.producer.txn.state = "aborted"
                w.producer.broker.open_txns.pop(w.producer.txn.txn_id, None)

    def one_run(self, partitions, mode, seed, faults, spread, wrong) -> bool:
        if self.generated_committed:
            return True  # a committed write under a generated id is done: nothing names it to re-run it
        generated, self.generated_pending = self.generated_pending, False
        rnd = random.Random(seed)
        broker = self.wrong if wrong else self.broker
        self.runs += 1
        run_id = f"run-{self.runs}"
        batch = self.batch if self.stream else 0
        rows = self.rows_for(batch)
        shuffled = list(rows)
        rnd.shuffle(shuffled)
        cuts = sorted(rnd.randint(0, len(shuffled)) for _ in range(partitions - 1))
        parts = [shuffled[a:b] for a, b in zip([0, *cuts], [*cuts, len(shuffled)], strict=True)]
        io = ScriptedProofIO(self.world, broker)
        driver_options = self.options(mode, self.world.hosts[0], wrong, generated)
        start = None if self.stream else proof_place.start_for(driver_options, self.write_id, generated, io)
        messages: list[SinkCommitMessage | None] = []
        complete = True
        fault = {p % partitions: (step, what, every) for p, step, what, every in faults}
        tid = 1000 * self.runs
        for p in rnd.sample(range(partitions), partitions):
            done = None
            for attempt in range(MAX_ATTEMPTS):
                host = self.world.hosts[rnd.randrange(len(self.world.hosts)) if spread else 0]
                part_rows = list(parts[p])
                rnd.shuffle(part_rows)  # a shuffle's output comes in another order on a retry
                found = fault.get(p)
                budget = found[:2] if found is not None and (attempt == 0 or found[2]) else None
                tid += 1
                outcome = self.attempt(broker, mode, host, run_id, batch, p, attempt, tid, part_rows, start, budget,
                                       wrong, generated)
                if isinstance(outcome, SinkCommitMessage):
                    done = outcome
                    break
            messages.append(done)
            complete = complete and done is not None
        if self.stream:
            if complete:
                proof_place.advance_stream(driver_options, messages, io)
        elif complete:
            proof_place.finish_write(driver_options, self.write_id, start, generated, messages, io)
            self.generated_committed = generated and not wrong
        else:
            proof_place.refresh_entry(driver_options, self.write_id, start, io)
        if complete and not wrong:
            self.parts_of[batch] = parts
            if batch == len(self.completed_inputs):  # the write's (or micro-batch's) first completion
                self.completed_inputs.append(rows)
                for v in rows:
                    self.expected[self.destination(v)] += 1
            self.check_nothing_lost()
            if self.stream:
                self.batch += 1
        event(f"run: {mode}, {partitions} partition(s), {'complete' if complete else 'failed'}")
        return complete

    def attempt(self, broker, mode, host, run_id, batch, partition, attempt, tid, rows, start, budget,
                wrong, generated=False) -> object:
        options = self.options(mode, host, wrong, generated)
        if self.stream:
            ident = TaskIdentity(write_id=stream_write_id(self.query, batch), partition=partition, attempt=attempt,
                                 kind="stream", run=run_id, task_attempt_id=tid, query_id=self.query, batch_id=batch)
        else:
            ident = TaskIdentity(write_id=self.write_id, partition=partition, attempt=attempt, kind="batch",
                                 run=run_id, task_attempt_id=tid, generated=generated)
        worker = self.world.worker(host)
        if budget is not None:
            worker.budget, worker.action = budget
        record = {"worker": worker, "mode": mode, "zombie": False, "name": None}
        self.attempts.append(record)
        plan = SchemaPlan(columns=("key", "value", "topic") if self.column else ("key", "value"),
                          topic_option=None if self.column else "t")
        io = ScriptedProofIO(self.world, broker)

        def task() -> object:
            transaction = ScriptedTransaction(self.world, broker, PREFIX, ident.write_id, partition,
                                              ident.transaction_scope, run_id) if mode == "exactly_once" else None
            producer = None
            if transaction is None:
                producer = ScriptedProducer(self.world, broker)
                self.world.worker_producer(producer)
            writer = open_writer(
                options, plan, ident, broker.cluster_id, producer, transaction=transaction,
                markers=(lambda p, t: transaction.markers_of(p, t, PREFIX, ident.transaction_scope))
                if transaction is not None else None,
                log=AttemptLog.open(options, ident),
                proof=KafkaProofLog(options, options.proof, ident, start, io), clock=VirtualClock(self.world),
                topic_max=lambda topic: None if topic == DLQ else 1000)
            record["name"] = writer.log.key
            try:
                for b in self.arrow(rows):
                    writer.write(b)
                return writer.commit()
            except BaseException:
                writer.abort()
                raise

        before, released = Counter(self.visible_all()), self.released(broker)
        self.world.run(worker, task)
        self.check_added(before, mode)
        self.check_released_once(record, released)
        if worker.frozen:
            if worker.alive:
                # Paused, its process alive: whatever runs meanwhile overlaps it (a zombie, or an attempt the final
                # delivery wait gave up on), and what it delivered but had not yet proven can be repeated.
                record["zombie"] = True
                self.paused.append(worker)
                event(f"attempt: {mode}, paused")
                return "paused"
            self.check_kill_window(record)
            event(f"attempt: {mode}, killed")
            return "killed"
        outcome = worker.outcome
        event(f"attempt: {mode}, {type(outcome).__name__}")
        if isinstance(outcome, BaseException) and not isinstance(outcome, Killed):
            from recoverable_sink.errors import RerunRefusedError

            if isinstance(outcome, RerunRefusedError) and not (self.retained_cut and "retention" in str(outcome)):
                raise Violation(f"liveness: a refusal with the proof still in Kafka: {outcome}")
            if isinstance(outcome, RerunRefusedError) and "fingerprint" in str(outcome):
                # A partition a marker names whose input differs, its digests deleted: no run of this write can tell
                # what to send (the refusal's recovery is another partitioning or a new write id).
                self.undecidable = True
        return outcome

    @precondition(lambda self: bool(self.paused))
    @rule(which=st.integers(0, 100), kill=st.booleans())
    def zombie(self, which, kill) -> None:
        """A paused worker (its process alive: a zombie) goes on, or its process dies."""
        w = self.paused.pop(which % len(self.paused))
        if kill:
            self.world.kill(w)
            return
        before = Counter(self.visible_all())
        self.world.resume(w)
        mode = next(r["mode"] for r in self.attempts if r["worker"] is w)
        self.check_added(before, mode)
        if w.frozen and w.alive:
            self.paused.append(w)

    @precondition(lambda self: self.stream and bool(self.parts_of))
    @rule(partition=st.integers(0, 3), back=st.integers(1, 2), exactly_once=st.booleans())
    def late_micro_batch(self, partition, back, exactly_once) -> None:
        """A task of a committed micro-batch starts only now (its driver was frozen, as it planned that micro-batch):
        whether the query moved past it or not, it must send nothing."""
        batch = self.batch - back
        if batch not in self.parts_of:
            return
        parts = self.parts_of[batch]
        before = Counter(self.visible_all())
        host = self.world.hosts[0]
        outcome = self.attempt(self.broker, "exactly_once" if exactly_once else "at_least_once", host,
                               f"run-late-{batch}", batch, partition % len(parts), 0, 1, parts[partition % len(parts)],
                               None, None, False)
        # exactly_once: the committed micro-batch's marker and proof say it is there. at_least_once: what its tasks
        # delivered but never proved (a kill's window, this host's WAL lost) may go again, which the accounting at the
        # end holds to its bound; once the query moved past the micro-batch, nothing at all, unless the retention
        # deleted the later micro-batches' proof too (a task late by longer than proof.retentionHours).
        moved_past = self.batch - batch > 1 and (exactly_once or not self.retained_cut)
        if (exactly_once or moved_past) and Counter(self.visible_all()) != before:
            raise Violation("a task of a committed micro-batch sent records")
        if moved_past and not isinstance(outcome, BaseException):
            raise Violation("a task of a micro-batch the query had moved past did not stand down")
        event(f"late micro-batch task: {type(outcome).__name__}")

    @rule(host=st.integers(0, 2), seconds=st.sampled_from([-86400 * 30, -3600, 3600, 86400 * 30]))
    def step_clock(self, host, seconds) -> None:
        """An NTP step, a VM resumed: a host's wall clock jumps either way."""
        self.world.hosts[host % len(self.world.hosts)].clock_offset += seconds

    @rule(host=st.integers(0, 2), budget=st.integers(1, 400))
    def trim(self, host, budget) -> None:
        """A task on a host sweeps its WAL with wal.proofMaxBytes reached."""
        h = self.world.hosts[host % len(self.world.hosts)]
        if not os.path.exists(h.wal_path):
            return
        w = self.world.worker(h)
        self.world.run(w, lambda: sweep(open_wal(h.wal_path), 3600, proof_max_bytes=budget))

    @rule()
    def expire_markers(self) -> None:
        """A week passes: the brokers drop the marker groups' offsets and the transactional ids."""
        self.broker.expire()

    @rule()
    def compact(self) -> None:
        self.broker.compact()

    @rule(keep=st.integers(0, 8))
    def expire_proof(self, keep) -> None:
        """The proof topic's retention deletes the oldest proof (never the directory, whose entries each run writes
        again after its proof)."""
        if self.broker.retain(keep, skip=(0,)):
            self.retained_cut = True
            event("proof deleted by retention")

    @rule(host=st.integers(0, 2))
    def lose_wal(self, host) -> None:
        """A host's disk is lost (or the re-run's executor has a fresh one)."""
        h = self.world.hosts[host % len(self.world.hosts)]
        if any(w.host is h and w.frozen for w in self.world.workers.values()):
            return  # a frozen worker still holds it open
        close_wal(h.wal_path)
        shutil.rmtree(h.wal_path, ignore_errors=True)

    # ---- invariants -----------------------------------------------------------------------------------------
    def visible_all(self) -> list[tuple[str, bytes, bytes]]:
        return [(t, e.key or b"", e.value or b"") for (t, _), entries in self.broker.logs.items()
                if t != PROOF_TOPIC for e in entries if e.visible()]

    def check_added(self, before: Counter, mode: str) -> None:
        """exactly_once, in a sequence of exactly_once runs only: an attempt makes no record visible more often than
        the input holds it, at any moment. (Where at_least_once runs mix in, what they delivered but never proved is
        theirs to repeat: the accounting at the end, :meth:`check_repeats`, holds both modes to it.)"""
        if mode != "exactly_once" or self.accept_expired or any(r["mode"] != "exactly_once" for r in self.attempts):
            return
        limit = Counter(self.expected)
        for b in range(len(self.completed_inputs), self.batch + 1 if self.stream else 1):
            for v in self.rows_for(b):
                limit[self.destination(v)] += 1
        seen = Counter(self.visible_all())
        over = {r: n for r, n in seen.items() if n > max(limit[r], before[r])}
        if over:
            raise Violation(f"exactly_once: records made visible more often than the input holds them: {over}")

    @staticmethod
    def released(broker) -> set[bytes]:
        """The proof topic's keys whose latest record a reader sees is a tombstone: released proof."""
        last: dict[bytes, bytes | None] = {}
        for (t, _), entries in broker.logs.items():
            if t == PROOF_TOPIC:
                last.update((e.key, e.value) for e in entries if e.visible() and e.key is not None)
        return {k for k, v in last.items() if v is None}

    def check_released_once(self, record: dict, released: set[bytes]) -> None:
        """The proof topic stays bounded: an attempt tombstones no key whose release it could read (one that does
        would have each micro-batch release again every key the ones before it had, without end)."""
        w = record["worker"]
        again = [h.key for h, _ in (w.producer.delivered if w.producer is not None else ())
                 if h.topic == PROOF_TOPIC and h.value is None and h.key in released]
        if again:
            raise Violation(f"proof released again: {len(again)} tombstones of keys already tombstoned, e.g. "
                            f"{again[0]!r}")

    def check_nothing_lost(self) -> None:
        seen = Counter(self.visible_all())
        lost = {r: n for r, n in self.expected.items() if seen[r] < n}
        if lost:
            raise Violation(f"records lost after a run completed: {lost}")

    def proven(self, name: str | None) -> int:
        """Acknowledged records of an attempt that its chunks in the proof topic ever held (a segment's records once,
        whichever of its chunks said most)."""
        if name is None:
            return 0
        attempt = name.rsplit("/", 1)[-1]
        acked: dict[int, int] = {}
        for b in (self.broker, self.wrong):
            for e in b.proof_appends:
                key = parse_key(e.key)
                if isinstance(key, ChunkKey) and key.attempt == attempt and not key.exactly_once and e.value:
                    chunk = decode_chunk(e.value)
                    for s in chunk.segments if chunk is not None else ():
                        acked[s.first] = max(acked.get(s.first, 0), sum(s.acked))
        return sum(acked.values())

    def delivered(self, record: dict) -> int:
        w = record["worker"]
        if w.producer is None:
            return 0
        return sum(1 for h, _ in w.producer.delivered if h.topic != PROOF_TOPIC and h.value is not None)

    def check_kill_window(self, record: dict) -> None:
        """A killed at_least_once attempt's records that its proof in Kafka does not cover are at most two drain
        windows (each at most WINDOW records, plus a segment of at most WINDOW)."""
        if record["mode"] != "at_least_once":
            return
        unproven = self.delivered(record) - self.proven(record["name"])
        if unproven > 4 * WINDOW:
            raise Violation(f"a kill left {unproven} delivered records without proof in Kafka (bound {4 * WINDOW})")

    def teardown(self) -> None:
        try:
            if getattr(self, "values", None) is not None:
                self.final_run()
        finally:
            for name, n in (PLANS - self.plans_before).items():
                event(f"plan followed: {name}")
                self.plans_seen[name] += n
            self.world.teardown()
            for h in self.world.hosts:
                close_wal(h.wal_path)
            next(self._hosts_ctx, None)
            for module, name, value in self.restore:
                setattr(module, name, value)
            shutil.rmtree(self.root, ignore_errors=True)

    def final_run(self) -> None:
        """Liveness: once the faults are over, a run with none completes the write (a stream's current micro-batch),
        and then no record is missing and none repeats beyond its bound."""
        self.timeout_paused()
        for w in list(self.paused):
            self.world.kill(w)
        self.paused.clear()
        rnd = self.world.rng
        self.accept_expired = self.retained_cut  # else a run after the retention may be refused, as it should
        if not self.one_run(rnd.randint(1, 4), rnd.choice(["at_least_once", "exactly_once"]), rnd.randint(0, 99), [],
                            True, False):
            if self.undecidable:
                event("refused for good: a marker's partition differs and the retention deleted its digests")
                return
            raise Violation("liveness: the final run with no fault did not complete")
        if not self.accept_expired:  # with proof.failOnExpired=false the user accepted repeats of deleted proof
            self.check_repeats()

    def check_repeats(self) -> None:
        """at_least_once: what repeats is bounded by what its senders' proof did not cover and what zombies sent."""
        seen = Counter(self.visible_all())
        excess = sum(max(0, seen[r] - n) for r, n in self.expected.items())
        excess += sum(n for r, n in seen.items() if r not in self.expected)
        allowed = 0
        for record in self.attempts:
            if record["mode"] != "at_least_once":
                continue
            sent = self.delivered(record)
            allowed += sent if record["zombie"] else max(0, sent - self.proven(record["name"]))
        if excess > allowed:
            raise Violation(f"{excess} repeated records, more than the {allowed} their senders' proof did not cover")
        event(f"repeats: {'none' if not excess else 'within the bound'}")


EXAMPLES = int(os.environ.get("WRITER_MODEL_EXAMPLES", "40"))
WriterModel.TestCase.settings = settings(max_examples=EXAMPLES, stateful_step_count=12, deadline=None,
                                         suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
                                         print_blob=True)


test_the_writer_against_the_model = WriterModel.TestCase


@pytest.fixture(scope="module", autouse=True)
def statistics():
    """The plans the real writer followed across every sequence, kept beside the chaos results (the long profile's
    figures for docs/guarantees.md): build/chaos/writer-model.json."""
    yield
    if not PLANS_SEEN:
        return
    out = Path(__file__).resolve().parents[3] / "build" / "chaos" / "writer-model.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    stats = {"examples": EXAMPLES, "seed": os.environ.get("WRITER_MODEL_SEED"), "plans": dict(PLANS_SEEN),
             "events": dict(sorted(EVENTS.items()))}
    out.write_text(json.dumps(stats, indent=2) + "\n")
