"""A scripted world for the partition writer's model (``test_writer_model.py``): Kafka clusters (data topics with their
transactions, marker groups, transactional ids, the proof topic), hosts with their WALs, Python workers that can be
killed, paused or failed at any call into the world, and time. Everything the sink itself decides runs for real: the
partition writer, both delivery modes, the ledger, the WAL on LMDB, the proof topic's records, views and claims, the
driver's proof placement; only what stands for Kafka and for processes is scripted here.

A worker's task runs in a thread of its own. Every call it makes into the world is a *step*: its budget of steps can
end in a kill (the worker's process dies: the thread freezes for good, and of what it had handed to its producer the
brokers had stored some prefix), a pause (the process lives on but stops: a zombie the model may resume later) or an
injected error (the task fails and aborts as it would on a broker's error). The model's thread waits while a task
runs; one task runs at a time.
"""

from __future__ import annotations

import random
import threading
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from confluent_kafka import KafkaError, KafkaException

from recoverable_sink.producer.marker import Marker
from recoverable_sink.producer.reports import Failure, Reports, Stopped
from recoverable_sink.proof.view import ProofView
from recoverable_sink.wal import attempt as wal_attempt


class Killed(BaseException):
    """Unwinds a frozen worker's thread when the world is torn down."""


class InjectedFault(Exception):
    """An error the world raises into a task at a chosen step (a broker's error, say): the task fails and aborts."""


# ---- hosts and workers ----------------------------------------------------------------------------------------
@dataclass
class HostState:
    name: str
    wal_path: str
    boot: str = "boot-1"
    clock_offset: float = 0.0  # the host's wall clock, stepped by the model either way


@dataclass
class Worker:
    """A Python worker process on a host."""

    host: HostState
    pid: int
    alive: bool = True
    budget: int | None = None  # steps until ``action``; None: never
    action: str = "kill"  # kill | pause | raise
    parked: threading.Event = field(default_factory=threading.Event)
    go: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)
    frozen: bool = False
    outcome: object = None  # the task's return value or exception, once done
    producer: ScriptedProducer | None = None

    @property
    def start_token(self) -> str:
        return f"start-{self.pid}"


class ScriptedHosts:
    """The hosts as :data:`recoverable_sink.wal.attempt.host` (the WAL's view of the host it runs on): each thread
    speaks for the worker it runs."""

    def __init__(self, world: World) -> None:
        self.world = world

    def _worker(self) -> Worker:
        w = self.world.current()
        assert w is not None, "the WAL was asked about its host outside a worker"
        return w

    def name(self) -> str:
        return self._worker().host.name

    def boot(self) -> str:
        return self._worker().host.boot

    def pid(self) -> int:
        return self._worker().pid

    def started(self, pid: int) -> str | None:
        found = self.world.workers.get(pid)
        if found is None or not found.alive or found.host is not self._worker().host:
            return None
        return found.start_token

    def now(self) -> float:
        return self.world.wall + self._worker().host.clock_offset


# ---- Kafka ----------------------------------------------------------------------------------------------------
@dataclass
class Txn:
    txn_id: str
    epoch: int
    state: str = "open"  # open | committed | aborted
    groups: dict[str, tuple[str, str]] = field(default_factory=dict)  # group -> (topic, metadata), pending


@dataclass
class Entry:
    offset: int
    key: bytes | None
    value: bytes | None
    txn: Txn | None
    headers: Any = None

    def visible(self) -> bool:
        """To a read_committed reader."""
        return self.txn is None or self.txn.state == "committed"


class Broker:
    """One Kafka cluster: logs per (topic, partition), marker groups (expiring), transactional ids (fencing)."""

    PARTITIONS = 2

    def __init__(self, cluster_id: str, proof_topic: str, proof_partitions: int) -> None:
        self.cluster_id = cluster_id
        self.proof_topic = proof_topic
        self.proof_partitions = proof_partitions
        self.logs: dict[tuple[str, int], list[Entry]] = {}
        self.log_start: dict[tuple[str, int], int] = {}
        self.groups: dict[str, dict[str, str]] = {}  # committed marker groups: group -> topic -> metadata
        self.epochs: dict[str, int] = {}
        self.open_txns: dict[str, Txn] = {}
        self.proof_appends: list[Entry] = []  # every record ever written to the proof topic, whatever compaction did

    def partitions(self, topic: str) -> int:
        return self.proof_partitions if topic == self.proof_topic else self.PARTITIONS

    def log(self, topic: str, partition: int) -> list[Entry]:
        return self.logs.setdefault((topic, partition), [])

    def append(self, topic: str, partition: int, key: bytes | None, value: bytes | None, txn: Txn | None,
               headers: Any = None) -> int:
        entries = self.log(topic, partition)
        offset = (entries[-1].offset + 1) if entries else self.log_start.get((topic, partition), 0)
        entry = Entry(offset, key, value, txn, headers)
        entries.append(entry)
        if topic == self.proof_topic:
            self.proof_appends.append(entry)
        return offset

    def high_watermark(self, topic: str, partition: int) -> int:
        entries = self.log(topic, partition)
        return entries[-1].offset + 1 if entries else self.log_start.get((topic, partition), 0)

    def stable(self, topic: str, partition: int) -> int:
        """The last stable offset: the first offset of an open transaction's record, or the end."""
        for e in self.log(topic, partition):
            if e.txn is not None and e.txn.state == "open":
                return e.offset
        return self.high_watermark(topic, partition)

    # transactions
    def init_transactions(self, txn_id: str) -> int:
        """A new producer of ``txn_id``: fences the previous epoch, whose open transaction is aborted."""
        self.epochs[txn_id] = self.epochs.get(txn_id, 0) + 1
        old = self.open_txns.pop(txn_id, None)
        if old is not None:
            old.state = "aborted"
        return self.epochs[txn_id]

    def fenced(self, txn: Txn) -> bool:
        return self.epochs.get(txn.txn_id) != txn.epoch

    def commit(self, txn: Txn) -> None:
        txn.state = "committed"
        self.open_txns.pop(txn.txn_id, None)
        for group, (topic, metadata) in txn.groups.items():
            self.groups.setdefault(group, {})[topic] = metadata

    def expire(self) -> None:
        """A week passes: the marker groups' offsets and the transactional ids go."""
        self.groups.clear()

    def compact(self) -> None:
        """The proof topic's cleaner: of each key, only the last record stays (aborted records go)."""
        for (topic, _partition), entries in self.logs.items():
            if topic != self.proof_topic:
                continue
            last: dict[bytes | None, int] = {}
            for e in entries:
                if e.txn is None or e.txn.state != "open":
                    last[e.key] = e.offset
            kept = [e for e in entries if (e.txn is not None and e.txn.state == "open") or
                    (last.get(e.key) == e.offset and not (e.txn is not None and e.txn.state == "aborted"))]
            entries[:] = kept

    def retain(self, keep_last: int, skip: tuple[int, ...] = ()) -> bool:
        """The proof topic's retention: all but its last ``keep_last`` records of each partition (less ``skip``) go
        (an open transaction's and those after it stay). Whether any went."""
        cut_any = False
        for (topic, partition), entries in self.logs.items():
            if topic != self.proof_topic or partition in skip or len(entries) <= keep_last:
                continue
            cut = entries[-keep_last].offset if keep_last else entries[-1].offset + 1
            cut = min([cut, *(e.offset for e in entries if e.txn is not None and e.txn.state == "open")])
            if cut > self.log_start.get((topic, partition), 0):
                self.log_start[(topic, partition)] = cut
                entries[:] = [e for e in entries if e.offset >= cut]
                cut_any = True
        return cut_any

    def visible(self, topic: str) -> list[Entry]:
        """What a read_committed consumer of a data topic sees, all partitions."""
        return [e for (t, _), entries in self.logs.items() if t == topic for e in entries if e.visible()]


# ---- the producer -----------------------------------------------------------------------------------------------
@dataclass
class Handed:
    slot: int
    index: int
    topic: str
    partition: int
    key: bytes | None
    value: bytes | None
    headers: Any


class ScriptedProducer:
    """A librdkafka producer as the sink sees it (:class:`~recoverable_sink.producer.protocol.SinkProducer`): records
    handed over wait in its queue until a poll or flush delivers them to the broker (in order); reports are kept until
    taken. Transactional when it carries a transactional id: its records then belong to the open transaction."""

    kind = "scripted"

    def __init__(self, world: World, broker: Broker, txn_id: str | None = None) -> None:
        self.world = world
        self.broker = broker
        self.txn_id = txn_id
        self.epoch: int | None = None
        self.txn: Txn | None = None
        self.queue: list[Handed] = []
        self.failures: list[Failure] = []
        self.written: list[tuple[str, int, int, int, int]] = []
        self.fatal: KafkaError | None = None
        self.delivered: list[tuple[Handed, int]] = []  # (record, offset), every one this producer delivered

    # sending
    def send(self, batch: pa.RecordBatch, topic: str | None, slot: int, rows: list[int] | None) -> int:
        self.world.step()
        self._check_fatal()
        if rows is not None:
            batch = batch.take(pa.array(rows, pa.int64()))
        names = batch.schema.names
        cols = {n: batch.column(n).to_pylist() for n in names}
        for i in range(batch.num_rows):
            t = cols["topic"][i] if "topic" in cols else topic
            assert t is not None
            key = cols["key"][i] if "key" in cols else None
            if isinstance(key, str):
                key = key.encode()
            value = cols["value"][i]
            if isinstance(value, str):
                value = value.encode()
            part = cols["partition"][i] if "partition" in cols and cols["partition"][i] is not None else None
            if part is None:
                part = zlib.crc32(key or b"") % self.broker.partitions(t)
            if self.txn_id is not None and (self.txn is None or self.txn.state != "open"):
                raise Stopped(i, KafkaException(KafkaError(KafkaError._STATE, "no open transaction")), t, part)
            self.queue.append(Handed(slot, i, t, part, key, value, cols.get("headers", [None] * (i + 1))[i]))
        return batch.num_rows

    def _check_fatal(self) -> None:
        if self.txn is not None and self.broker.fenced(self.txn):
            self.fatal = KafkaError(KafkaError._FENCED, "fenced by a newer producer instance", fatal=True)
        if self.fatal is not None:
            raise KafkaException(self.fatal)

    def deliver(self, upto: int | None = None) -> None:
        """The broker stores the first ``upto`` queued records (all by default) and acknowledges them."""
        n = len(self.queue) if upto is None else min(upto, len(self.queue))
        for h in self.queue[:n]:
            if self.txn is not None and self.txn.state != "open":
                self.failures.append(Failure(h.slot, h.index, KafkaError(KafkaError._FENCED, "fenced", fatal=True),
                                             h.topic, h.partition))
                continue
            offset = self.broker.append(h.topic, h.partition, h.key, h.value, self.txn, h.headers)
            self.delivered.append((h, offset))
            self.written.append((h.topic, h.partition, offset, offset, 1))
        del self.queue[:n]

    def take_reports(self) -> Reports:
        reports = Reports(failures=list(self.failures), written=list(self.written))
        self.failures.clear()
        self.written.clear()
        return reports

    def poll(self, timeout: float = 0) -> int:
        self.world.step()
        self._check_fatal()
        self.deliver(self.world.rng.randint(0, len(self.queue)))
        return 0

    def flush(self, timeout: float = -1) -> int:
        self.world.step()
        self._check_fatal()
        self.deliver()
        return len(self.queue)

    def __len__(self) -> int:
        return len(self.queue)

    def purge(self) -> None:
        self.queue.clear()

    def connect(self, timeout_s: float, topic: str | None = None) -> str | None:
        return None

    def partition_count(self, topic: str, timeout_s: float) -> tuple[int, KafkaError | None]:
        return self.broker.partitions(topic), None

    # transactions (used through ScriptedTransaction)
    def init_transactions(self, timeout_s: float) -> None:
        self.world.step()
        assert self.txn_id is not None
        self.epoch = self.broker.init_transactions(self.txn_id)

    def begin_transaction(self) -> None:
        assert self.txn_id is not None and self.epoch is not None
        self.txn = Txn(self.txn_id, self.epoch)
        self.broker.open_txns[self.txn_id] = self.txn

    def send_marker(self, group: str, topic: str, partition: int, offset: int, metadata: str,
                    timeout_s: float) -> None:
        self.world.step()
        self._check_fatal()
        assert self.txn is not None
        self.txn.groups[group] = (topic, metadata)

    def commit_transaction(self, timeout_s: float) -> None:
        self.world.step()
        self.deliver()
        self._check_fatal()
        assert self.txn is not None
        self.broker.commit(self.txn)
        self.world.note_commit(self.txn)

    def abort_transaction(self, timeout_s: float) -> None:
        self.queue.clear()
        if self.txn is not None and self.txn.state == "open":
            self.txn.state = "aborted"
            self.broker.open_txns.pop(self.txn.txn_id, None)


class ScriptedTransaction:
    """A partition's transaction (:class:`~recoverable_sink.executor.delivery.TransactionClient`) over the broker: as
    :class:`~recoverable_sink.producer.transactions.PartitionTransaction` does it, with the marker in the partition's
    group committed with the transaction."""

    def __init__(self, world: World, broker: Broker, prefix: str, write_id: str, partition: int, scope: str,
                 run: str | None) -> None:
        self.world = world
        self.txn_id = f"{prefix}{scope}-{partition}"
        self.write_id = write_id
        self.shared = scope != write_id
        self.producer: ScriptedProducer | None = ScriptedProducer(world, broker, self.txn_id)
        self.marker: Marker | None = None
        self.latest_batch: int | None = None
        self.in_transaction = False
        self.broker = broker

    def open(self, topic: str | None) -> Marker | None:
        assert self.producer is not None
        self.producer.init_transactions(30)
        self.world.worker_producer(self.producer)
        markers = [Marker.parse(meta) for t, meta in self.broker.groups.get(self.txn_id, {}).items()
                   if topic is None or t == topic]
        if self.shared:
            self.latest_batch = max((m.batch for m in markers if m.batch is not None), default=None)
        mine = [m for m in markers if m.write_id == self.write_id and (topic is None or (m.topic or topic) == topic)]
        if mine:
            self.marker = mine[0]
            return self.marker
        self.begin()
        return None

    def begin(self) -> None:
        assert self.producer is not None
        self.producer.begin_transaction()
        self.in_transaction = True

    def sending(self) -> None:
        """Nothing to note."""

    def timed_out(self) -> str | None:
        return None

    def commit(self, marker: Marker, timeout_s: float) -> None:
        assert self.producer is not None and marker.topic is not None
        self.producer.send_marker(self.txn_id, marker.topic, 0, marker.records, marker.encode(), timeout_s)
        self.producer.commit_transaction(timeout_s)
        self.in_transaction = False

    def abort(self) -> None:
        if self.producer is not None and self.in_transaction:
            self.producer.abort_transaction(10)
        self.in_transaction = False

    def close(self) -> None:
        """Nothing held."""

    def markers_of(self, partition: int, topic: str | None, prefix: str, scope: str) -> tuple[Marker, ...]:
        group = f"{prefix}{scope}-{partition}"
        found = [Marker.parse(meta) for t, meta in self.broker.groups.get(group, {}).items()
                 if topic is None or t == topic]
        return tuple(m for m in found if m.write_id == self.write_id and (topic is None or (m.topic or topic) == topic))


# ---- the proof topic ------------------------------------------------------------------------------------------
class ScriptedProofIO:
    """The proof topic's reads and writes (:class:`~recoverable_sink.proof.io.ProofIO`) over the broker: the two passes
    of a view as a read_uncommitted and a read_committed consumer see them."""

    def __init__(self, world: World, broker: Broker) -> None:
        self.world = world
        self.broker = broker
        self.topic = broker.proof_topic

    def ends(self, partition: int) -> tuple[int, int]:
        self.world.step()
        return self.broker.log_start.get((self.topic, partition), 0), self.broker.high_watermark(self.topic, partition)

    def stable(self, partition: int) -> int:
        self.world.step()
        return self.broker.stable(self.topic, partition)

    def read(self, partition: int, start: int, end: int, committed: bool,
             feed: Callable[[int, bytes | None, bytes | None], None]) -> None:
        """A read_uncommitted consumer sees every record; a read_committed one those of committed transactions."""
        self.world.step()
        for e in list(self.broker.log(self.topic, partition)):
            if start <= e.offset < end and (not committed or e.visible()):
                feed(e.offset, e.key, e.value)

    def key_at(self, partition: int, offset: int) -> bytes | None:
        return next((e.key for e in self.broker.log(self.topic, partition) if e.offset == offset), None)

    def fence(self, transactional_id: str) -> None:
        self.world.step()
        self.broker.init_transactions(transactional_id)
        self.world.fenced.append(transactional_id)

    def high_watermark(self, partition: int) -> int:
        self.world.step()
        return self.broker.high_watermark(self.topic, partition)

    def lookup(self, scope: str) -> dict[int, int] | None:
        from recoverable_sink.proof.format import DirectoryKey, decode_directory

        self.world.step()
        found: dict[int, int] | None = None
        key = DirectoryKey(scope).encode()
        for e in self.broker.log(self.topic, 0):
            if e.key == key and e.visible():
                found = decode_directory(e.value)
        return found

    def produce(self, records: list[tuple[int, bytes, bytes | None]], what: str) -> None:
        for partition, key, value in records:
            self.world.step()
            self.broker.append(self.topic, partition, key, value, None)

    def claim(self, partition: int, key: bytes, value: bytes) -> None:
        self.world.step()
        self.broker.append(self.topic, partition, key, value, None)

    def read_since(self, view: ProofView, partition: int, position: int) -> int:
        self.world.step()
        end = self.broker.high_watermark(self.topic, partition)
        for e in list(self.broker.log(self.topic, partition)):
            if position <= e.offset < end:
                view.first_pass(e.offset, e.key, e.value)
        return max(position, end)

    def read_limit_s(self) -> float:
        return 1.0


class VirtualClock:
    """A task's monotonic time: sleeping advances it at once, and every look moves it on a little."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.t = 0.0

    def monotonic(self) -> float:
        self.t += 0.001
        return self.t

    def sleep(self, seconds: float) -> None:
        self.world.step()
        self.t += seconds


# ---- the world --------------------------------------------------------------------------------------------------
class World:
    """Hosts, workers, clusters and the one task thread running at a time."""

    def __init__(self, rng: random.Random, root: str) -> None:
        self.rng = rng
        self.root = root
        self.hosts: list[HostState] = []
        self.workers: dict[int, Worker] = {}
        self.pids = iter(range(1000, 10**9))
        self.wall = 1_000_000.0
        self._local = threading.local()
        self.commits: list[Txn] = []
        self.threads: list[threading.Thread] = []
        self.running: Worker | None = None
        self.fenced: list[str] = []  # transactional ids a proof reader fenced

    def add_host(self, name: str, wal_path: str) -> HostState:
        host = HostState(name, wal_path)
        self.hosts.append(host)
        return host

    def worker(self, host: HostState) -> Worker:
        w = Worker(host, next(self.pids))
        self.workers[w.pid] = w
        return w

    def current(self) -> Worker | None:
        """The worker whose thread this is; on a helper thread (the WAL's), the worker now running."""
        return getattr(self._local, "worker", None) or self.running

    def worker_producer(self, producer: ScriptedProducer) -> None:
        w = self.current()
        if w is not None:
            w.producer = producer

    def note_commit(self, txn: Txn) -> None:
        self.commits.append(txn)

    # steps
    def step(self) -> None:
        """One call into the world by the current worker: its budget may end here."""
        w = getattr(self._local, "worker", None)
        if w is None:
            return
        if not w.alive:
            raise Killed()
        if w.budget is None:
            return
        w.budget -= 1
        if w.budget > 0:
            return
        w.budget = None
        if w.action == "raise":
            raise InjectedFault("an error injected at a random step")
        if w.action == "kill":
            self.kill(w)
        self._freeze(w)

    def kill(self, w: Worker) -> None:
        """SIGKILL: the process is gone; of what its producer held, the brokers had stored a prefix."""
        if w.producer is not None and w.producer.queue:
            w.producer.deliver(self.rng.randint(0, len(w.producer.queue)))
            w.producer.queue.clear()
        w.alive = False

    def _freeze(self, w: Worker) -> None:
        w.frozen = True
        w.parked.set()
        w.go.wait()
        w.go.clear()
        w.frozen = False
        if not w.alive:
            raise Killed()

    # running a task
    def run(self, w: Worker, task: Callable[[], object]) -> Worker:
        """Run ``task`` as worker ``w`` until it returns, fails, or freezes (killed or paused)."""
        def body() -> None:
            self._local.worker = w
            try:
                w.outcome = task()
            except Killed:
                w.outcome = Killed()
            except BaseException as exc:  # noqa: BLE001 - the task's failure is its outcome
                w.outcome = exc
            finally:
                w.done.set()

        thread = threading.Thread(target=body, daemon=True)
        self.threads.append(thread)
        w.parked.clear()
        self.running = w
        thread.start()
        self._wait(w)
        self.running = None
        return w

    def resume(self, w: Worker) -> Worker:
        """Let a paused worker go on, until it returns, fails or freezes again."""
        assert w.frozen and w.alive
        w.parked.clear()
        self.running = w
        w.go.set()
        self._wait(w)
        self.running = None
        return w

    def _wait(self, w: Worker) -> None:
        while not (w.done.is_set() or w.parked.is_set()):
            w.done.wait(0.01)

    def teardown(self) -> None:
        for w in self.workers.values():
            w.alive = False
            w.go.set()
        for t in self.threads:
            t.join(5)


def installed_hosts(world: World) -> Iterator[None]:
    """The WAL asks the world about its host while the model runs."""
    saved = wal_attempt.host
    wal_attempt.host = ScriptedHosts(world)
    try:
        yield
    finally:
        wal_attempt.host = saved
