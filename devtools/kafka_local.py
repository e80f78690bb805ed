"""Start real Apache Kafka brokers (KRaft, ``kafka.Kafka`` from Maven Central's jars) on 127.0.0.1.

Used by ``make kafka-up``/``kafka-down``, the tests' fixtures, the demo, the chaos campaign and the
benchmark. No Docker: the jars come from ``jars/broker-pom.xml`` (``make setup``) into build/kafka/libs.

    python -m devtools.kafka_local up      # one broker on 127.0.0.1:${KAFKA_PORT:-9092}, idempotent
    python -m devtools.kafka_local down
    python -m devtools.kafka_local status
"""

from __future__ import annotations

import argparse
import base64
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

log = logging.getLogger("devtools.kafka_local")

REPO = Path(__file__).resolve().parent.parent
LIBS = REPO / "build" / "kafka" / "libs"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped) is not alive
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


class KafkaCluster:
    """``num_brokers`` combined broker+controller KRaft nodes on 127.0.0.1, data and logs under ``root``."""

    def __init__(self, root: Path, num_brokers: int = 1, port: int | None = None,
                 broker_props: dict[str, str] | None = None) -> None:
        self.root = Path(root)
        self.n = num_brokers
        self.extra = broker_props or {}
        ports_file = self.root / "ports"
        if ports_file.exists():  # a cluster another process started: reuse its ports
            saved = [int(p) for p in ports_file.read_text().split()]
            self.ports, self.controller_ports = saved[: self.n], saved[self.n:]
        else:
            self.ports = [port] if port and num_brokers == 1 else [free_port() for _ in range(self.n)]
            self.controller_ports = [free_port() for _ in range(self.n)]
        self.procs: dict[int, subprocess.Popen | None] = {}

    # ---- layout ---------------------------------------------------------------------------------------
    @property
    def bootstrap_servers(self) -> str:
        return ",".join(f"127.0.0.1:{p}" for p in self.ports)

    def broker_port(self, node_id: int) -> int:
        return self.ports[node_id - 1]

    def _node_dir(self, node_id: int) -> Path:
        return self.root / f"node{node_id}"

    def _props_file(self, node_id: int) -> Path:
        return self._node_dir(node_id) / "server.properties"

    def _pid_file(self, node_id: int) -> Path:
        return self._node_dir(node_id) / "pid"

    def log_file(self, node_id: int) -> Path:
        return self._node_dir(node_id) / "broker.log"

    def _write_props(self, node_id: int) -> None:
        n = self.n
        voters = ",".join(f"{i + 1}@127.0.0.1:{p}" for i, p in enumerate(self.controller_ports))
        props = {
            "process.roles": "broker,controller",
            "node.id": str(node_id),
            "controller.quorum.voters": voters,
            "listeners": f"PLAINTEXT://127.0.0.1:{self.broker_port(node_id)},"
                         f"CONTROLLER://127.0.0.1:{self.controller_ports[node_id - 1]}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.broker_port(node_id)}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(self._node_dir(node_id) / "data"),
            "auto.create.topics.enable": "false",
            "num.partitions": "1",
            "offsets.topic.replication.factor": str(min(3, n)),
            "offsets.topic.num.partitions": "4",
            "transaction.state.log.replication.factor": str(min(3, n)),
            "transaction.state.log.min.isr": str(min(2, n)),
            "transaction.state.log.num.partitions": "4",
            "group.initial.rebalance.delay.ms": "0",
            "default.replication.factor": str(min(3, n)),
            "min.insync.replicas": "2" if n >= 3 else "1",
            "unclean.leader.election.enable": "false",
            **self.extra,
        }
        self._node_dir(node_id).mkdir(parents=True, exist_ok=True)
        self._props_file(node_id).write_text("".join(f"{k}={v}\n" for k, v in props.items()))

    def _java(self, main: str, *args: str) -> list[str]:
        if not LIBS.is_dir() or not any(LIBS.glob("kafka_2.13-*.jar")):
            raise RuntimeError(f"no Kafka jars in {LIBS}: run `make setup` (it resolves them with Maven)")
        return ["java", "-Xms128m", "-Xmx512m", "-XX:+UseG1GC", "-Djava.awt.headless=true",
                "-cp", f"{LIBS}/*", main, *args]

    # ---- lifecycle ------------------------------------------------------------------------------------
    def start(self, timeout_s: float = 90) -> KafkaCluster:
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "ports").write_text(" ".join(map(str, self.ports + self.controller_ports)))
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        for node in range(1, self.n + 1):
            self._write_props(node)
            if not (self._node_dir(node) / "data" / "meta.properties").exists():
                subprocess.run(self._java("kafka.tools.StorageTool", "format", "-t", cluster_id,
                                          "-c", str(self._props_file(node)), "--ignore-formatted"),
                               check=True, capture_output=True, timeout=120)
        for node in range(1, self.n + 1):
            self._spawn(node)
        self.wait_ready(self.n, timeout_s)
        return self

    def _spawn(self, node_id: int) -> None:
        with open(self.log_file(node_id), "ab") as out:
            proc = subprocess.Popen(self._java("kafka.Kafka", str(self._props_file(node_id))), stdout=out,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        self.procs[node_id] = proc
        self._pid_file(node_id).write_text(str(proc.pid))

    def pid(self, node_id: int) -> int | None:
        try:
            pid = int(self._pid_file(node_id).read_text())
        except (OSError, ValueError):
            return None
        return pid if _pid_alive(pid) else None

    def wait_ready(self, brokers: int, timeout_s: float = 90) -> None:
        """Wait until the cluster's metadata lists ``brokers`` brokers (a deadline, not a sleep)."""
        deadline = time.monotonic() + timeout_s
        # log_level 0: "connection refused" while the broker boots is expected, not worth a line.
        admin = AdminClient({"bootstrap.servers": self.bootstrap_servers, "log_level": 0})
        seen = 0
        while time.monotonic() < deadline:
            try:
                seen = len(admin.list_topics(timeout=2).brokers)
                if seen >= brokers:
                    return
            except KafkaException:
                pass
            for node in range(1, self.n + 1):
                proc = self.procs.get(node)
                if proc is not None and proc.poll() is not None:
                    raise RuntimeError(f"broker {node} exited with {proc.returncode}:\n{self.tail(node)}")
            time.sleep(0.2)
        raise TimeoutError(f"{seen} of {brokers} brokers up after {timeout_s}s:\n{self.tail(1)}")

    def tail(self, node_id: int, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_file(node_id).read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def kill_broker(self, node_id: int, sig: int = signal.SIGKILL, timeout_s: float = 30) -> None:
        """Send ``sig`` to one broker and wait until its process is gone."""
        pid = self.pid(node_id)
        if pid is None:
            return
        os.kill(pid, sig)
        proc = self.procs.get(node_id)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if proc is not None and proc.pid == pid:
                if proc.poll() is not None:
                    return
            elif not _pid_alive(pid):
                return
            time.sleep(0.05)
        raise TimeoutError(f"broker {node_id} (pid {pid}) still running {timeout_s}s after signal {sig}")

    def start_broker(self, node_id: int, timeout_s: float = 90) -> None:
        """Restart one broker and wait until it is back in the cluster's metadata."""
        if self.pid(node_id) is None:
            self._spawn(node_id)
        self.wait_ready(self.n, timeout_s)

    def stop(self, timeout_s: float = 30) -> None:
        for node in range(1, self.n + 1):
            pid = self.pid(node)
            if pid is not None:
                os.kill(pid, signal.SIGTERM)
        for node in range(1, self.n + 1):
            try:
                self.kill_broker(node, signal.SIGTERM, timeout_s) if self.pid(node) else None
            except TimeoutError:
                self.kill_broker(node, signal.SIGKILL)
        (self.root / "ports").unlink(missing_ok=True)

    def wipe(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    # ---- topics ---------------------------------------------------------------------------------------
    def create_topic(self, name: str, partitions: int = 1, replication_factor: int | None = None,
                     config: dict[str, str] | None = None, timeout_s: float = 30) -> str:
        admin = AdminClient({"bootstrap.servers": self.bootstrap_servers})
        topic = NewTopic(name, partitions, replication_factor or min(3, self.n), config=config or {})
        admin.create_topics([topic], operation_timeout=timeout_s)[name].result()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            meta = admin.list_topics(name, timeout=5).topics.get(name)
            if meta and meta.error is None and len(meta.partitions) == partitions and \
                    all(p.leader >= 0 for p in meta.partitions.values()):
                return name
            time.sleep(0.1)
        raise TimeoutError(f"topic {name} has no leader for every partition after {timeout_s}s")

    def leader_of(self, topic: str, partition: int) -> int:
        admin = AdminClient({"bootstrap.servers": self.bootstrap_servers})
        return admin.list_topics(topic, timeout=10).topics[topic].partitions[partition].leader


def _local() -> KafkaCluster:
    return KafkaCluster(REPO / "build" / "kafka" / "local", 1, port=int(os.environ.get("KAFKA_PORT", "9092")))


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    parser = argparse.ArgumentParser(description="a local Apache Kafka broker on 127.0.0.1")
    parser.add_argument("command", choices=["up", "down", "status"])
    args = parser.parse_args(argv)
    cluster = _local()
    running = cluster.pid(1) is not None
    if args.command == "up":
        if running:
            cluster.wait_ready(1, 60)
            log.info("Kafka already up on %s", cluster.bootstrap_servers)
        else:
            cluster.start()
            log.info("Kafka up on %s (logs: %s)", cluster.bootstrap_servers, cluster.log_file(1))
    elif args.command == "down":
        cluster.stop()
        log.info("Kafka down" if running else "Kafka was not running")
    else:
        log.info("Kafka up on %s" if running else "Kafka not running (%s)", cluster.bootstrap_servers)
        return 0 if running else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
