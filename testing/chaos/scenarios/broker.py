"""Fault family: the Kafka broker fails under the write: the only broker (3) or a partition leader of three
(4, RF 3, min.insync.replicas 2) SIGKILLed mid-write and restarted after 1-5 s; or the broker down past
delivery.timeout.ms so the job fails, then `recoverable-kafka-wal replay` and a re-run under the same
wal.writeId (5).

A read_committed reader must see every record. After 3 and 4, none twice. After 5 under at_least_once, a
repeat only of a record whose fate was unknown (in flight when the broker died); under exactly_once none.
"""

from __future__ import annotations

import json
import random
import threading
import time

from testing.chaos.checker import check, rerun_and_count, wal_ids
from testing.chaos.lab import (
    Lab,
    Trial,
    cli,
    last_summary,
    names_the_brokers_gone,
    random_fault_setup,
    wait_for_records,
    write_through_broker_death,
    write_with_fault,
)
from testing.kafka_local import KafkaCluster

# ---- 3./4. Broker SIGKILL and restart mid-write ----------------------------------------------------------

def _broker_kill(lab: Lab, rng: random.Random, n: int, cluster: KafkaCluster, replication: int | None) -> Trial:
    d, topic, df, ids, target = random_fault_setup(lab, rng, n, "broker-kill", 4, cluster, replication)
    down_s = rng.uniform(1.0, 5.0)
    notes: dict[str, object] = {"down_seconds": round(down_s, 2), "at_records": int(target)}

    def fault(done: threading.Event) -> None:
        wait_for_records(cluster.bootstrap_servers, topic, target, done)
        victim = cluster.leader_of(topic, rng.randrange(4))
        notes.update(killed_broker=victim, mid_write=not done.is_set())
        cluster.kill_broker(victim)
        down_until = time.monotonic() + down_s  # the outage itself is the fault being injected
        while time.monotonic() < down_until:
            time.sleep(0.05)
        cluster.start_broker(victim)

    trial = Trial(notes=notes)
    write_with_fault(trial, fault, lambda: lab.write(df, cluster.bootstrap_servers, topic, d / "wal",
                                                      d / "summary.jsonl"))
    trial.passed = not trial.errors
    return check(lab, trial, cluster.bootstrap_servers, topic, ids)


def broker_kill_single(lab: Lab, rng: random.Random, n: int) -> Trial:
    """The only broker SIGKILLed mid-write and restarted after 1-5 s; librdkafka's idempotent retries
    carry the write through."""
    return _broker_kill(lab, rng, n, lab.kafka, 1)


def leader_kill_three_brokers(lab: Lab, rng: random.Random, n: int) -> Trial:
    """A partition leader of the 3-broker cluster (RF 3, min.insync.replicas 2, acks=all) SIGKILLed mid-write
    and restarted after 1-5 s."""
    return _broker_kill(lab, rng, n, lab.kafka3, 3)


# ---- 5. Broker down longer than the delivery timeout -----------------------------------------------------

def broker_down_past_delivery_timeout(lab: Lab, rng: random.Random, n: int) -> Trial:
    """The broker dies mid-write and stays down past delivery.timeout.ms: the job fails with an error naming
    topic and partition, the WAL keeps what Kafka did not acknowledge. Once the broker is back,
    `recoverable-kafka-wal replay --partitions 4` finishes the fully logged partitions and refuses the others
    (never exit 0 over a hole), then the documented recovery, a re-run with the same wal.writeId, sends the
    rest, partitions that never started included."""
    d, topic, df, ids, target = random_fault_setup(lab, rng, n, "broker-down", 4)
    trial, summary = write_through_broker_death(lab, d, topic, df, target, {"at_records": int(target)},
                                                **{"kafka.delivery.timeout.ms": "6000"})
    if summary is not None:
        trial.notes["outcome"] = "the write finished before the broker died"
        return check(lab, trial, lab.kafka.bootstrap_servers, topic, ids)
    error = trial.errors[-1] if trial.errors else ""
    if not names_the_brokers_gone(error, lab.exactly_once):
        trial.passed = False
    # Records whose delivery timed out are among the unacknowledged ones, and the broker may have stored those
    # before it died (librdkafka cannot tell; its Python binding does not expose the persistence status).
    unknown_fate = wal_ids(d / "wal", acked=False)
    trial.notes["unacknowledged_in_wal"] = len(unknown_fate)
    write_id = last_summary(d / "summary.jsonl")["write_id"]
    replay = cli("replay", "--json", "--path", str(d / "wal"), "--write-id", write_id, "--partitions", "4",
                 "--bootstrap-servers", lab.kafka.bootstrap_servers)
    report = json.loads(replay.stdout.splitlines()[-1]) if replay.stdout.strip() else {}
    trial.notes["replay"] = {"exit": replay.returncode, "sent": report.get("sent"),
                             "refused": len(report.get("refused", []))}
    # Replay never finishes an exactly_once write; where this WAL kept none of it (its finished attempts released,
    # the proof topic holding their proof), it says so instead of refusing partitions.
    nothing_here = lab.exactly_once and replay.returncode != 0 and " is not in " in replay.stderr
    if (replay.returncode == 0) != (not report.get("refused")) and not nothing_here:
        trial.errors.append(f"replay exit {replay.returncode} does not match its refusals: {replay.stderr[-500:]}")
        trial.passed = False
    return rerun_and_count(lab, trial, d, topic, df, ids, unknown_fate)
