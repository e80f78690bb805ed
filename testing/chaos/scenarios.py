"""The fault scenarios. Each takes the lab, a seeded random generator and a size, runs one trial and
returns what the independent checker counted: lost (never landed), duplicated (landed twice), errors seen.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa

from chaos.checker import ids_in_topic, verdict
from chaos.lab import Lab, Trial, ancestor_with, kill_group, last_summary, python_subprocess
from devtools.kafka_check import count_topic
from devtools.kafka_local import REPO, KafkaCluster
from recoverable_sink import wal as wal_module
from tests.helpers import wait_until


def _check(trial: Trial, bootstrap: str, topic: str, ids: list[str]) -> Trial:
    found = ids_in_topic(bootstrap, topic, expected=len(ids))
    trial.lost, trial.duplicated, unexpected = verdict(ids, found)
    trial.records_expected = len(ids)
    if unexpected:
        trial.errors.append(f"{unexpected} records with ids that were never written")
    trial.passed = trial.passed and trial.lost == 0 and trial.duplicated == 0 and not unexpected
    return trial


def _short(exc: BaseException) -> str:
    """The sink's own message out of a Spark/Py4J exception (the first line naming recoverable_sink)."""
    text = str(exc)
    for line in text.splitlines():
        if "recoverable_sink.errors." in line or "Error:" in line and "recoverable" in line:
            return line.strip()[:400]
    return text.splitlines()[0][:400] if text else type(exc).__name__


def _wait_for_records(bootstrap: str, topic: str, target: float, done: threading.Event) -> None:
    """Block until the topic holds ``target`` records or the write is over."""
    wait_until(lambda: done.is_set() or count_topic(bootstrap, topic) >= target, 300,
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
                        **{"test.killAfterRecords": str(k)})
    trial = Trial(notes={"kill_after": k, "retried_partitions": summary["retried_partitions"],
                         "skipped": summary["skipped"]})
    trial.passed = summary["retried_partitions"] > 0
    return _check(trial, lab.kafka.bootstrap_servers, topic, ids)


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
    _check(trial, lab.kafka.bootstrap_servers, topic, ids)
    # Duplicates here are the documented in-flight window; a kill that hit no writer proves nothing.
    trial.passed = trial.lost == 0 and not trial.errors and ("killed_pid" in notes or summary is not None)
    return trial


# ---- 2. Executor JVM SIGKILL on local-cluster ------------------------------------------------------------

def executor_jvm_kill(lab: Lab, rng: random.Random, n: int) -> Trial:
    """On local-cluster[2,1,1024], the executor JVM running a task is SIGKILLed once the task's first k
    records are acknowledged; the task is rescheduled on an executor of the same host, where the WAL is."""
    d, topic = lab.dir("executor-kill"), lab.topic(4)
    prefix = f"ex{rng.randrange(1 << 30):x}"
    k = rng.randint(max(1, n // 40), n // 4 - n // 40)
    marker = d / "paused"
    job = python_subprocess(
        ["-m", "chaos.jobs", "--master", "local-cluster[2,1,1024]", "--rows", str(n), "--prefix", prefix,
         "--bootstrap", lab.kafka.bootstrap_servers, "--topic", topic, "--wal", str(d / "wal"),
         "--summary", str(d / "summary.jsonl"), "--option", f"test.pauseAfterRecords={k}",
         "--option", f"test.pauseFile={marker}"], d / "job.log")
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
    return _check(trial, lab.kafka.bootstrap_servers, topic, [f"{prefix}-{i}" for i in range(n)])


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
    return _check(trial, cluster.bootstrap_servers, topic, ids)


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


def broker_down_past_delivery_timeout(lab: Lab, rng: random.Random, n: int) -> Trial:
    """The broker dies mid-write and stays down past delivery.timeout.ms: the job fails with an error naming
    topic and partition, the WAL keeps what Kafka did not acknowledge, and `recoverable-kafka-wal replay`
    delivers it once the broker is back."""
    d, topic, df, ids, target = _random_fault_setup(lab, rng, n, "broker-down", 4)
    notes: dict[str, object] = {"at_records": int(target)}

    def fault(done: threading.Event) -> None:
        _wait_for_records(lab.kafka.bootstrap_servers, topic, target, done)
        notes["mid_write"] = not done.is_set()
        lab.kafka.kill_broker(1)

    trial = Trial(notes=notes)
    try:
        summary = _write_with_fault(trial, fault, lambda: lab.write(
            df, lab.kafka.bootstrap_servers, topic, d / "wal", d / "summary.jsonl",
            **{"kafka.delivery.timeout.ms": "6000", "kafka.request.timeout.ms": "3000"}))
    finally:
        lab.kafka.start_broker(1)
    if summary is not None:
        trial.notes["outcome"] = "the write finished before the broker died"
        return _check(trial, lab.kafka.bootstrap_servers, topic, ids)
    error = trial.errors[-1] if trial.errors else ""
    if "did not acknowledge" not in error:
        trial.passed = False
    write_id = last_summary(d / "summary.jsonl")["write_id"]
    # What the WAL holds as never acknowledged: records whose delivery timed out are among them, and the broker
    # may have stored those before it died (librdkafka cannot tell; its Python binding does not expose the
    # message's persistence status).
    unknown_fate = _wal_ids(d / "wal", acked=False) - _wal_ids(d / "wal", acked=True)
    trial.notes["unacknowledged_in_wal"] = len(unknown_fate)
    replay = _cli("replay", "--path", str(d / "wal"), "--write-id", write_id,
                  "--bootstrap-servers", lab.kafka.bootstrap_servers)
    if replay.returncode != 0:
        trial.errors.append(f"replay failed: {replay.stderr[-500:]}")
        trial.passed = False
    else:
        trial.notes["replay"] = json.loads(replay.stdout.splitlines()[-1])
    found = ids_in_topic(lab.kafka.bootstrap_servers, topic, expected=len(ids))
    trial.lost, trial.duplicated, unexpected = verdict(ids, found)
    trial.records_expected = len(ids)
    repeated = {i for i, c in found.items() if c > 1}
    trial.notes["repeated_outside_unknown_fate"] = len(repeated - unknown_fate)
    # No loss; a repeat is only allowed for a record whose delivery timed out, never for an acknowledged one.
    trial.passed = trial.passed and trial.lost == 0 and not unexpected and repeated <= unknown_fate
    return trial


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
    args = ["-m", "devtools.stream_job", "--source", "files", "--input", str(source), "--max-per-trigger", "1",
            "--bootstrap", lab.kafka.bootstrap_servers, "--topic", topic, "--checkpoint", str(d / "checkpoint"),
            "--wal", str(d / "wal"), "--summary", str(d / "summary.jsonl"),
            "--option", f"test.pauseAfterRecords={k}", "--option", f"test.pauseFile={marker}"]
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
    return _check(trial, lab.kafka.bootstrap_servers, topic, [str(i) for i in range(files * per_file)])


# ---- 7. WAL bound ----------------------------------------------------------------------------------------

def _wal_ids(wal_path: Path, acked: bool | None = None) -> set[str]:
    """Keys held by every attempt in a WAL (only the (un)acknowledged ones if ``acked`` is given)."""
    wal = wal_module.open_wal(str(wal_path))
    keys: set[str] = set()
    for attempt in wal.attempts():
        for seg in wal.segments(attempt.key):
            for i, key in enumerate(seg.batch.column("key").to_pylist()):
                if acked is None or bool(seg.acked[i]) == acked:
                    keys.add(key if isinstance(key, str) else key.decode())
    return keys


def wal_bound(lab: Lab, rng: random.Random, n: int) -> Trial:
    """wal.maxBytes reached mid-partition: a clear error; every record the WAL accepted is in Kafka once or
    still in the WAL; the ones it refused were never published."""
    d, topic = lab.dir("wal-bound"), lab.topic(1)
    df, ids = lab.records(n, 1)
    bound = rng.randint(250_000, 600_000)  # one to three 2,000-record segments fit
    trial = Trial(notes={"wal.maxBytes": bound})
    try:
        lab.write(df, lab.kafka.bootstrap_servers, topic, d / "wal", d / "summary.jsonl",
                  **{"wal.maxBytes": str(bound)})
        trial.errors.append("the write succeeded although the WAL bound is smaller than the data")
        trial.passed = False
    except Exception as exc:  # noqa: BLE001
        message = _short(exc)
        trial.errors.append(message)
        trial.passed = f"wal.maxBytes={bound}" in message and "nothing was dropped" in message
    found = ids_in_topic(lab.kafka.bootstrap_servers, topic)
    accepted, pending = _wal_ids(d / "wal"), _wal_ids(d / "wal", acked=False)
    trial.records_expected = len(accepted)
    trial.lost = sum(1 for i in accepted if found[i] == 0 and i not in pending)
    trial.duplicated = sum(c - 1 for c in found.values() if c > 1)
    trial.notes.update(accepted=len(accepted), in_kafka=len(found), refused=len(ids) - len(accepted))
    trial.passed = trial.passed and trial.lost == 0 and trial.duplicated == 0 and set(found) <= accepted
    return trial


# ---- 8. WAL corruption -----------------------------------------------------------------------------------

def _make_wal(path: Path, topic: str, rows: int) -> str:
    wal = wal_module.open_wal(str(path))
    key = wal.begin_attempt("corrupt-write", 0, 0, {"kind": "batch", "topic": topic})
    for first in range(0, rows, 500):
        batch = pa.RecordBatch.from_arrays(
            [pa.array([f"c-{i}".encode() for i in range(first, first + 500)]),
             pa.array([f"MARK-{i:06d}-".encode() + b"v" * 40 for i in range(first, first + 500)])],
            names=["key", "value"])
        wal.append(key, first, batch, 1 << 30, {})
    wal.env.close()
    wal_module._envs.pop(os.path.abspath(path), None)
    return key


def wal_corruption(lab: Lab, rng: random.Random, n: int) -> Trial:
    """A flipped byte inside a record and a truncated data file: `replay` refuses both, naming the location,
    and publishes nothing."""
    trial = Trial(records_expected=0)
    for damage in ("flip", "truncate"):
        d, topic = lab.dir(f"corrupt-{damage}"), lab.topic(1)
        _make_wal(d / "wal", topic, 2000)
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
            writer = spark.range(5, numPartitions=1).selectExpr(*select).write.format("recoverable_kafka")
            writer = writer.option("kafka.bootstrap.servers", bootstrap).option("wal.path", str(d / name))
            if topic:
                writer = writer.option("topic", topic)
            for k, v in options.items():
                writer = writer.option(k, v)
            return writer.mode(mode).save()
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
         r"record 4: key+value is 20000 bytes", **{"kafka.message.max.bytes": "10000"})
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
    ok = python_subprocess(["-m", "chaos.jobs", *common, "--bootstrap", lab.kafka.bootstrap_servers,
                            "--wal", str(d / "wal"), "--option", f"kafka.sasl.password={secret}",
                            "--option", f"kafka.ssl.key.password={key_secret}",
                            "--option", "kafka.sasl.username=alice"], d / "ok.log",
                           RECOVERABLE_SINK_LOG_LEVEL="DEBUG")
    failing = python_subprocess(["-m", "chaos.jobs", *common, "--bootstrap", lab.kafka.bootstrap_servers,
                                 "--wal", str(d / "wal2"), "--option", "kafka.security.protocol=SASL_SSL",
                                 "--option", "kafka.sasl.mechanism=PLAIN", "--option", "kafka.sasl.username=alice",
                                 "--option", f"kafka.sasl.password={secret}",
                                 "--option", "preflight.timeoutMs=3000"], d / "fail.log")
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


SCENARIOS: list[tuple[str, Callable[[Lab, random.Random, int], Trial], bool]] = [
    # (name, function, strict: lost and duplicated must both be 0). Every scenario requires lost == 0; 1b and 5
    # allow repeats only where the sink cannot know the outcome (see README, Guarantees).
    ("1. Python worker SIGKILL at a checkpoint (local[2,4])", python_worker_kill, True),
    ("1b. Python worker SIGKILL at a random moment", python_worker_kill_random_moment, False),
    ("2. Executor JVM SIGKILL (local-cluster[2,1,1024])", executor_jvm_kill, True),
    ("3. Broker SIGKILL and restart, single broker", broker_kill_single, True),
    ("4. Partition leader SIGKILL, 3 brokers, RF 3, min.isr 2", leader_kill_three_brokers, True),
    ("5. Broker down past delivery.timeout.ms, then replay", broker_down_past_delivery_timeout, False),
    ("6. Streaming driver SIGKILL and restart from checkpoint", stream_driver_kill, True),
    ("7. WAL bound (wal.maxBytes) reached", wal_bound, False),
    ("8. WAL corruption: flipped byte, truncated file", wal_corruption, False),
    ("9. Disk full under wal.path (1 MiB tmpfs)", disk_full, False),
    ("10. Bad inputs", bad_inputs, False),
    ("11. Security: WAL modes, secrets never logged", security, False),
]
