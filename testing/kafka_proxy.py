"""Brokers whose replies can be made to never come (test harness): a Kafka cluster whose clients reach each broker
through a TCP proxy on 127.0.0.1 that the test can switch, per broker, to swallow what the broker answers.

A swallowed request is one the broker received and processed but whose reply the client never gets: the fault
behind librdkafka's stuck coordinator calls (confluentinc/librdkafka#5456: a request's own timeout never checked),
which freezing a broker does not make, since a frozen broker's connections are reset or time out. Brokers talk to
each other and to the test harness on their own listener, never through the proxy.
"""

from __future__ import annotations

import random
import select
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

from confluent_kafka.admin import AdminClient

from recoverable_sink.options import SinkOptions
from recoverable_sink.producer.transactions import transactional_id
from recoverable_sink.wal import LOGGED, AttemptInfo, open_wal
from testing.kafka_local import KafkaCluster, free_port


class ReplyGate:
    """A TCP proxy in front of one broker's client listener: it forwards both ways until :meth:`swallow`, then drops
    what the broker sends on every connection (new ones included) until :meth:`answer`, which also closes the
    connections that lost replies (the client reconnects, as after any broken connection)."""

    def __init__(self, listen_port: int, target_port: int) -> None:
        self.listen_port, self.target_port = listen_port, target_port
        self.swallowing = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._conns: list[tuple[socket.socket, socket.socket, list[bool]]] = []
        self._server = socket.create_server(("127.0.0.1", listen_port), reuse_port=False)
        self._server.settimeout(0.2)
        threading.Thread(target=self._accept, name=f"gate-{listen_port}", daemon=True).start()

    def swallow(self) -> None:
        self.swallowing.set()

    def answer(self) -> None:
        self.swallowing.clear()
        with self._lock:
            lost = [c for c in self._conns if c[2][0]]
        for client, upstream, _ in lost:
            _close(client, upstream)

    def close(self) -> None:
        self._stop.set()
        self._server.close()
        with self._lock:
            for client, upstream, _ in self._conns:
                _close(client, upstream)

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
            except OSError:
                client.close()
                continue
            lost = [False]
            with self._lock:
                self._conns.append((client, upstream, lost))
            threading.Thread(target=self._pump, args=(client, upstream, lost), daemon=True).start()

    def _pump(self, client: socket.socket, upstream: socket.socket, lost: list[bool]) -> None:
        try:
            while not self._stop.is_set():
                ready, _, _ = select.select([client, upstream], [], [], 0.2)
                for s in ready:
                    data = s.recv(65536)
                    if not data:
                        return
                    if s is client:
                        upstream.sendall(data)
                    elif self.swallowing.is_set():
                        lost[0] = True  # the broker answered; the client never hears it
                    else:
                        client.sendall(data)
        except (OSError, ValueError):
            return
        finally:
            _close(client, upstream)
            with self._lock:
                self._conns = [c for c in self._conns if c[0] is not client]


def _close(*sockets: socket.socket) -> None:
    for s in sockets:
        try:
            s.close()
        except OSError:
            pass


class GatedCluster(KafkaCluster):
    """A :class:`KafkaCluster` whose clients (``bootstrap_servers``) reach broker ``n`` through ``gates[n]``; the
    brokers and :attr:`direct_bootstrap` use their own listener."""

    def __init__(self, root: Path, num_brokers: int = 3, broker_props: dict[str, str] | None = None) -> None:
        super().__init__(root, num_brokers, broker_props=broker_props)
        self.client_ports = [free_port() for _ in range(self.n)]
        self.gate_ports = [free_port() for _ in range(self.n)]
        self.gates: dict[int, ReplyGate] = {}

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(f"127.0.0.1:{p}" for p in self.gate_ports)

    @property
    def direct_bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{p}" for p in self.ports)

    def _write_props(self, node_id: int) -> None:
        super()._write_props(node_id)
        i = node_id - 1
        props = self._props_file(node_id)
        lines = []
        for line in props.read_text().splitlines():
            key, _, value = line.partition("=")
            if key == "listeners":
                value += f",CLIENT://127.0.0.1:{self.client_ports[i]}"
            elif key == "advertised.listeners":
                value += f",CLIENT://127.0.0.1:{self.gate_ports[i]}"
            elif key == "listener.security.protocol.map":
                value += ",CLIENT:PLAINTEXT"
            lines.append(f"{key}={value}")
        props.write_text("\n".join(lines) + "\n")

    def start(self, timeout_s: float = 120) -> GatedCluster:
        super().start(timeout_s)  # ready as seen on the brokers' own listener
        for node in self.node_ids:
            if node not in self.gates:
                self.gates[node] = ReplyGate(self.gate_ports[node - 1], self.client_ports[node - 1])
        return self

    def stop(self, timeout_s: float = 30) -> None:
        super().stop(timeout_s)
        for gate in self.gates.values():
            gate.close()
        self.gates.clear()

    def coordinator_of(self, key: str, internal_topic: str = "__transaction_state") -> int:
        """The node leading the partition of ``internal_topic`` that holds ``key`` (a transactional id or a group):
        the key's coordinator, found as the brokers find it (Java's String.hashCode, modulo the partitions)."""
        meta = AdminClient({"bootstrap.servers": self.direct_bootstrap}).list_topics(internal_topic, timeout=10)
        partitions = meta.topics[internal_topic].partitions
        h = 0
        for ch in key:
            h = (31 * h + ord(ch)) & 0xFFFFFFFF
        h = h - 2**32 if h >= 2**31 else h
        index = 0 if h == -(2**31) else abs(h) % len(partitions)
        return partitions[index].leader


class Silencer(threading.Thread):
    """Waits until a task of the write reaches its commit (its WAL attempt is ``logged``: the whole partition is in
    the log, the final drain and, under exactly_once, the marker and the commit follow), then, a random moment
    later, silences the brokers ``nodes_for(attempt)`` names for ``hold_s`` seconds."""

    def __init__(self, cluster: GatedCluster, wal: Path, nodes_for: Callable[[AttemptInfo], set[int]],
                 hold_s: float) -> None:
        super().__init__(daemon=True)
        self.cluster, self.wal, self.nodes_for, self.hold_s = cluster, str(wal), nodes_for, hold_s
        self.silenced: tuple[float, AttemptInfo, set[int]] | None = None
        self.took: float | None = None  # from the silence to the stuck attempt's end
        self.done = threading.Event()

    def run(self) -> None:
        deadline = time.monotonic() + 300
        try:
            while time.monotonic() < deadline and self.silenced is None:
                try:
                    found = [a for a in open_wal(self.wal).attempts() if a.state == LOGGED]
                except Exception:  # noqa: BLE001 - the WAL is not made yet
                    found = []
                if not found:
                    time.sleep(0.005)
                    continue
                time.sleep(random.uniform(0, 0.01))  # a random point of the commit
                nodes = self.nodes_for(found[0])
                for node in nodes:
                    self.cluster.gates[node].swallow()
                at = time.time()
                self.silenced = (at, found[0], nodes)
                until = time.monotonic() + self.hold_s
                while time.monotonic() < until:  # how long the stuck attempt takes to end (its abort marks it)
                    now = {a.key: a for a in open_wal(self.wal).attempts()}.get(found[0].key)
                    if self.took is None and now is not None and now.ended is not None:
                        self.took = now.ended - at
                    time.sleep(0.05)
                for node in nodes:
                    self.cluster.gates[node].answer()
        finally:
            self.done.set()


def silenced_nodes(cluster: GatedCluster, options: SinkOptions, topic: str, mode: str,
                   partitions: int) -> Callable[[AttemptInfo], set[int]]:
    """What to silence at an attempt's commit: its partition's transaction and group coordinators (exactly_once),
    or the leaders of the topic's ``partitions`` (at_least_once: the records still in flight)."""
    def nodes_for(attempt: AttemptInfo) -> set[int]:
        if mode == "at_least_once":
            return {cluster.leader_of(topic, p) for p in range(partitions)}
        scope = attempt.query_id if attempt.kind == "stream" and attempt.query_id else attempt.write_id
        txn_id = transactional_id(options, scope, attempt.partition)
        return {cluster.coordinator_of(txn_id), cluster.coordinator_of(txn_id, "__consumer_offsets")}

    return nodes_for
