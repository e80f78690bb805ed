"""The test broker is real Apache Kafka (kafka.Kafka on Java, KRaft), listens on loopback only, and keeps its
data across a SIGKILL and restart; with three brokers, a killed leader is replaced."""

from __future__ import annotations

import signal
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Producer

from testing.kafka_check import count_topic, read_topic
from testing.kafka_local import KafkaCluster, _pid_alive, cmdline
from testing.waiting import wait_until


def produce(bootstrap: str, topic: str, values: list[bytes], partition: int | None = None) -> None:
    """Produce with acks=all and wait for every acknowledgement; fail on any delivery error."""
    errors: list[str] = []
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                         "message.timeout.ms": 60_000})

    def on_delivery(err: object, _msg: object) -> None:
        if err is not None:
            errors.append(str(err))

    for v in values:
        kwargs = {} if partition is None else {"partition": partition}
        producer.produce(topic, key=v, value=v, on_delivery=on_delivery, **kwargs)
    assert producer.flush(60) == 0, "records still unacknowledged after 60s"
    assert not errors, errors


def listening_sockets(pid: int) -> list[tuple[str, int]]:
    """(address, port) of every TCP socket in LISTEN state held by process ``pid``, read from /proc (the same
    tables ``ss -ltn`` prints, without depending on iproute2's output format)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = fd.readlink().as_posix()
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    found = []
    for table, v6 in (("/proc/net/tcp", False), ("/proc/net/tcp6", True)):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state != "0A" or inode not in inodes:  # 0A is TCP_LISTEN
                continue
            addr_hex, port_hex = local.split(":")
            found.append((_decode_addr(addr_hex, v6), int(port_hex, 16)))
    return found


def _decode_addr(addr_hex: str, v6: bool) -> str:
    # /proc/net/tcp{,6} print each 32-bit word of the address in host (little-endian) byte order.
    raw = b"".join(bytes.fromhex(addr_hex[i:i + 8])[::-1] for i in range(0, len(addr_hex), 8))
    if not v6:
        return ".".join(str(b) for b in raw)
    if raw[:12] == b"\0" * 10 + b"\xff\xff":  # IPv4-mapped, as Java binds 127.0.0.1 on a dual-stack socket
        return ".".join(str(b) for b in raw[12:])
    return ":".join(raw[i:i + 2].hex() for i in range(0, 16, 2))


def test_decode_proc_net_addresses():
    assert _decode_addr("0100007F", v6=False) == "127.0.0.1"
    assert _decode_addr("0000000000000000FFFF00000100007F", v6=True) == "127.0.0.1"
    assert _decode_addr("00000000000000000000000000000000", v6=True) == "0000:0000:0000:0000:0000:0000:0000:0000"


def test_broker_is_a_real_kafka_process(kafka: KafkaCluster):
    pid = kafka.pid(1)
    assert pid is not None
    cmd = cmdline(pid)
    assert Path(cmd[0]).name == "java" and "kafka.Kafka" in cmd, cmd
    assert any("kafka/libs" in a for a in cmd), cmd
    assert str(kafka.root) in cmd[-1], cmd


def test_produced_message_is_read_back(kafka: KafkaCluster, new_topic):
    topic = new_topic(partitions=2)
    values = [f"hello-{i}".encode() for i in range(10)]
    produce(kafka.bootstrap_servers, topic, values)
    got = read_topic(kafka.bootstrap_servers, topic, timeout_s=30, expected=10)
    assert sorted(r["value"] for r in got) == sorted(values)
    assert {r["topic"] for r in got} == {topic}
    assert all(r["key"] == r["value"] and r["timestamp"] > 0 for r in got)


def test_broker_listens_on_loopback_only(kafka: KafkaCluster):
    sockets = listening_sockets(kafka.pid(1))
    ports = {port for _, port in sockets}
    assert kafka.broker_port(1) in ports  # the PLAINTEXT listener
    assert len(ports) >= 2, sockets  # and the CONTROLLER listener
    assert all(addr.startswith("127.") for addr, _ in sockets), sockets


def test_auto_create_topics_is_off(kafka: KafkaCluster):
    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers, "message.timeout.ms": 3000,
                         "log_level": 0})
    errors: list[object] = []
    producer.produce(f"never-created-{uuid.uuid4().hex[:8]}", b"x", on_delivery=lambda err, _m: errors.append(err))
    producer.flush(10)
    assert errors and errors[0] is not None


def test_kill_and_restart_single_broker_keeps_data(kafka: KafkaCluster, new_topic):
    topic = new_topic(partitions=2)
    values = [f"before-kill-{i}".encode() for i in range(100)]
    produce(kafka.bootstrap_servers, topic, values)
    old_pid = kafka.pid(1)

    kafka.kill_broker(1, signal.SIGKILL)
    assert kafka.pid(1) is None and not _pid_alive(old_pid)

    kafka.start_broker(1)
    assert kafka.pid(1) not in (None, old_pid)
    got = read_topic(kafka.bootstrap_servers, topic, timeout_s=60, expected=100)
    assert sorted(r["value"] for r in got) == sorted(values)
    produce(kafka.bootstrap_servers, topic, [b"after-restart"])
    assert count_topic(kafka.bootstrap_servers, topic) == 101


@pytest.mark.cluster
def test_three_brokers_elect_a_new_leader(kafka3: KafkaCluster):
    assert len(kafka3.bootstrap_servers.split(",")) == 3
    topic = kafka3.create_topic(f"t3-{uuid.uuid4().hex[:12]}", partitions=3)  # RF 3 by default
    values = [f"v{i}".encode() for i in range(30)]
    produce(kafka3.bootstrap_servers, topic, values, partition=0)
    leader = kafka3.leader_of(topic, 0)
    assert leader in (1, 2, 3)

    kafka3.kill_broker(leader)
    new_leader = wait_until(lambda: (lambda n: n if n not in (-1, leader) else None)(kafka3.leader_of(topic, 0)),
                            60, f"a leader other than {leader} for {topic}/0")
    assert new_leader in {1, 2, 3} - {leader}
    # One broker down, RF 3 and min.insync.replicas 2: acks=all writes still succeed.
    produce(kafka3.bootstrap_servers, topic, [b"while-down"], partition=0)

    kafka3.start_broker(leader)
    assert kafka3.pid(leader) is not None
    got = read_topic(kafka3.bootstrap_servers, topic, timeout_s=60, expected=31)
    assert sorted(r["value"] for r in got) == sorted([*values, b"while-down"])
