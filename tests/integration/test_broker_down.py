"""A broker that dies in the middle of a write and stays down (issue 63): each task attempt fails within
kafka.delivery.timeout.ms plus the margin docs/operations.md states, the log says so in a bounded number of lines per
attempt (librdkafka's repeats counted, not printed), and `recoverable-kafka-wal list` counts the write's records once
with those no attempt got acknowledged; once the broker is back, a re-run under the write's id completes it.

The job runs in a driver of its own on a broker of its own (the test kills it). Each attempt's start and end come from
Spark's event log; the figures are printed (`-s`) for docs/operations.md."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time

import pytest

from testing.chaos.checker import ids_in_topic, verdict
from testing.kafka_local import REPO, KafkaCluster, start_cluster
from testing.spark import python_env
from testing.waiting import wait_until

ROWS, PARTITIONS, DELIVERY_MS = 40_000, 2, 10_000
# The bound asserted on each attempt's time to fail once the broker is gone: the delivery timeout, the margin
# docs/operations.md states (the final wait's, at most the timeout again and never over 30 s), and room for a task's
# start and a loaded 2-core machine. The write fixed by issue 63 took over 3 minutes an attempt.
ATTEMPT_BOUND_S = DELIVERY_MS / 1000 + min(30, DELIVERY_MS / 1000) + 30
LINES_PER_ATTEMPT = 25  # the sink's lines (librdkafka's included) per failed task attempt, at most


@pytest.fixture
def dying(tmp_path):
    root = tmp_path / "dying"
    cluster = start_cluster(lambda: KafkaCluster(root, 1))
    yield cluster
    cluster.stop(timeout_s=20)


def _job(cluster: KafkaCluster, topic: str, tmp_path, mode: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "testing.chaos.jobs", "--rows", str(ROWS), "--partitions", str(PARTITIONS),
            "--prefix", "bd", "--bootstrap", cluster.bootstrap_servers, "--topic", topic, "--wal",
            str(tmp_path / "wal"), "--summary", str(tmp_path / "summary.jsonl"), "--option",
            f"delivery.guarantee={mode}", "--option", f"kafka.delivery.timeout.ms={DELIVERY_MS}", *extra]


def _written(bootstrap: str, topic: str) -> int:
    """Records in the topic's partitions, committed or not (the high watermarks)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "down-progress",
                         "isolation.level": "read_uncommitted"})
    try:
        return sum(consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=5)[1] for p in range(PARTITIONS))
    finally:
        consumer.close()


def _attempts(events_dir) -> list[dict]:
    """Every task attempt of the job's event log that failed: partition, attempt, launch and finish (epoch s)."""
    found = []
    for log in (p for p in events_dir.rglob("*") if p.is_file() and "events_" in p.name or p.name.startswith("local-")):
        for line in log.read_text().splitlines():
            event = json.loads(line)
            if event.get("Event") == "SparkListenerTaskEnd" and event["Task Info"]["Failed"]:
                info = event["Task Info"]
                found.append({"partition": info["Index"], "attempt": info["Attempt"],
                              "launch": info["Launch Time"] / 1000, "finish": info["Finish Time"] / 1000})
    return sorted(found, key=lambda a: (a["partition"], a["attempt"]))


@pytest.mark.parametrize("mode", ["at_least_once", "exactly_once"])
def test_a_broker_gone_mid_write_fails_each_attempt_in_bounded_time_and_lines_then_the_rerun_completes(
        dying, tmp_path, mode):
    topic = dying.create_topic(f"down-{mode}", PARTITIONS, 1)
    events = tmp_path / "events"
    events.mkdir()
    log = tmp_path / "job.log"
    with open(log, "w") as out:
        # Each partition pauses at its 8,000th row in its first attempt, while the test kills the broker.
        # Its input arrives as a slow source's would (a second's pause every 2,000 rows), so that the broker dies
        # while records are on their way and the writer drains after each batch.
        job = subprocess.Popen(_job(dying, topic, tmp_path, mode, "--pace-ms", "1000",
                                    "--conf", "spark.eventLog.enabled=true", "--conf", "spark.eventLog.compress=false",
                                    "--conf", f"spark.eventLog.dir=file://{events}"),
                               cwd=REPO, env=python_env(), stdout=out, stderr=subprocess.STDOUT)
    try:
        # Uncommitted records count too (exactly_once): a third of the rows, the write is well under way.
        wait_until(lambda: job.poll() is not None or _written(dying.bootstrap_servers, topic) >= ROWS // 3,
                   240, "the job's first records in Kafka")
        assert job.poll() is None, log.read_text(errors="replace")[-3000:]
        dying.kill_broker(1, signal.SIGKILL)
        killed = time.time()
        assert job.wait(900) != 0
    finally:
        if job.poll() is None:
            job.kill()
    output = log.read_text(errors="replace")
    attempts = _attempts(events)
    took = [round(a["finish"] - max(a["launch"], killed), 1) for a in attempts]
    sink_lines = [line for line in output.splitlines() if "recoverable_sink" in line]
    refused = [line for line in output.splitlines() if "Connection refused" in line]
    print(f"{mode}: {len(attempts)} failed attempts, each took (s, from the kill or its start): {took}; "
          f"{len(sink_lines)} sink lines, {len(refused)} 'Connection refused' lines")
    # local[2,4]: a partition failed four times (the other's last attempt may have been cancelled then), each for
    # the records Kafka did not acknowledge, after the broker was gone.
    assert max(a["attempt"] for a in attempts) == 3, attempts
    assert "Kafka did not acknowledge" in output and "ValueError" not in output, output[-4000:]
    # The first attempts stop at the first record Kafka gave up on, not after sending their whole partition.
    assert not re.search(r"\(attempt 0\) .*Kafka did not acknowledge \d+ of 20000 records", output), output[-4000:]
    assert min(took) > 0, took
    assert max(took) <= ATTEMPT_BOUND_S, (took, output[-4000:])
    assert len(sink_lines) <= LINES_PER_ATTEMPT * len(attempts), "\n".join(sink_lines[-200:])
    assert len(refused) <= 8 * len(attempts), "\n".join(refused[-50:])

    # What the WAL holds, as the operator's command counts it: each record once, and those not acknowledged.
    listed = subprocess.run([sys.executable, "-m", "recoverable_sink.ops.cli", "list", "--path", str(tmp_path / "wal"),
                             "--json"], capture_output=True, text=True, timeout=120, check=True)
    (write,) = json.loads(listed.stdout)["writes"]
    dying.start_broker(1)
    print(f"{mode}: list says records {write['records']}, unacknowledged {write['unacknowledged']}")
    assert 0 < write["unacknowledged"] < write["records"] <= ROWS  # each once: the sum counted retried ones again
    if mode == "at_least_once":  # (exactly_once's acknowledged records are in transactions that never committed)
        found = ids_in_topic(dying.bootstrap_servers, topic, timeout_s=60)
        print(f"{mode}: {len(found)} distinct records in Kafka")
        assert write["records"] - write["unacknowledged"] <= len(found)  # what was acknowledged is there
        assert len(found) + write["unacknowledged"] >= write["records"]  # all logged is there or still in the WAL

    # The documented recovery: the same write id, once the broker is back.
    write_id = json.loads((tmp_path / "summary.jsonl").read_text().splitlines()[-1])["write_id"]
    rerun = subprocess.run(_job(dying, topic, tmp_path, mode, "--option", f"wal.writeId={write_id}"), cwd=REPO,
                           env=python_env(), capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr[-4000:]
    lost, duplicated, unexpected = verdict((f"bd-{i}" for i in range(ROWS)),
                                           ids_in_topic(dying.bootstrap_servers, topic, expected=ROWS))
    assert (lost, unexpected) == (0, 0)
    if mode == "exactly_once":
        assert duplicated == 0
