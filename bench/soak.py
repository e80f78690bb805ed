"""``make soak``: the sink over time. Two streaming queries, one per delivery mode, read Spark's ``rate`` source at
a fixed rate (each row's number is its key) and write to a 3-broker cluster for ``SOAK_MINUTES``, while faults
land at random moments every few minutes: a Python worker SIGKILLed, a driver SIGKILLed and restarted from its
checkpoint, a broker SIGKILLed and restarted. Every minute it samples, per query: the Python workers' RSS and
anonymous memory, open files and threads (the largest worker's), the driver's RSS, the WAL's bytes on disk and
live attempts, the transactional ids and marker groups on the brokers, the read_committed lag (records written but
not yet visible to a read_committed reader), and the query's proof topic's bytes on the brokers' disks (what
compaction frees shows there, not in its offsets). Each query's proof topic is made before it starts, with the
sink's settings but segments of SOAK_PROOF_SEGMENT_MS (a minute; the sink's own roll every hour or 64 MiB) and
tombstones kept SOAK_PROOF_TOMBSTONE_MS (a minute; the sink's own, an hour), so that compaction shows within the soak:
released proof must not accumulate. (With the sink's settings the topic grows for an hour, by the releases'
tombstones, then stays flat.)

At the end each query is stopped between micro-batches and checked: the committed micro-batches (from the
sink's summary lines) hold rows 0..N-1; under exactly_once a read_committed reader must see each once, under
at_least_once at least once. Each series' growth per hour after warm-up goes to build/soak/results.json, the
series to build/soak/results.png. Then ``bench.sizes`` (cost over size) adds its section.

    make soak                      # SOAK_MINUTES=30 SOAK_RATE=1000 SOAK_FAULT_EVERY_S=180 SOAK_SAMPLE_S=60
                                   # SOAK_PROOF_SEGMENT_MS=60000 SOAK_PROOF_TOMBSTONE_MS=60000
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.rss import cmdline, descends_from, rss_kib
from bench.sizes import DiskSampler
from testing.chaos.checker import ids_in_topic
from testing.chaos.lab import kill_group, python_subprocess
from testing.kafka_check import consumer_groups, end_offsets, transactional_ids
from testing.kafka_local import REPO, KafkaCluster

OUT = REPO / "build" / "soak"
MODES = ("exactly_once", "at_least_once")


@dataclass
class Query:
    mode: str
    d: Path
    topic: str
    prefix: str
    args: list[str]
    proc: subprocess.Popen | None = None
    restarts: int = 0
    samples: list[dict[str, float]] = field(default_factory=list)

    def start(self) -> None:
        self.proc = python_subprocess(self.args, self.d / f"run{self.restarts}.log")
        self.restarts += 1

    def processes(self) -> tuple[list[int], int | None]:
        """The query's Python workers, and its driver JVM."""
        if self.proc is None:
            return [], None
        workers, jvm = [], None
        for name in os.listdir("/proc"):
            if not name.isdigit() or not descends_from(int(name), self.proc.pid):
                continue
            cmd = cmdline(int(name))
            if "pyspark.daemon" in cmd or "pyspark.worker" in cmd:
                workers.append(int(name))
            elif "java" in cmd.split(" ", 1)[0]:
                jvm = int(name)
        return workers, jvm


def _count(path: str) -> int:
    try:
        return len(os.listdir(path))
    except OSError:
        return 0


def _threads(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("Threads:"))
    except (OSError, StopIteration, ValueError):
        return 0


def _committed_lag(bootstrap: str, topic: str) -> int:
    """Records past the last stable offset: written in transactions not yet committed (or aborted)."""
    from confluent_kafka import Consumer, TopicPartition

    high = end_offsets(bootstrap, topic)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "soak-lag", "isolation.level": "read_committed"})
    try:
        stable = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in high}
    finally:
        consumer.close()
    return sum(max(0, high[p] - stable[p]) for p in high)


def _proof_topic(q: Query) -> str:
    return f"{q.prefix}proof"


def _make_proof_topic(cluster: KafkaCluster, q: Query, segment_ms: int, tombstones_ms: int) -> None:
    from recoverable_sink.options import parse_options
    from recoverable_sink.proof.topic import topic_configs

    options = parse_options({"kafka.bootstrap.servers": cluster.bootstrap_servers, "topic": q.topic,
                             "transactional.id.prefix": q.prefix})
    assert options.proof is not None
    config = {**topic_configs(options.proof), "segment.ms": str(segment_ms), "delete.retention.ms": str(tombstones_ms)}
    cluster.create_topic(_proof_topic(q), options.proof.partitions, config=config)


def _proof_mib(cluster: KafkaCluster, q: Query) -> float:
    """The proof topic's log bytes on every broker's disk (all replicas)."""
    topic = _proof_topic(q)
    size = 0
    for node in cluster.node_ids:
        data = cluster.node_dir(node) / "data"
        for d in data.iterdir() if data.exists() else ():
            if d.is_dir() and d.name.rsplit("-", 1)[0] == topic:
                size += sum(f.stat().st_size for f in d.glob("*.log"))
    return size / 2**20


def sample(q: Query, cluster: KafkaCluster, started: float) -> dict[str, float]:
    bootstrap = cluster.bootstrap_servers
    from recoverable_sink.wal import open_wal

    workers, jvm = q.processes()
    mem = [m for m in (rss_kib(p) for p in workers) if m is not None]
    disk = DiskSampler(q.d / "wal")
    disk.sample()
    wal = q.d / "wal"
    attempts = len(open_wal(str(wal)).attempts()) if (wal / "data.mdb").exists() else 0
    driver = rss_kib(jvm) if jvm is not None else None
    return {"minute": round((time.monotonic() - started) / 60, 2),
            # Per worker, the largest: what runs an executor out of memory (a killed worker's successor starts small).
            "worker_rss_mib": max((m[0] for m in mem), default=0) / 1024,
            "worker_anon_mib": max((m[1] for m in mem), default=0) / 1024,
            "driver_rss_mib": driver[0] / 1024 if driver else 0.0, "wal_mib": disk.peak / 2**20,
            "wal_attempts": attempts, "worker_fds": max((_count(f"/proc/{p}/fd") for p in workers), default=0),
            "worker_threads": max((_threads(p) for p in workers), default=0),
            "transactional_ids": len(transactional_ids(bootstrap, q.prefix)),
            "marker_groups": len(consumer_groups(bootstrap, q.prefix)),
            "read_committed_lag": _committed_lag(bootstrap, q.topic),
            "proof_topic_mib": _proof_mib(cluster, q)}


def fault(rng: random.Random, queries: list[Query], cluster: KafkaCluster) -> str:
    kind = rng.choice(["worker", "driver", "broker"])
    q = rng.choice(queries)
    if kind == "worker":
        workers, _ = q.processes()
        if workers:
            os.kill(rng.choice(workers), signal.SIGKILL)
            return f"{q.mode}: a Python worker SIGKILLed"
        kind = "driver"
    if kind == "driver":
        assert q.proc is not None
        kill_group(q.proc)
        q.start()
        return f"{q.mode}: the driver SIGKILLed and restarted from its checkpoint"
    node = rng.choice(cluster.node_ids)
    cluster.kill_broker(node)
    time.sleep(rng.uniform(2, 10))
    cluster.start_broker(node)
    return f"broker {node} SIGKILLed and restarted"


def growth_per_hour(samples: list[dict[str, float]], key: str) -> dict[str, float] | None:
    """The least-squares slope of a series after its first fifth (warm-up), per hour and as % of its mean per
    hour. A process's series leaves out the minutes it was down (a fault had just killed it)."""
    tail = samples[len(samples) // 5:]
    if key.startswith(("worker_", "driver_")):
        tail = [s for s in tail if s[key] > 0]
    if len(tail) < 3:
        return None
    xs, ys = [s["minute"] / 60 for s in tail], [s[key] for s in tail]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var if var else 0.0
    return {"per_hour": round(slope, 3), "percent_per_hour": round(100 * slope / my, 2) if my else 0.0}


def verdict(q: Query, bootstrap: str) -> dict[str, Any]:
    """Rows 0..N-1, N the records of the distinct committed micro-batches, against what a read_committed reader
    sees."""
    batches: dict[int, int] = {}
    for line in (q.d / "summary.jsonl").read_text().splitlines():
        entry = json.loads(line)
        if entry.get("event") == "commit":
            batches[int(entry["batch_id"])] = int(entry["received"])
    expected = sum(batches.values())
    found = ids_in_topic(bootstrap, q.topic, expected=expected, timeout_s=600)
    lost = sum(1 for i in range(expected) if found[str(i)] == 0)
    duplicated = sum(c - 1 for k, c in found.items() if c > 1 and int(k) < expected)
    return {"records": expected, "micro_batches": len(batches), "lost": lost, "duplicated": duplicated,
            "beyond_committed": sum(c for k, c in found.items() if int(k) >= expected)}


def plot(queries: list[Query], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [k for k in queries[0].samples[0] if k != "minute"]
    fig, axes = plt.subplots(len(keys) // 2 + len(keys) % 2, 2, figsize=(12, 2.4 * (len(keys) // 2 + 1)))
    for ax, key in zip(axes.flat, keys, strict=False):
        for q in queries:
            ax.plot([s["minute"] for s in q.samples], [s[key] for s in q.samples], label=q.mode)
        ax.set_title(key, fontsize=9)
        ax.set_xlabel("minutes", fontsize=8)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main() -> int:
    minutes = float(os.environ.get("SOAK_MINUTES", "30"))
    rate = int(os.environ.get("SOAK_RATE", "1000"))
    every_s = float(os.environ.get("SOAK_FAULT_EVERY_S", "180"))
    sample_s = float(os.environ.get("SOAK_SAMPLE_S", "60"))
    seed = int(os.environ.get("SOAK_SEED", str(time.time_ns() % 2**31)))
    rng = random.Random(seed)
    work = OUT / "work"
    subprocess.run(["rm", "-rf", str(work)], check=True)
    work.mkdir(parents=True)
    cluster = KafkaCluster(work / "kafka", 3)
    cluster.start()
    bootstrap = cluster.bootstrap_servers
    queries = []
    for mode in MODES:
        d = work / mode
        d.mkdir()
        topic, prefix = cluster.create_topic(f"soak-{mode}", 4), f"soak-{mode}-"
        args = ["-m", "testing.stream_job", "--source", "rate", "--rate", str(rate), "--bootstrap", bootstrap,
                "--topic", topic, "--checkpoint", str(d / "checkpoint"), "--wal", str(d / "wal"), "--summary",
                str(d / "summary.jsonl"), "--stop-file", str(d / "stop"), "--option", f"delivery.guarantee={mode}",
                "--option", f"transactional.id.prefix={prefix}"]
        queries.append(Query(mode, d, topic, prefix, args))
        _make_proof_topic(cluster, queries[-1], int(os.environ.get("SOAK_PROOF_SEGMENT_MS", "60000")),
                          int(os.environ.get("SOAK_PROOF_TOMBSTONE_MS", "60000")))
    faults: list[dict[str, Any]] = []
    try:
        for q in queries:
            q.start()
        started = time.monotonic()
        end = started + minutes * 60
        next_sample, next_fault = started + sample_s, started + rng.uniform(0.5, 1.5) * every_s
        while time.monotonic() < end:
            now = time.monotonic()
            if now >= next_sample:
                next_sample += sample_s
                try:
                    taken = [sample(q, cluster, started) for q in queries]
                except Exception as exc:  # noqa: BLE001 - a broker restarting: this minute goes unsampled
                    print(f"sample skipped: {exc}", flush=True)
                else:
                    for q, s in zip(queries, taken, strict=True):
                        q.samples.append(s)
                    print(json.dumps({q.mode: q.samples[-1] for q in queries}), flush=True)
            if now >= next_fault:
                what = fault(rng, queries, cluster)
                faults.append({"minute": round((now - started) / 60, 2), "fault": what})
                print(f"fault: {what}", flush=True)
                next_fault += rng.uniform(0.5, 1.5) * every_s
            for q in queries:
                if q.proc is not None and q.proc.poll() is not None:  # a driver that died of a fault: restart
                    faults.append({"minute": round((now - started) / 60, 2), "fault": f"{q.mode}: driver exited "
                                   f"{q.proc.returncode}, restarted"})
                    q.start()
            time.sleep(1)
        for q in queries:
            (q.d / "stop").touch()
        for q in queries:
            assert q.proc is not None
            if q.proc.wait(300) != 0:
                faults.append({"fault": f"{q.mode}: the last run exited {q.proc.returncode}"})
        results = {q.mode: {**verdict(q, bootstrap), "restarts": q.restarts - 1,
                            "growth": {k: growth_per_hour(q.samples, k) for k in q.samples[0] if k != "minute"},
                            "samples": q.samples} for q in queries}
    finally:
        for q in queries:
            if q.proc is not None:
                kill_group(q.proc)
        cluster.stop(timeout_s=30)
    passed = results["exactly_once"]["lost"] == 0 and results["exactly_once"]["duplicated"] == 0 and \
        results["at_least_once"]["lost"] == 0
    path = OUT / "results.json"
    doc = json.loads(path.read_text()) if path.exists() else {}
    doc["soak"] = {"minutes": minutes, "rate_per_query": rate, "seed": seed, "faults": faults, "passed": passed,
                   **results}
    path.write_text(json.dumps(doc, indent=2) + "\n")
    plot(queries, OUT / "results.png")
    print(json.dumps({m: {k: v for k, v in r.items() if k != "samples"} for m, r in results.items()}, indent=2))
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
