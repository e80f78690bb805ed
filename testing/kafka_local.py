"""Start real Apache Kafka brokers (KRaft, ``kafka.Kafka`` from Maven Central's jars) on 127.0.0.1.

Used by ``make kafka-up``/``kafka-down``, the tests' fixtures, the demo, the chaos campaign and the
benchmark. No Docker: ``make setup`` resolves the jars from ``jars/broker-pom.xml`` into build/kafka/libs.

    python -m testing.kafka_local up      # one broker on 127.0.0.1:${KAFKA_PORT:-9092}, idempotent
    python -m testing.kafka_local down    # idempotent
    python -m testing.kafka_local status  # exit 0 when up, 1 when not
"""

from __future__ import annotations

import argparse
import base64
import logging
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

log = logging.getLogger("testing.kafka_local")

REPO = Path(__file__).resolve().parent.parent
LIBS = REPO / "build" / "kafka" / "libs"
# The development broker's directory; overridable so that a second one (another port) can run beside it.
LOCAL_ROOT = Path(os.environ.get("KAFKA_LOCAL_DIR", REPO / "build" / "kafka" / "local"))
JVM_HEAP = ["-Xms256m", "-Xmx512m"]
C = TypeVar("C", bound="KafkaCluster")


def free_port() -> int:
    """A port that is free on 127.0.0.1 now (the kernel picks it when binding to port 0)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the JVM does: TIME_WAIT is no obstacle
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, but someone else's
        return True
    try:  # a zombie (exited, not yet reaped) is not alive
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return []


def _new_cluster_id() -> str:
    # Kafka's own Uuid.randomUuid() never starts with "-" so that it cannot be read as a CLI flag; same here.
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cid.startswith("-"):
            return cid


@dataclass(frozen=True)
class BrokerAnswer:
    """A broker's answer to a Metadata request: the node that answered (-1 if it does not list the address asked),
    the nodes it lists (id -> host, port) and the cluster id."""

    orig_broker_id: int
    brokers: dict[int, tuple[str, int]]
    cluster_id: str | None


# Metadata v4: the oldest version Kafka 4 still serves (KIP-896 removed v0-v3) and the last before the flexible
# encoding, so a few struct calls read it. This probe needs no Kafka client: `make kafka-up` runs without the
# repository's virtualenv.
_METADATA_KEY, _METADATA_VERSION = 3, 4


def _metadata_request() -> bytes:
    client = b"testing.kafka_local"
    # Header v1 (api key, version, correlation id, client id), then no topics and no auto-creation.
    body = struct.pack(">hhih", _METADATA_KEY, _METADATA_VERSION, 1, len(client)) + client + struct.pack(">ib", 0, 0)
    return struct.pack(">i", len(body)) + body


def _read_exactly(sock: socket.socket, n: int) -> bytes:
    chunks = []
    while n:
        chunk = sock.recv(n)
        if not chunk:
            raise ConnectionError("the broker closed the connection")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def _ask_metadata(host: str, port: int, timeout_s: float) -> BrokerAnswer:
    with socket.create_connection((host, port), timeout=timeout_s) as sock:
        sock.settimeout(timeout_s)
        sock.sendall(_metadata_request())
        (size,) = struct.unpack(">i", _read_exactly(sock, 4))
        data = _read_exactly(sock, size)
    at = 8  # the correlation id, then the throttle time

    def take(fmt: str) -> int:
        nonlocal at
        (value,) = struct.unpack_from(fmt, data, at)
        at += struct.calcsize(fmt)
        return value

    def string() -> str | None:
        nonlocal at
        n = take(">h")
        if n < 0:
            return None
        at += n
        return data[at - n:at].decode()

    brokers = {}
    for _ in range(take(">i")):
        node, node_host, node_port, _rack = take(">i"), string(), take(">i"), string()
        brokers[node] = (node_host or "", node_port)
    answered = next((n for n, (h, p) in brokers.items() if p == port and h in (host, "localhost", "127.0.0.1")), -1)
    return BrokerAnswer(answered, brokers, string())


def metadata(bootstrap: str, timeout_s: float = 2) -> BrokerAnswer | None:
    """The metadata the first address of ``bootstrap`` to answer gives, or None when none answers within
    ``timeout_s`` (PLAINTEXT listeners only)."""
    deadline = time.monotonic() + timeout_s
    for address in (a.strip() for a in bootstrap.split(",") if a.strip()):
        host, _, port = address.rpartition(":")
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        try:
            return _ask_metadata(host.strip("[]"), int(port), remaining)
        except (OSError, ValueError, struct.error):
            continue
    return None


def create_topic(bootstrap: str, name: str, partitions: int = 1, replication_factor: int | None = None,
                 config: dict[str, str] | None = None, timeout_s: float = 30) -> str:
    """Create ``name`` and wait until every partition's leader answers for it. ``replication_factor`` None
    means the brokers' default (so it works on any cluster, whatever its size)."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    topic = NewTopic(name, partitions, -1 if replication_factor is None else replication_factor,
                     config=config or {})
    admin.create_topics([topic], operation_timeout=timeout_s, request_timeout=timeout_s)[name].result()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        meta = admin.list_topics(name, timeout=5).topics.get(name)
        if meta is not None and meta.error is None and len(meta.partitions) == partitions and \
                all(p.leader >= 0 for p in meta.partitions.values()) and _logs_open(bootstrap, name, partitions):
            return name
        time.sleep(0.1)
    raise TimeoutError(f"topic {name} is not served by a leader on every partition after {timeout_s}s")


def _logs_open(bootstrap: str, topic: str, partitions: int) -> bool:
    """Whether every partition answers ListOffsets. A leader in the metadata does not mean its log is open yet:
    a first request a moment too early gets NOT_LEADER_FOR_PARTITION, and an idempotent Java producer then
    spins on OUT_OF_ORDER_SEQUENCE_NUMBER until delivery.timeout.ms (KAFKA-15591)."""
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"ready-{uuid.uuid4().hex}"})
    try:
        for p in range(partitions):
            consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=5)
        return True
    except KafkaException:
        return False
    finally:
        consumer.close()


class KafkaCluster:
    """``num_brokers`` combined broker+controller KRaft nodes on 127.0.0.1 (node ids 1..n), data, logs and pid
    files under ``root``, so that another process can find and stop them."""

    def __init__(self, root: Path, num_brokers: int = 1, port: int | None = None,
                 broker_props: dict[str, str] | None = None, kafka_defaults: bool = False) -> None:
        if num_brokers < 1:
            raise ValueError("num_brokers must be at least 1")
        if port is not None and num_brokers != 1:
            raise ValueError("port can only be given for a single broker")
        self.root = Path(root)
        self.n = num_brokers
        self.extra = dict(broker_props or {})
        # Apache Kafka's own defaults (what `make kafka-up` starts), rather than the test suite's settings below.
        self.kafka_defaults = kafka_defaults
        self.format_args: list[str] = []  # extra `kafka-storage format` arguments (e.g. --add-scram)
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        saved = self._saved_ports()
        if saved is not None:  # started before, maybe by another process: the same ports
            self.ports, self.controller_ports = saved
        else:
            self.ports = [port] if port is not None else [free_port() for _ in range(self.n)]
            self.controller_ports = [free_port() for _ in range(self.n)]
        if port is not None and self.ports != [port]:
            self.ports = [port]

    # ---- layout ---------------------------------------------------------------------------------------
    @property
    def bootstrap_servers(self) -> str:
        return ",".join(f"127.0.0.1:{p}" for p in self.ports)

    @property
    def node_ids(self) -> list[int]:
        return list(range(1, self.n + 1))

    def broker_port(self, node_id: int) -> int:
        return self.ports[node_id - 1]

    def node_dir(self, node_id: int) -> Path:
        return self.root / f"node{node_id}"

    def log_file(self, node_id: int) -> Path:
        return self.node_dir(node_id) / "broker.log"

    def _props_file(self, node_id: int) -> Path:
        return self.node_dir(node_id) / "server.properties"

    def _pid_file(self, node_id: int) -> Path:
        return self.node_dir(node_id) / "pid"

    def _saved_ports(self) -> tuple[list[int], list[int]] | None:
        try:
            saved = [int(p) for p in (self.root / "ports").read_text().split()]
        except (OSError, ValueError):
            return None
        return (saved[: self.n], saved[self.n:]) if len(saved) == 2 * self.n else None

    def _cluster_id(self) -> str:
        """One id for all nodes: the saved one, else one a node was already formatted with, else a new one."""
        id_file = self.root / "cluster.id"
        if id_file.exists():
            return id_file.read_text().strip()
        for node in self.node_ids:
            meta = self.node_dir(node) / "data" / "meta.properties"
            if meta.exists():
                for line in meta.read_text().splitlines():
                    if line.startswith("cluster.id="):
                        return line.split("=", 1)[1].strip()
        cid = _new_cluster_id()
        id_file.write_text(cid)
        return cid

    def _write_props(self, node_id: int) -> None:
        n = self.n
        voters = ",".join(f"{i}@127.0.0.1:{self.controller_ports[i - 1]}" for i in self.node_ids)
        node = {
            "process.roles": "broker,controller",
            "node.id": str(node_id),
            "controller.quorum.voters": voters,
            "listeners": f"PLAINTEXT://127.0.0.1:{self.broker_port(node_id)},"
                         f"CONTROLLER://127.0.0.1:{self.controller_ports[node_id - 1]}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.broker_port(node_id)}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(self.node_dir(node_id) / "data"),
        }
        props = {
            **node,
            # A misspelt topic fails in the tests instead of being created; tests of auto-creation use kafka_defaults.
            "auto.create.topics.enable": "false",
            "num.partitions": "1",
            "offsets.topic.replication.factor": str(min(3, n)),
            # Fewer internal partitions than the default 50: faster first group join on a 2-core machine.
            "offsets.topic.num.partitions": "4",
            "transaction.state.log.replication.factor": str(min(3, n)),
            "transaction.state.log.min.isr": str(min(2, n)),
            "transaction.state.log.num.partitions": "4",
            "group.initial.rebalance.delay.ms": "0",
            "unclean.leader.election.enable": "false",
        }
        if n >= 3:  # what a production cluster runs with: a write survives one dead broker
            props["default.replication.factor"] = "3"
            props["min.insync.replicas"] = "2"
        if self.kafka_defaults:
            # Only what the node needs to run, and, for fewer than three nodes, the internal topics' replication
            # that Kafka's own single-node sample configuration sets (their default of 3 cannot be placed there).
            props = dict(node)
            if n < 3:
                props |= {"offsets.topic.replication.factor": str(n),
                          "transaction.state.log.replication.factor": str(n), "transaction.state.log.min.isr": "1",
                          "share.coordinator.state.topic.replication.factor": str(n),
                          "share.coordinator.state.topic.min.isr": "1"}
        props.update(self.extra)
        self.node_dir(node_id).mkdir(parents=True, exist_ok=True)
        self._props_file(node_id).write_text("".join(f"{k}={v}\n" for k, v in props.items()))

    def _java(self, main: str, *args: str) -> list[str]:
        if not LIBS.is_dir() or not any(LIBS.glob("kafka_2.13-*.jar")):
            raise RuntimeError(f"no Kafka jars in {LIBS}: run `make setup` (it resolves them with Maven)")
        return ["java", *JVM_HEAP, "-XX:+UseG1GC", "-Djava.awt.headless=true", "-cp", f"{LIBS}/*", main, *args]

    # ---- processes ------------------------------------------------------------------------------------
    def pid(self, node_id: int) -> int | None:
        """The pid of the node's running broker, from its pid file; None when it is not running."""
        try:
            pid = int(self._pid_file(node_id).read_text())
        except (OSError, ValueError):
            return None
        proc = self.procs.get(node_id)
        if proc is not None and proc.pid == pid:
            return pid if proc.poll() is None else None
        # The pid file may outlive its process (a reboot, a kill -9 of this machine's session): make sure
        # the pid is still this node's broker, not a recycled pid.
        if not _pid_alive(pid) or str(self._props_file(node_id)) not in cmdline(pid):
            return None
        return pid

    def is_running(self) -> bool:
        return all(self.pid(node) is not None for node in self.node_ids)

    def _spawn(self, node_id: int) -> None:
        with open(self.log_file(node_id), "ab") as out:
            out.write(f"\n==== {time.strftime('%Y-%m-%d %H:%M:%S')} starting node {node_id}\n".encode())
            out.flush()
            proc = subprocess.Popen(self._java("kafka.Kafka", str(self._props_file(node_id))), stdout=out,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                                    cwd=self.node_dir(node_id))
        self.procs[node_id] = proc
        self._pid_file(node_id).write_text(str(proc.pid))
        log.debug("started node %d (pid %d) on %s", node_id, proc.pid, self.broker_port(node_id))

    def _exited(self, node_id: int) -> bool:
        proc = self.procs.get(node_id)
        return proc is not None and proc.poll() is not None

    def tail(self, node_id: int, lines: int = 30) -> str:
        """The first errors and the last lines the node logged since it was last started."""
        try:
            text = self.log_file(node_id).read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        begun = max((i for i, line in enumerate(text) if line.startswith("==== ")), default=0)
        run = text[begun:]
        # A failed start ends in pages of shutdown noise; its cause is the first ERROR.
        errors = [line for line in run if " ERROR " in line or line.startswith("Caused by")][:6]
        head = ["first errors:", *errors, "last lines:"] if errors else []
        return "\n".join(head + run[-lines:])

    def _tails(self, nodes: list[int]) -> str:
        return "\n".join(f"--- {self.log_file(n)} (last lines)\n{self.tail(n)}" for n in nodes)

    # ---- lifecycle ------------------------------------------------------------------------------------
    def start(self, timeout_s: float = 120) -> KafkaCluster:
        """Format the nodes' storage where needed, start every node not already running, and wait until each
        answers metadata listing all of them."""
        self.root.mkdir(parents=True, exist_ok=True)
        if not self.is_running():  # a half-running cluster is restarted whole, so its ports stay consistent
            self.stop()
        (self.root / "ports").write_text(" ".join(map(str, self.ports + self.controller_ports)))
        cluster_id = self._cluster_id()
        started: list[int] = []
        try:
            for node in self.node_ids:
                if self.pid(node) is not None:
                    continue
                for port in (self.broker_port(node), self.controller_ports[node - 1]):
                    if not _port_free(port):
                        raise RuntimeError(f"node {node}: 127.0.0.1:{port} is already in use by another process")
                self._write_props(node)
                if not (self.node_dir(node) / "data" / "meta.properties").exists():
                    fmt = subprocess.run(self._java("kafka.tools.StorageTool", "format", "-t", cluster_id,
                                                    "-c", str(self._props_file(node)), "--ignore-formatted",
                                                    *self.format_args),
                                         capture_output=True, text=True, timeout=120)
                    if fmt.returncode != 0:
                        raise RuntimeError(f"formatting node {node} failed ({fmt.returncode}):\n"
                                           f"{fmt.stdout}{fmt.stderr}")
                self._spawn(node)
                started.append(node)
            self.wait_ready(self.node_ids, timeout_s)
        except BaseException:
            # A failed start leaves nothing of its own running: brokers left behind would hold their ports and two
            # cores' worth of JVMs for the rest of a test session.
            self._stop_nodes(started, timeout_s=20)
            raise
        return self

    def wait_ready(self, nodes: list[int] | None = None, timeout_s: float = 120) -> None:
        """Wait (deadline-based polling) until each of ``nodes`` answers metadata itself, listing every running
        node. Asking each node directly matters after a restart: the others may still list a killed broker
        until its session times out."""
        nodes = self.node_ids if nodes is None else nodes
        deadline = time.monotonic() + timeout_s
        missing = list(nodes)
        while True:
            running = {n for n in self.node_ids if self.pid(n) is not None} | set(nodes)
            missing = []
            for node in nodes:
                meta = metadata(f"127.0.0.1:{self.broker_port(node)}", timeout_s=2)
                if meta is None or meta.orig_broker_id != node or not running <= set(meta.brokers):
                    missing.append(node)
            if not missing:
                return
            dead = [n for n in nodes if self._exited(n) or self.pid(n) is None]
            if dead:
                raise RuntimeError(f"broker(s) {dead} exited while starting:\n{self._tails(dead)}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"broker(s) {missing} not ready after {timeout_s}s:\n{self._tails(missing)}")
            time.sleep(0.25)

    def kill_broker(self, node_id: int, sig: int = signal.SIGKILL, timeout_s: float = 120) -> None:
        """Send ``sig`` to one broker and wait until its process has exited. A SIGKILLed broker can take longer than
        30 s to be torn down on a loaded 2-core machine (a fresh-clone suite saw it, with no fault of the sink's)."""
        pid = self.pid(node_id)
        if pid is None:
            return
        os.kill(pid, sig)
        self._wait_exit(node_id, pid, time.monotonic() + timeout_s)
        if self.pid(node_id) is not None:
            raise TimeoutError(f"broker {node_id} (pid {pid}) still running {timeout_s}s after signal {sig}")

    def _wait_exit(self, node_id: int, pid: int, deadline: float) -> None:
        proc = self.procs.get(node_id)
        while time.monotonic() < deadline:
            if proc is not None and proc.pid == pid:
                try:
                    proc.wait(timeout=0.05)  # also reaps it, so no zombie is left behind
                    return
                except subprocess.TimeoutExpired:
                    continue
            if not _pid_alive(pid):
                return
            time.sleep(0.05)

    def start_broker(self, node_id: int, timeout_s: float = 120) -> None:
        """Start one (killed) broker again and wait until it is back in the cluster's metadata."""
        if self.pid(node_id) is None:
            self._spawn(node_id)
        self.wait_ready([node_id], timeout_s)

    def stop(self, timeout_s: float = 30) -> None:
        """SIGTERM every node (a clean shutdown), then SIGKILL what is still running at the deadline."""
        self._stop_nodes(self.node_ids, timeout_s)

    def _stop_nodes(self, nodes: list[int], timeout_s: float) -> None:
        pids = {node: pid for node in nodes if (pid := self.pid(node)) is not None}
        for pid in pids.values():
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for node, pid in pids.items():
            self._wait_exit(node, pid, deadline)
        for node, pid in pids.items():
            if self.pid(node) is not None:
                log.warning("broker %d (pid %d) ignored SIGTERM for %ss: killing it", node, pid, timeout_s)
                self.kill_broker(node, signal.SIGKILL)
        for node in nodes:
            self._pid_file(node).unlink(missing_ok=True)

    def wipe(self) -> None:
        """Stop the cluster and delete its data, logs and ports."""
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    # ---- topics ---------------------------------------------------------------------------------------
    def create_topic(self, name: str, partitions: int = 1, replication_factor: int | None = None,
                     config: dict[str, str] | None = None, timeout_s: float = 30) -> str:
        """Create a topic (replication factor defaults to min(3, brokers)) and wait until all partitions
        have leaders."""
        rf = min(3, self.n) if replication_factor is None else replication_factor
        return create_topic(self.bootstrap_servers, name, partitions, rf, config, timeout_s)

    def leader_of(self, topic: str, partition: int) -> int:
        """The node id leading ``topic``/``partition`` now (-1 while there is none)."""
        from confluent_kafka.admin import AdminClient

        meta = AdminClient({"bootstrap.servers": self.bootstrap_servers}).list_topics(topic, timeout=10)
        return meta.topics[topic].partitions[partition].leader


def start_cluster(make: Callable[[], C], timeout_s: float = 120, tries: int = 2) -> C:
    """``make()``'s cluster started, trying once more with a fresh one (new ports, its data wiped) if a start fails:
    on a loaded 2-core machine a 3-broker cluster has been seen not ready within 120 s, where a second start is.
    Each failed start has stopped what it started."""
    for attempt in range(1, tries + 1):
        cluster = make()
        try:
            return cluster.start(timeout_s)
        except (TimeoutError, RuntimeError) as exc:
            if attempt == tries:
                raise
            log.warning("a Kafka cluster under %s did not start (%s); starting a fresh one", cluster.root,
                        str(exc).splitlines()[0])
            cluster.wipe()
    raise AssertionError("unreachable")


# ---- the command line: one long-lived broker for development ---------------------------------------------
def local_cluster() -> KafkaCluster:
    """The development broker of ``make kafka-up``: 127.0.0.1:${KAFKA_PORT:-9092}, data under build/kafka/local,
    Apache Kafka's default settings (topics are auto-created, as the README's Quickstart expects)."""
    return KafkaCluster(LOCAL_ROOT, 1, port=int(os.environ.get("KAFKA_PORT", "9092")), kafka_defaults=True)


_OTHER_PORT = "KAFKA_PORT=9093 make kafka-up starts this repository's broker on another port (make kafka-down stops it)"


def ensure_local(timeout_s: float = 120) -> str:
    """Bring the development broker up unless it (or another Kafka on its port) already answers; return the
    bootstrap address. Which broker it is, and how to choose another, is logged."""
    cluster = local_cluster()
    if cluster.pid(1) is not None:
        cluster.wait_ready([1], timeout_s)
        log.info("Kafka already up on %s, started here (pid %s, log: %s)", cluster.bootstrap_servers, cluster.pid(1),
                 cluster.log_file(1))
        if "auto.create.topics.enable=false" in cluster._props_file(1).read_text(errors="replace"):
            log.warning("it was started with an earlier checkout's settings, which do not auto-create topics: "
                        "`make kafka-down kafka-up` restarts it with Kafka's defaults")
    elif (answer := metadata(cluster.bootstrap_servers)) is not None:
        log.warning("a Kafka broker not started by `make kafka-up` already answers on %s (cluster id %s, %d "
                    "broker(s)): using it as it is, with its own settings (whether it auto-creates topics, say); %s",
                    cluster.bootstrap_servers, answer.cluster_id, len(answer.brokers), _OTHER_PORT)
    else:
        cluster.start(timeout_s)
        log.info("Kafka up on %s with Apache Kafka's default settings (log: %s); %s", cluster.bootstrap_servers,
                 cluster.log_file(1), _OTHER_PORT)
    return cluster.bootstrap_servers


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    parser = argparse.ArgumentParser(
        prog="python -m testing.kafka_local", description="A local Apache Kafka broker on 127.0.0.1 for development.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="environment:\n"
               "  KAFKA_PORT       the broker's port (default 9092): 127.0.0.1:$KAFKA_PORT\n"
               "  KAFKA_LOCAL_DIR  its data and log directory (default build/kafka/local in the repository);\n"
               "                   the log is node1/broker.log there\n"
               "Each command acts on the broker these name: give down and status the same values as up.")
    parser.add_argument("command", choices=["up", "down", "status"],
                        help="up: start it unless one already answers there (idempotent); down: stop it; "
                             "status: exit 0 if it is up, 1 if not")
    args = parser.parse_args(argv)
    cluster = local_cluster()
    if args.command == "up":
        ensure_local()
    elif args.command == "down":
        running = cluster.pid(1) is not None
        cluster.stop()
        log.info("Kafka stopped" if running else "Kafka was not running")
    else:
        up = cluster.pid(1) is not None and metadata(cluster.bootstrap_servers) is not None
        log.info("Kafka up on %s (log: %s)" if up else "Kafka not running (%s, log: %s)",
                 cluster.bootstrap_servers, cluster.log_file(1))
        return 0 if up else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
