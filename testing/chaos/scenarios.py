"""The fault scenarios. Each takes the lab, a seeded random generator and a size, runs one trial and
returns what the independent checker counted: lost (never landed), duplicated (landed twice), errors seen.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
from confluent_kafka import KafkaException

from recoverable_sink import wal as wal_module
from recoverable_sink.identity import record_digests
from testing.chaos.checker import ids_in_topic, verdict
from testing.chaos.lab import Lab, Trial, ancestor_with, kill_group, last_summary, python_subprocess
from testing.chaos.retention import sweep_while_running
from testing.chaos.upstream import (
    long_stream_broker_state,
    stream_upstream_failures,
    transient_upstream_failure,
    upstream_failure,
)
from testing.kafka_check import count_topic
from testing.kafka_local import REPO, KafkaCluster
from testing.spark import sink_writer
from testing.standalone import StandaloneCluster
from testing.waiting import wait_until


def _check(lab: Lab, trial: Trial, bootstrap: str, topic: str, ids: list[str]) -> Trial:
    """Count as a read_committed consumer; under exactly_once, also report what read_uncommitted sees."""
    found = ids_in_topic(bootstrap, topic, expected=len(ids))
    trial.lost, trial.duplicated, unexpected = verdict(ids, found)
    trial.records_expected = len(ids)
    _report_uncommitted(lab, trial, bootstrap, topic, ids)
    if unexpected:
        trial.errors.append(f"{unexpected} records with ids that were never written")
    trial.passed = trial.passed and trial.lost == 0 and trial.duplicated == 0 and not unexpected
    return trial


def _report_uncommitted(lab: Lab, trial: Trial, bootstrap: str, topic: str, ids: list[str]) -> None:
    if lab.exactly_once:
        lost, duplicated, _ = verdict(ids, ids_in_topic(bootstrap, topic, isolation="read_uncommitted"))
        trial.notes["read_uncommitted"] = {"lost": lost, "duplicated": duplicated}


def _short(exc: BaseException) -> str:
    """The sink's own message out of a Spark/Py4J exception (the first line naming recoverable_sink)."""
    text = str(exc)
    for line in text.splitlines():
        if "recoverable_sink.errors." in line or "Error:" in line and "recoverable" in line:
            return line.strip()[:400]
    return text.splitlines()[0][:400] if text else type(exc).__name__


def _landed(bootstrap: str, topic: str) -> int:
    """Records in the topic so far, for waiting on a fault point: -1 while a leader does not answer (a broker
    just restarted by an earlier trial), which only means "not yet"."""
    try:
        return count_topic(bootstrap, topic)
    except KafkaException:
        return -1


def _wait_for_records(bootstrap: str, topic: str, target: float, done: threading.Event) -> None:
    """Block until the topic holds ``target`` records or the write is over."""
    wait_until(lambda: done.is_set() or _landed(bootstrap, topic) >= target, 300,
               "the write to reach the fault point", every_s=0.01)


def _write_with_fault(trial: Trial, fault: Callable[[threading.Event], None],
                      write: Callable[[], dict]) -> dict | None:
    """Run ``write`` on this thread (Spark finds a registered Python data source through the calling thread's
    active session) while ``fault`` waits for its moment on another; errors go into the trial."""
    done = threading.Event()
    fault_errors: list[BaseException] = []

    def guarded() -> None:
        try:
            fault(done)
        except BaseException as exc:  # noqa: BLE001
            fault_errors.append(exc)

    injector = threading.Thread(target=guarded, daemon=True)
    injector.start()
    summary = None
    try:
        summary = write()
    except Exception as exc:  # noqa: BLE001
        trial.errors.append(_short(exc))
    finally:
        done.set()
        injector.join(300)
    if fault_errors:
        trial.errors.append(f"fault injection failed: {fault_errors[0]}")
        trial.passed = False
    return summary


def _random_fault_setup(lab: Lab, rng: random.Random, n: int, name: str, partitions: int,
                        cluster: KafkaCluster | None = None,
                        replication: int | None = 1) -> tuple[Path, str, Any, list[str], float]:
    """Work dir, topic, 3n records and a random fault point between 10% and 60% of them."""
    cluster = cluster or lab.kafka
    d = lab.dir(name)
    topic = cluster.create_topic(f"chaos-{os.urandom(5).hex()}", 4, replication)
    df, ids = lab.records(3 * n, partitions)
    return d, topic, df, ids, rng.uniform(0.1, 0.6) * len(ids)


# ---- 1. Python worker SIGKILL ----------------------------------------------------------------------------

def python_worker_kill(lab: Lab, rng: random.Random, n: int) -> Trial:
    """Each partition's Python worker is SIGKILLed once its first k records are acknowledged (k random);
    Spark retries the tasks (local[2,4]) and the retries must skip what was delivered."""
    d, topic = lab.dir("worker-kill"), lab.topic(4)
    df, ids = lab.records(n, 4)
    k = rng.randint(max(1, n // 40), n // 4 - n // 40)
    summary = lab.write(df, lab.kafka.bootstrap_servers, topic, d / "wal", d / "summary.jsonl",
                        **{"_test.killAfterRecords": str(k)})
    trial = Trial(notes={"kill_after": k, "retried_partitions": summary["retried_partitions"],
                         "skipped": summary["skipped"]})
    trial.passed = summary["retried_partitions"] > 0
    return _check(lab, trial, lab.kafka.bootstrap_servers, topic, ids)


def _python_workers(wal_dir: Path) -> list[int]:
    """Spark Python workers (children of a pyspark.daemon) that have this WAL's data file open: the ones
    writing this trial's partitions, not idle reused workers."""
    target = str(wal_dir / "data.mdb")
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if b"pyspark.daemon" not in (entry / "cmdline").read_bytes():
                continue
            if any(os.readlink(fd) == target for fd in (entry / "fd").iterdir()):
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


def python_worker_kill_random_moment(lab: Lab, rng: random.Random, n: int) -> Trial:
    """A Python worker SIGKILLed from outside at a random moment of the write (not at a checkpoint). Kafka may
    have acknowledged records whose acknowledgement the worker had not yet made durable: the retry re-sends
    them. Expected: none lost; duplicates bounded by the records in flight at the kill."""
    d, topic, df, ids, target = _random_fault_setup(lab, rng, n, "worker-kill-random", 2)
    notes: dict[str, object] = {"at_records": int(target)}

    def fault(done: threading.Event) -> None:
        _wait_for_records(lab.kafka.bootstrap_servers, topic, target, done)
        workers = _python_workers(d / "wal")
        if not done.is_set() and workers:
            notes["killed_pid"] = rng.choice(workers)
            os.kill(notes["killed_pid"], signal.SIGKILL)  # type: ignore[arg-type]

    trial = Trial(notes=notes)
    summary = _write_with_fault(trial, fault, lambda: lab.write(df, lab.kafka.bootstrap_servers, topic, d / "wal",
                                                                 d / "summary.jsonl"))
    if summary:
        notes["retried_partitions"] = summary["retried_partitions"]
    _check(lab, trial, lab.kafka.bootstrap_servers, topic, ids)
    # Duplicates here are the documented in-flight window; a kill that hit no writer proves nothing.
    trial.passed = trial.lost == 0 and not trial.errors and ("killed_pid" in notes or summary is not None)
    return trial


# ---- 2. Executor JVM SIGKILL on local-cluster ------------------------------------------------------------

def executor_jvm_kill(lab: Lab, rng: random.Random, n: int, wipe_wal: bool = False) -> Trial:
    """On local-cluster[2,1,1024], the executor JVM running a task is SIGKILLed once the task's first k
    records are acknowledged; the task is rescheduled on an executor of the same host, where the WAL is
    (with ``wipe_wal``, the WAL directory is deleted too: the retry runs as if on another host)."""
    d, topic = lab.dir("executor-kill"), lab.topic(4)
    prefix = f"ex{rng.randrange(1 << 30):x}"
    k = rng.randint(max(1, n // 40), n // 4 - n // 40)
    marker = d / "paused"
    job = python_subprocess(
        ["-m", "testing.chaos.jobs", "--master", "local-cluster[2,1,1024]", "--rows", str(n), "--prefix", prefix,
         "--bootstrap", lab.kafka.bootstrap_servers, "--topic", topic, "--wal", str(d / "wal"),
         "--summary", str(d / "summary.jsonl"), "--option", f"_test.pauseAfterRecords={k}",
         "--option", f"_test.pauseFile={marker}", *lab.job_args()], d / "job.log")
    trial = Trial(notes={"kill_after": k})
    try:
        wait_until(lambda: marker.exists() or job.poll() is not None, 240, "a task to reach the kill point")
        if job.poll() is not None:
            raise RuntimeError((d / "job.log").read_text()[-2000:])
        worker_pid = int(marker.read_text().split()[3])
        executor = ancestor_with(worker_pid, "CoarseGrainedExecutorBackend")
        if executor is None:
            raise RuntimeError(f"no executor JVM above Python worker {worker_pid}")
        os.kill(executor, signal.SIGKILL)
        trial.notes["killed_executor_pid"] = executor
        if wipe_wal:
            shutil.rmtree(d / "wal")
            trial.notes["wal_deleted"] = True
        code = job.wait(300)
        if code != 0:
            raise RuntimeError((d / "job.log").read_text()[-2000:])
        summary = last_summary(d / "summary.jsonl")
        trial.notes.update(retried_partitions=summary["retried_partitions"], skipped=summary["skipped"])
        trial.passed = summary["retried_partitions"] > 0
    except Exception as exc:  # noqa: BLE001
        trial.errors.append(str(exc)[-600:])
        trial.passed = False
        kill_group(job)
        return trial
    return _check(lab, trial, lab.kafka.bootstrap_servers, topic, [f"{prefix}-{i}" for i in range(n)])


# ---- 3./4. Broker SIGKILL and restart mid-write -----------------------------------------------------------

def _broker_kill(lab: Lab, rng: random.Random, n: int, cluster: KafkaCluster, replication: int | None) -> Trial:
    d, topic, df, ids, target = _random_fault_setup(lab, rng, n, "broker-kill", 4, cluster, replication)
    down_s = rng.uniform(1.0, 5.0)
    notes: dict[str, object] = {"down_seconds": round(down_s, 2), "at_records": int(target)}

    def fault(done: threading.Event) -> None:
        _wait_for_records(cluster.bootstrap_servers, topic, target, done)
        victim = cluster.leader_of(topic, rng.randrange(4))
        notes.update(killed_broker=victim, mid_write=not done.is_set())
        cluster.kill_broker(victim)
        down_until = time.monotonic() + down_s  # the outage itself is the fault being injected
        while time.monotonic() < down_until:
            time.sleep(0.05)
        cluster.start_broker(victim)

    trial = Trial(notes=notes)
    _write_with_fault(trial, fault, lambda: lab.write(df, cluster.bootstrap_servers, topic, d / "wal",
                                                       d / "summary.jsonl"))
    trial.passed = not trial.errors
    return _check(lab, trial, cluster.bootstrap_servers, topic, ids)


def broker_kill_single(lab: Lab, rng: random.Random, n: int) -> Trial:
    """The only broker SIGKILLed mid-write and restarted after 1-5 s; librdkafka's idempotent retries
    carry the write through."""
    return _broker_kill(lab, rng, n, lab.kafka, 1)


def leader_kill_three_brokers(lab: Lab, rng: random.Random, n: int) -> Trial:
    """A partition leader of the 3-broker cluster (RF 3, min.insync.replicas 2, acks=all) SIGKILLed mid-write
    and restarted after 1-5 s."""
    return _broker_kill(lab, rng, n, lab.kafka3, 3)


# ---- 5. Broker down longer than the delivery timeout -----------------------------------------------------

def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "recoverable_sink.cli", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=600)


def _write_through_broker_death(lab: Lab, d: Path, topic: str, df: Any, target: float, notes: dict[str, object],
                                **options: str) -> tuple[Trial, dict | None]:
    """Write while the broker is SIGKILLed once ``target`` records landed; restart it when the write is over."""

    def fault(done: threading.Event) -> None:
        _wait_for_records(lab.kafka.bootstrap_servers, topic, target, done)
        notes["mid_write"] = not done.is_set()
        lab.kafka.kill_broker(1)

    trial = Trial(notes=notes)
    try:
        summary = _write_with_fault(trial, fault, lambda: lab.write(
            df, lab.kafka.bootstrap_servers, topic, d / "wal", d / "summary.jsonl",
            **{"kafka.request.timeout.ms": "3000", **options}))
    finally:
        lab.kafka.start_broker(1)
    return trial, summary


def _rerun_and_count(lab: Lab, trial: Trial, d: Path, topic: str, df: Any, ids: list[str],
                     unknown_fate: set[str]) -> Trial:
    """The documented recovery, a re-run under the failed write's wal.writeId, then the count: none lost, and
    a repeat only of a record whose fate was unknown (in flight when the broker died), never of one Kafka had
    acknowledged."""
    write_id = last_summary(d / "summary.jsonl")["write_id"]
    try:
        rerun = lab.write(df, lab.kafka.bootstrap_servers, topic, d / "wal", d / "summary.jsonl",
                          **{"wal.writeId": write_id})
        trial.notes["rerun"] = {k: rerun[k] for k in ("published", "skipped")}
    except Exception as exc:  # noqa: BLE001
        trial.errors.append(f"re-run with wal.writeId failed: {_short(exc)}")
        trial.passed = False
    found = ids_in_topic(lab.kafka.bootstrap_servers, topic, expected=len(ids))
    trial.lost, trial.duplicated, unexpected = verdict(ids, found)
    trial.records_expected = len(ids)
    _report_uncommitted(lab, trial, lab.kafka.bootstrap_servers, topic, ids)
    if lab.exactly_once:
        unknown_fate = set()  # an aborted transaction's records are invisible: nothing may repeat
    repeated = {i for i, c in found.items() if c > 1}
    trial.notes["repeated_outside_unknown_fate"] = len(repeated - unknown_fate)
    trial.passed = trial.passed and trial.lost == 0 and not unexpected and repeated <= unknown_fate
    return trial


def broker_down_past_delivery_timeout(lab: Lab, rng: random.Random, n: int) -> Trial:
    """The broker dies mid-write and stays down past delivery.timeout.ms: the job fails with an error naming
    topic and partition, the WAL keeps what Kafka did not acknowledge. Once the broker is back,
    `recoverable-kafka-wal replay --partitions 4` finishes the fully logged partitions and refuses the others
    (never exit 0 over a hole), then the documented recovery, a re-run with the same wal.writeId, sends the
    rest, partitions that never started included."""
    d, topic, df, ids, target = _random_fault_setup(lab, rng, n, "broker-down", 4)
    trial, summary = _write_through_broker_death(lab, d, topic, df, target, {"at_records": int(target)},
                                                 **{"kafka.delivery.timeout.ms": "6000"})
    if summary is not None:
        trial.notes["outcome"] = "the write finished before the broker died"
        return _check(lab, trial, lab.kafka.bootstrap_servers, topic, ids)
    error = trial.errors[-1] if trial.errors else ""
    # Under exactly_once a task that starts while the broker is down fails in init_transactions instead.
    if "did not acknowledge" not in error and not (lab.exactly_once and "init_transactions" in error):
        trial.passed = False
    # Records whose delivery timed out are among the unacknowledged ones, and the broker may have stored those
    # before it died (librdkafka cannot tell; its Python binding does not expose the persistence status).
    unknown_fate = _wal_ids(d / "wal", acked=False)
    trial.notes["unacknowledged_in_wal"] = len(unknown_fate)
    write_id = last_summary(d / "summary.jsonl")["write_id"]
    replay = _cli("replay", "--json", "--path", str(d / "wal"), "--write-id", write_id, "--partitions", "4",
                  "--bootstrap-servers", lab.kafka.bootstrap_servers)
    report = json.loads(replay.stdout.splitlines()[-1]) if replay.stdout.strip() else {}
    trial.notes["replay"] = {"exit": replay.returncode, "sent": report.get("sent"),
                             "refused": len(report.get("refused", []))}
    if (replay.returncode == 0) != (not report.get("refused")):
        trial.errors.append(f"replay exit {replay.returncode} does not match its refusals: {replay.stderr[-500:]}")
        trial.passed = False
    return _rerun_and_count(lab, trial, d, topic, df, ids, unknown_fate)


# ---- 6. Streaming driver SIGKILL and restart from checkpoint ---------------------------------------------

def stream_driver_kill(lab: Lab, rng: random.Random, n: int) -> Trial:
    """The streaming driver (JVM and Python workers with it) SIGKILLed mid-micro-batch once a task's first k
    records are acknowledged, then restarted from the same checkpoint."""
    d, topic = lab.dir("stream-kill"), lab.topic(2)
    files, per_file = 3, max(1, n // 3)
    source = d / "in"
    source.mkdir()
    for f in range(files):
        rows = (json.dumps({"id": i, "payload": "p"}) for i in range(f * per_file, (f + 1) * per_file))
        (source / f"part-{f}.json").write_text("\n".join(rows) + "\n")
    k = rng.randint(max(1, per_file // 20), per_file - per_file // 20)
    marker = d / "paused"
    args = ["-m", "testing.stream_job", "--source", "files", "--input", str(source), "--max-per-trigger", "1",
            "--bootstrap", lab.kafka.bootstrap_servers, "--topic", topic, "--checkpoint", str(d / "checkpoint"),
            "--wal", str(d / "wal"), "--summary", str(d / "summary.jsonl"),
            "--option", f"_test.pauseAfterRecords={k}", "--option", f"_test.pauseFile={marker}", *lab.job_args()]
    trial = Trial(notes={"kill_after": k})
    first = python_subprocess(args, d / "first.log")
    try:
        wait_until(lambda: marker.exists() or first.poll() is not None, 240, "the query to reach the kill point")
        if first.poll() is not None:
            raise RuntimeError((d / "first.log").read_text()[-2000:])
        kill_group(first)
        second = python_subprocess(args, d / "restart.log")
        if second.wait(300) != 0:
            raise RuntimeError((d / "restart.log").read_text()[-2000:])
    except Exception as exc:  # noqa: BLE001
        trial.errors.append(str(exc)[-600:])
        trial.passed = False
        kill_group(first)
        return trial
    return _check(lab, trial, lab.kafka.bootstrap_servers, topic, [str(i) for i in range(files * per_file)])


# ---- 7. WAL bound ----------------------------------------------------------------------------------------

def _wal_ids(wal_path: Path, acked: bool | None = None) -> set[str]:
    """Keys whose payload a WAL still holds (only the (un)acknowledged ones if ``acked`` is given)."""
    wal = wal_module.open_wal(str(wal_path))
    keys: set[str] = set()
    for attempt in wal.attempts():
        for seg in wal.segments(attempt.key):
            if seg.batch is None:  # all acknowledged: only digests are left
                continue
            for i, key in enumerate(seg.batch.column("key").to_pylist()):
                if acked is None or bool(seg.acked[i]) == acked:
                    keys.add(key if isinstance(key, str) else key.decode())
    return keys


def wal_bound(lab: Lab, rng: random.Random, n: int) -> Trial:
    """The broker dies at a random moment, so acknowledgements stop and unacknowledged payload piles up until
    wal.maxBytes refuses a batch: a clear error, no later batch in the log. The broker comes back and a re-run
    with the same wal.writeId delivers the rest: none lost."""
    d, topic, df, ids, target = _random_fault_setup(lab, rng, n, "wal-bound", 4)
    bound = rng.randint(250_000, 600_000)  # one to three 2,000-record segments of payload
    trial, summary = _write_through_broker_death(
        lab, d, topic, df, target, {"wal.maxBytes": bound, "at_records": int(target)},
        **{"wal.maxBytes": str(bound), "kafka.delivery.timeout.ms": "8000"})
    if summary is not None:
        trial.notes["outcome"] = "the write finished before the WAL filled"
        return _check(lab, trial, lab.kafka.bootstrap_servers, topic, ids)
    error = trial.errors[-1] if trial.errors else ""
    trial.notes["refused_by_bound"] = f"wal.maxBytes={bound}" in error
    if "wal.maxBytes" not in error and "did not acknowledge" not in error and \
            not (lab.exactly_once and "init_transactions" in error):
        trial.passed = False
    return _rerun_and_count(lab, trial, d, topic, df, ids, _wal_ids(d / "wal", acked=False))


# ---- 8. WAL corruption -----------------------------------------------------------------------------------

def _make_wal(path: Path, topic: str, rows: int, guarantee: str) -> str:
    wal = wal_module.open_wal(str(path))
    key = wal.begin_attempt("corrupt-write", 0, 0, {"kind": "batch", "topic": topic, "guarantee": guarantee})
    for first in range(0, rows, 500):
        batch = pa.RecordBatch.from_arrays(
            [pa.array([f"c-{i}".encode() for i in range(first, first + 500)]),
             pa.array([f"MARK-{i:06d}-".encode() + b"v" * 40 for i in range(first, first + 500)])],
            names=["key", "value"])
        wal.append(key, first, batch, record_digests(batch, topic, "cluster"), 1 << 30, {})
    wal.set_state(key, wal_module.LOGGED)
    wal_module.close_wal(str(path))
    return key


def wal_corruption(lab: Lab, rng: random.Random, n: int) -> Trial:
    """A flipped byte inside a record and a truncated data file. at_least_once: `replay` refuses both, naming
    the location, and publishes nothing from the damaged part. exactly_once (replay refuses such WALs by
    design): a re-run under the same wal.writeId recomputes its input and commits it once whatever the old
    log holds (a flipped byte), or is refused naming the damaged file before sending anything (truncated)."""
    trial = Trial(records_expected=0)
    for damage in ("flip", "truncate"):
        d, topic = lab.dir(f"corrupt-{damage}"), lab.topic(1)
        _make_wal(d / "wal", topic, 2000, lab.guarantee)
        data = d / "wal" / "data.mdb"
        if damage == "flip":
            raw = bytearray(data.read_bytes())
            record = rng.randrange(2000)
            at = raw.index(f"MARK-{record:06d}-".encode()) + rng.randrange(20)
            raw[at] ^= 1 << rng.randrange(8)
            data.write_bytes(bytes(raw))
            expect = "fail their CRC32"
        else:
            os.truncate(data, data.stat().st_size // 2)
            expect = "data.mdb is truncated"
        if lab.exactly_once:
            _rerun_damaged(lab, trial, d, topic, damage, expect)
            continue
        out = _cli("replay", "--path", str(d / "wal"), "--write-id", "corrupt-write",
                   "--bootstrap-servers", lab.kafka.bootstrap_servers)
        message = (out.stderr.strip().splitlines() or [""])[-1]
        trial.errors.append(f"{damage}: {message}")
        published = count_topic(lab.kafka.bootstrap_servers, topic)
        if out.returncode == 0 or expect not in message or str(d / "wal") not in message:
            trial.passed = False
        if damage == "flip" and published:
            # Segments before the damaged one are intact and may be replayed; never the damaged one.
            trial.notes["published_before_damage"] = published
        if damage == "truncate" and published:
            trial.passed = False
    return trial


def _rerun_damaged(lab: Lab, trial: Trial, d: Path, topic: str, damage: str, expect: str) -> None:
    df = lab.spark.range(2000, numPartitions=1).selectExpr(
        "concat('c-', CAST(id AS STRING)) AS key", "concat('MARK-', lpad(CAST(id AS STRING), 6, '0'), '-') AS value")
    try:
        lab.write(df, lab.kafka.bootstrap_servers, topic, d / "wal", d / "summary.jsonl",
                  **{"wal.writeId": "corrupt-write"})
        outcome = "re-run committed"
    except Exception as exc:  # noqa: BLE001
        outcome = _short(exc)
    trial.errors.append(f"{damage}: {outcome}")
    if damage == "truncate":
        published = count_topic(lab.kafka.bootstrap_servers, topic)
        trial.passed = trial.passed and expect in outcome and str(d / "wal") in outcome and not published
        return
    lost, duplicated, unexpected = verdict([f"c-{i}" for i in range(2000)],
                                           ids_in_topic(lab.kafka.bootstrap_servers, topic, expected=2000))
    trial.lost, trial.duplicated = trial.lost + lost, trial.duplicated + duplicated
    trial.records_expected += 2000
    trial.passed = trial.passed and outcome == "re-run committed" and not (lost or duplicated or unexpected)


# ---- 9. Disk full ----------------------------------------------------------------------------------------

def disk_full(lab: Lab, rng: random.Random, n: int) -> Trial:
    """wal.path on a 1 MiB tmpfs: the write fails with a clear disk-full error."""
    d, topic = lab.dir("disk-full"), lab.topic(1)
    tiny = d / "tiny"
    tiny.mkdir()
    trial = Trial()
    mount = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", str(tiny)],
                           capture_output=True, text=True)
    if mount.returncode != 0:
        trial.errors.append(f"skipped: cannot mount a small tmpfs here ({mount.stderr.strip()})")
        trial.notes["skipped"] = True
        return trial
    try:
        df, ids = lab.records(max(n, 20_000), 1)
        try:
            lab.write(df, lab.kafka.bootstrap_servers, topic, tiny / "wal", d / "summary.jsonl")
            trial.errors.append("the write succeeded on a full disk")
            trial.passed = False
        except Exception as exc:  # noqa: BLE001
            message = _short(exc)
            trial.errors.append(message)
            trial.passed = "disk is full" in message
        found = ids_in_topic(lab.kafka.bootstrap_servers, topic)
        trial.duplicated = sum(c - 1 for c in found.values() if c > 1)
        trial.notes["published_before_full"] = len(found)
        trial.passed = trial.passed and trial.duplicated == 0
    finally:
        subprocess.run(["umount", "-l", str(tiny)], capture_output=True)
    return trial


# ---- 10. Bad inputs --------------------------------------------------------------------------------------

def bad_inputs(lab: Lab, rng: random.Random, n: int) -> Trial:
    """Each bad input fails with its own clear message; driver-side ones before any task runs."""
    spark, bs = lab.spark, lab.kafka.bootstrap_servers
    d = lab.dir("bad-inputs")
    topic2 = lab.topic(2)
    long_value = "repeat('x', 20000)"
    cases: list[tuple[str, Callable[[], object], str]] = []

    def case(name: str, select: list[str], match: str, topic: str | None = topic2, mode: str = "append",
             bootstrap: str = bs, **options: str) -> None:
        def run() -> object:
            df = spark.range(5, numPartitions=1).selectExpr(*select)
            return sink_writer(df, bootstrap, topic, d / name, **{"delivery.guarantee": lab.guarantee, **options}) \
                .mode(mode).save()
        cases.append((name, run, match))

    value = "CAST(id AS STRING) AS value"
    case("no value column", ["CAST(id AS STRING) AS key"], "needs a value column")
    case("value of wrong type", ["id AS value"], "column value has type bigint")
    case("key of wrong type", ["id AS key", value], "column key has type bigint")
    case("headers of wrong shape", [value, "array('h') AS headers"], "column headers has type array<string>")
    case("null topic in a row", [value, "CASE WHEN id = 3 THEN NULL ELSE 'x' END AS topic"], "record 3: topic is null",
         topic=None)
    case("topic that does not exist", [value], "topic=missing-topic: the topic does not exist", topic="missing-topic")
    case("partition out of range", [value, "CAST(id AS INT) AS partition"], "record 2: partition 2 is out of range")
    case("record larger than message.max.bytes", [f"CASE WHEN id = 4 THEN {long_value} ELSE 'v' END AS value"],
         r"record 4: key+value with the record framing is 20036 bytes", **{"kafka.message.max.bytes": "10000"})
    case("unreachable bootstrap servers", [value], "cannot reach kafka.bootstrap.servers=127.0.0.1:1",
         bootstrap="127.0.0.1:1", **{"preflight.timeoutMs": "2000"})
    case("malformed kafka.* option", [value], "kafka.linger.ms is not valid", **{"kafka.linger.ms": "soon"})
    (d / "file").write_text("x")
    case("wal.path not writable", [value], "cannot be created", **{"wal.path": str(d / "file" / "wal")})
    case("Overwrite save mode", [value], "save mode Overwrite is not supported", mode="overwrite")
    case("Ignore save mode", [value], "Ignore", mode="ignore")
    trial = Trial(records_expected=0)
    for name, run, match in cases:
        try:
            run()
            trial.errors.append(f"{name}: NO ERROR")
            trial.passed = False
        except Exception as exc:  # noqa: BLE001
            message = _short(exc)
            ok = match in str(exc)
            trial.errors.append(f"{name}: {message}" + ("" if ok else f"  (expected: {match})"))
            trial.passed = trial.passed and ok
    return trial


# ---- 11. Security ----------------------------------------------------------------------------------------

def security(lab: Lab, rng: random.Random, n: int) -> Trial:
    """WAL directory 0700 and files 0600; SASL/SSL secrets given as kafka.* options appear in no log line, no
    exception and no commit message, in a write that succeeds and one that fails."""
    d, topic = lab.dir("security"), lab.topic(2)
    secret, key_secret = f"Pw-{os.urandom(6).hex()}", f"Kp-{os.urandom(6).hex()}"
    trial = Trial(records_expected=0)
    common = ["--rows", "2000", "--prefix", "sec", "--topic", topic, "--summary", str(d / "summary.jsonl")]
    ok = python_subprocess(["-m", "testing.chaos.jobs", *common, "--bootstrap", lab.kafka.bootstrap_servers,
                            "--wal", str(d / "wal"), "--option", f"kafka.sasl.password={secret}",
                            "--option", f"kafka.ssl.key.password={key_secret}",
                            "--option", "kafka.sasl.username=alice", *lab.job_args()], d / "ok.log",
                           RECOVERABLE_SINK_LOG_LEVEL="DEBUG")
    failing = python_subprocess(["-m", "testing.chaos.jobs", *common, "--bootstrap", lab.kafka.bootstrap_servers,
                                 "--wal", str(d / "wal2"), "--option", "kafka.security.protocol=SASL_SSL",
                                 "--option", "kafka.sasl.mechanism=PLAIN", "--option", "kafka.sasl.username=alice",
                                 "--option", f"kafka.sasl.password={secret}",
                                 "--option", "preflight.timeoutMs=3000", *lab.job_args()], d / "fail.log")
    ok_code, fail_code = ok.wait(300), failing.wait(300)
    trial.notes.update(successful_write_exit=ok_code, failing_write_exit=fail_code)
    if ok_code != 0:
        trial.errors.append("the write with SASL settings on a PLAINTEXT listener failed: "
                            + (d / "ok.log").read_text()[-400:])
        trial.passed = False
    if fail_code == 0:
        trial.errors.append("the SASL_SSL write to a PLAINTEXT listener succeeded")
        trial.passed = False
    for name in ("ok.log", "fail.log", "summary.jsonl"):
        path = d / name
        text = path.read_text(errors="replace") if path.exists() else ""
        for s in (secret, key_secret):
            if s in text:
                trial.errors.append(f"a secret appears in {name}")
                trial.passed = False
    for root, dirs, files in os.walk(d / "wal"):
        for name in dirs + [""]:
            mode = os.stat(os.path.join(root, name)).st_mode & 0o777
            if mode != 0o700:
                trial.errors.append(f"{root}/{name} has mode {oct(mode)}")
                trial.passed = False
        for name in files:
            mode = os.stat(os.path.join(root, name)).st_mode & 0o777
            if mode != 0o600:
                trial.errors.append(f"{root}/{name} has mode {oct(mode)}")
                trial.passed = False
    if trial.passed:
        trial.errors.append("no secret in logs, exceptions or commit messages; WAL modes 0700/0600")
    return trial


# ---- 12. Streaming driver SIGKILL at random moments ------------------------------------------------------

def _stream_files(d: Path, files: int, per_file: int) -> Path:
    """JSON input files with increasing modification times, so micro-batch i (maxFilesPerTrigger=1) reads
    file i; ids 0..files*per_file-1 (each trial writes to a fresh topic)."""
    source = d / "in"
    source.mkdir()
    base = time.time() - 3600
    for f in range(files):
        rows = (json.dumps({"id": i, "payload": "p" * 40})
                for i in range(f * per_file, (f + 1) * per_file))
        path = source / f"part-{f:03d}.json"
        path.write_text("\n".join(rows) + "\n")
        os.utime(path, (base + f, base + f))
    return source


def _stream_args(lab: Lab, source: Path, d: Path, bootstrap: str, topic: str) -> list[str]:
    return ["-m", "testing.stream_job", "--source", "files", "--input", str(source), "--max-per-trigger", "1",
            "--bootstrap", bootstrap, "--topic", topic, "--checkpoint", str(d / "checkpoint"),
            "--wal", str(d / "wal"), "--summary", str(d / "summary.jsonl"), *lab.job_args()]


def _commits(summary: Path) -> list[int]:
    if not summary.exists():
        return []
    return [json.loads(line)["batch_id"] for line in summary.read_text().splitlines()
            if line.strip() and json.loads(line)["event"] == "commit"]


def _kill_stream_at_random(lab: Lab, rng: random.Random, d: Path, args: list[str], topic: str, total: int,
                           kills: int, notes: dict[str, Any]) -> None:
    """Run the streaming driver, SIGKILL it ``kills`` times at random moments (one of them right after a
    micro-batch's commit() returned, before Spark may have written its commit log), restart it each time from
    the same checkpoint, and let the last run finish."""
    moments = []
    for k in range(kills):
        job = python_subprocess(args, d / f"run{k}.log")
        try:
            if k == 0:
                goal = len(_commits(d / "summary.jsonl")) + rng.randint(1, 3)
                wait_until(lambda j=job, g=goal: len(_commits(d / "summary.jsonl")) >= g or j.poll() is not None,
                           300, "a micro-batch to be committed", every_s=0.005)
                moments.append(f"right after batch {goal - 1}'s commit(), maybe before its commit log")
            else:
                target = rng.uniform(0.2, 0.9) * total
                wait_until(lambda j=job, t=target: _landed(lab.kafka.bootstrap_servers, topic) >= t
                           or j.poll() is not None, 300, "the query to reach the kill point", every_s=0.01)
                moments.append(f"at {int(target)} records in the topic")
        finally:
            kill_group(job)
    notes["kills"] = moments
    last = python_subprocess(args, d / "final.log")
    if last.wait(600) != 0:
        raise RuntimeError((d / "final.log").read_text()[-2000:])


def stream_driver_kill_random(lab: Lab, rng: random.Random, n: int) -> Trial:
    """The streaming driver SIGKILLed (with its JVM and Python workers) at random moments, one of them right
    after a micro-batch's tasks returned and its commit() ran, then restarted from the same checkpoint."""
    d, topic = lab.dir("stream-random"), lab.topic(2)
    files = 8
    per_file = max(1, n // files)
    source = _stream_files(d, files, per_file)
    trial = Trial(notes={})
    try:
        _kill_stream_at_random(lab, rng, d, _stream_args(lab, source, d, lab.kafka.bootstrap_servers, topic), topic,
                               files * per_file, 2, trial.notes)
    except Exception as exc:  # noqa: BLE001
        trial.errors.append(str(exc)[-600:])
        trial.passed = False
        return trial
    return _check(lab, trial, lab.kafka.bootstrap_servers, topic, [str(i) for i in range(files * per_file)])


# ---- 13. A restarted query that writes to another topic --------------------------------------------------

def stream_restart_to_another_topic(lab: Lab, rng: random.Random, n: int) -> Trial:
    """A streaming query to topic A is SIGKILLed at a random moment and restarted from the same checkpoint
    writing to topic B (Spark allows it): every record of a batch committed before the kill is in A, every
    record of the batches run after the restart is in B (none skipped because A had it), none twice in a
    topic."""
    d, topic_a, topic_b = lab.dir("stream-retopic"), lab.topic(2), lab.topic(2)
    files = 6
    per_file = max(1, n // files)
    source = _stream_files(d, files, per_file)
    bs = lab.kafka.bootstrap_servers
    trial = Trial(notes={})
    try:
        first = python_subprocess(_stream_args(lab, source, d, bs, topic_a), d / "run-a.log")
        target = rng.uniform(0.15, 0.75) * files * per_file
        try:
            wait_until(lambda: _landed(bs, topic_a) >= target or first.poll() is not None, 300,
                       "the query to reach the kill point", every_s=0.01)
        finally:
            kill_group(first)
        committed_before = set(_commits(d / "summary.jsonl"))
        second = python_subprocess(_stream_args(lab, source, d, bs, topic_b), d / "run-b.log")
        if second.wait(600) != 0:
            raise RuntimeError((d / "run-b.log").read_text()[-2000:])
    except Exception as exc:  # noqa: BLE001
        trial.errors.append(str(exc)[-600:])
        trial.passed = False
        return trial
    # The checkpoint's commit log may be one batch ahead of the summary lines (a kill between the two):
    # a batch is "in A" if its commit() ran before the kill, else B must have all of it.
    in_a, in_b = ids_in_topic(bs, topic_a), ids_in_topic(bs, topic_b)
    after = sorted(set(_commits(d / "summary.jsonl")) - committed_before)
    ids_of = {f: [str(i) for i in range(f * per_file, (f + 1) * per_file)] for f in range(files)}
    trial.records_expected = files * per_file
    trial.lost = sum(1 for f in range(files) for i in ids_of[f]
                     if (in_a[i] == 0 if f in committed_before else in_b[i] == 0))
    trial.duplicated = sum(c - 1 for c in in_a.values() if c > 1) + sum(c - 1 for c in in_b.values() if c > 1)
    trial.notes.update(at_records=int(target), batches_committed_to_a=sorted(committed_before),
                       batches_run_towards_b=after, in_a=len(in_a), in_b=len(in_b))
    trial.passed = trial.lost == 0 and trial.duplicated == 0 and set(range(files)) == committed_before | set(after)
    return trial


# ---- 14. A sink stage reading a shuffle, executor JVM SIGKILLed ------------------------------------------

def shuffle_executor_kill(lab: Lab, rng: random.Random, n: int) -> Trial:
    """On local-cluster[2,1,1024] the sink reads the output of repartition(8, id % 97), whose rows a retried
    task reads in another order; an executor JVM is SIGKILLed at a random moment of the write. Repeats are
    limited to records acknowledged after the last checkpoint (reported); none lost."""
    d, topic = lab.dir("shuffle-executor-kill"), lab.topic(4)
    prefix = f"sh{rng.randrange(1 << 30):x}"
    rows = 3 * n
    job = python_subprocess(
        ["-m", "testing.chaos.jobs", "--master", "local-cluster[2,1,1024]", "--rows", str(rows), "--prefix", prefix,
         "--shuffle", "8", "--bootstrap", lab.kafka.bootstrap_servers, "--topic", topic, "--wal", str(d / "wal"),
         "--summary", str(d / "summary.jsonl"), *lab.job_args()], d / "job.log")
    target = rng.uniform(0.1, 0.6) * rows
    trial = Trial(notes={"at_records": int(target)})
    try:
        wait_until(lambda: _landed(lab.kafka.bootstrap_servers, topic) >= target or job.poll() is not None,
                   300, "the write to reach the kill point", every_s=0.01)
        # The executors whose Python workers write this trial's partitions; between two tasks none may hold
        # the WAL open, so wait for one (or for the job's end).
        executors: set[int] = set()

        def writing_executors() -> bool:
            executors.update(e for e in (ancestor_with(w, "CoarseGrainedExecutorBackend")
                                         for w in _python_workers(d / "wal")) if e)
            return bool(executors) or job.poll() is not None

        wait_until(writing_executors, 60, "an executor writing this trial's partitions", every_s=0.01)
        if job.poll() is None:
            victim = rng.choice(sorted(executors))
            os.kill(victim, signal.SIGKILL)
            trial.notes["killed_executor_pid"] = victim
        if job.wait(400) != 0:
            raise RuntimeError((d / "job.log").read_text()[-2000:])
        summary = last_summary(d / "summary.jsonl")
        trial.notes.update(retried_partitions=summary["retried_partitions"], skipped=summary["skipped"])
    except Exception as exc:  # noqa: BLE001
        trial.errors.append(str(exc)[-600:])
        trial.passed = False
        kill_group(job)
        return trial
    _check(lab, trial, lab.kafka.bootstrap_servers, topic, [f"{prefix}-{i}" for i in range(rows)])
    if "killed_executor_pid" not in trial.notes:
        trial.notes["outcome"] = "the write finished before the kill"
    trial.passed = trial.lost == 0 and not trial.errors
    return trial


def executor_kill_wal_lost(lab: Lab, rng: random.Random, n: int) -> Trial:
    trial = executor_jvm_kill(lab, rng, n, wipe_wal=True)
    if not lab.exactly_once:  # the retry cannot know what the lost WAL saw acknowledged: it re-sends (README)
        trial.passed = trial.lost == 0 and not trial.errors and trial.notes.get("retried_partitions", 0) > 0
    return trial


# ---- 16. Speculative execution -----------------------------------------------------------------------

def speculation(lab: Lab, rng: random.Random, n: int) -> Trial:
    """``spark.speculation=true`` on a standalone cluster of two hosts to Spark (workers advertised as
    127.0.0.1 and localhost, each with its own WAL directory): one task stalls mid-write after a random number
    of records, Spark starts a copy on the other host, the copy finishes first; the stalled attempt is then
    killed by Spark or wakes up as a zombie. Under exactly_once the copy's init_transactions fences the stalled
    attempt and aborts its open transaction: nothing lost, nothing repeated. Under at_least_once nothing is
    lost, and the copy repeats what the stalled attempt had sent (it cannot see another host's WAL)."""
    d, topic = lab.dir("speculation"), lab.topic(4)
    prefix = f"sp{rng.randrange(1 << 30):x}"
    k = rng.randint(max(1, n // 40), n // 4 - n // 40)
    marker = d / "stalled"
    hosts = {"127.0.0.1": {"RECOVERABLE_KAFKA_WAL_PATH": str(d / "wal-host-a")},
             "localhost": {"RECOVERABLE_KAFKA_WAL_PATH": str(d / "wal-host-b")}}
    trial = Trial(notes={"stall_after": k})
    conf = {"spark.speculation": "true", "spark.speculation.interval": "200ms", "spark.speculation.quantile": "0.5",
            "spark.speculation.multiplier": "2", "spark.speculation.minTaskRuntime": "2s",
            "spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1", "spark.cores.max": "2",
            "spark.executor.cores": "1"}
    with StandaloneCluster(d / "cluster", hosts) as cluster:
        job = python_subprocess(
            ["-m", "testing.chaos.jobs", "--master", cluster.master_url, "--rows", str(n), "--prefix", prefix,
             "--bootstrap", lab.kafka.bootstrap_servers, "--topic", topic, "--summary", str(d / "summary.jsonl"),
             "--option", f"_test.pauseAfterRecords={k}", "--option", f"_test.pauseFile={marker}",
             "--option", "_test.pauseSeconds=90", *lab.job_args(),
             *[arg for item in conf.items() for arg in ("--conf", "=".join(item))]],
            d / "job.log", SPARK_LOCAL_IP="127.0.0.1")
        try:
            code = job.wait(400)
        except subprocess.TimeoutExpired:
            kill_group(job)
            code = -1
    if code != 0:
        trial.errors.append((d / "job.log").read_text(errors="replace")[-1500:])
        trial.passed = False
        return trial
    stalled = int(marker.read_text().split()[1]) if marker.exists() else None
    tasks = {t["partition"]: t for t in last_summary(d / "summary.jsonl")["tasks"]}
    winner = tasks.get(stalled) if stalled is not None else None
    trial.notes.update(stalled_partition=stalled, committed_by_attempt=winner and winner["attempt"],
                       committed_wal=winner and winner["wal_path"])
    if winner is None or winner["attempt"] == 0:
        trial.errors.append("no speculative copy committed the stalled partition")
        trial.passed = False
    _check(lab, trial, lab.kafka.bootstrap_servers, topic, [f"{prefix}-{i}" for i in range(n)])
    if not lab.exactly_once:
        trial.passed = trial.lost == 0 and not trial.errors  # at_least_once repeats across hosts (README)
    return trial


ALO, EO = "at_least_once", "exactly_once"


@dataclass(frozen=True)
class Scenario:
    id: str  # what CHAOS_ONLY and the test ids use
    title: str
    run: Callable[[Lab, random.Random, int], Trial]
    strict: bool  # lost and duplicated must both be 0 (every scenario requires lost == 0)
    # delivery.guarantee values it runs under; under exactly_once every scenario is strict (read_committed)
    modes: tuple[str, ...] = (ALO, EO)


# Non-strict scenarios allow repeats only where the sink cannot know the outcome (records acknowledged after
# the last checkpoint of a killed process, or in flight when a broker died): see README, Guarantees.
SCENARIOS: list[Scenario] = [
    Scenario("1", "1. Python worker SIGKILL at a checkpoint (local[2,4])", python_worker_kill, True),
    Scenario("1b", "1b. Python worker SIGKILL at a random moment", python_worker_kill_random_moment, False),
    Scenario("2", "2. Executor JVM SIGKILL (local-cluster[2,1,1024])", executor_jvm_kill, True),
    Scenario("3", "3. Broker SIGKILL and restart, single broker", broker_kill_single, True),
    Scenario("4", "4. Partition leader SIGKILL, 3 brokers, RF 3, min.isr 2", leader_kill_three_brokers, True),
    Scenario("5", "5. Broker down past delivery.timeout.ms, then replay and re-run", broker_down_past_delivery_timeout,
             False),
    Scenario("6", "6. Streaming driver SIGKILL at a checkpoint, restart from checkpoint", stream_driver_kill, True),
    Scenario("7", "7. wal.maxBytes reached (broker killed at random), then re-run", wal_bound, False),
    Scenario("8", "8. WAL corruption: flipped byte, truncated file", wal_corruption, False),
    Scenario("9", "9. Disk full under wal.path (1 MiB tmpfs)", disk_full, False),
    Scenario("10", "10. Bad inputs", bad_inputs, False),
    Scenario("11", "11. Security: WAL modes, secrets never logged", security, False),
    Scenario("12", "12. Streaming driver SIGKILL at random moments (one after a batch's commit())",
             stream_driver_kill_random, True),
    Scenario("13", "13. Streaming query killed at random, restarted towards another topic",
             stream_restart_to_another_topic, True),
    Scenario("14", "14. Shuffle before the sink, executor JVM SIGKILL at random (local-cluster)",
             shuffle_executor_kill, False),
    # At-least-once repeats what the lost WAL had seen acknowledged (its documented limit): no loss is all it
    # promises there; exactly_once is strict, as everywhere.
    Scenario("15", "15. Executor JVM SIGKILL and its WAL directory deleted (retry as on another host)",
             executor_kill_wal_lost, False),
    Scenario("16", "16. spark.speculation: a stalled task and its copy on another host (standalone cluster)",
             speculation, False),
    Scenario("17", "17. A task failing upstream of the sink in every attempt, then a re-run", upstream_failure, True),
    Scenario("18", "18. Every task's first attempt failing upstream of the sink", transient_upstream_failure, True),
    Scenario("19", "19. A stream failing upstream of the sink, restarted with a transient failure",
             stream_upstream_failures, True),
    Scenario("20", "20. exactly_once stream of 200 micro-batches: transactional ids and marker groups",
             long_stream_broker_state, True, (EO,)),
    Scenario("21", "21. wal.retentionHours of 2 s, swept while a task waits for its input", sweep_while_running,
             True),
]
