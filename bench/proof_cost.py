"""What proof of delivery kept in Kafka costs (the proof topic, ``proof.kafka``). Part of ``make bench``; alone,
against the development broker:

    .venv/bin/python -m bench.proof_cost      # PROOF_ROWS=1000000 PROOF_REPS=5 PROOF_HISTORY_ROWS=4000000

* **CPU**: the same rows written with the proof topic and without it (``proof.kafka=false``), in both delivery modes,
  interleaved, medians of PROOF_REPS; CPU per record of the driver, its JVM and the Python workers (the broker
  excluded). The target: the proof topic adds at most 5%.
* **Bytes**: one write of PROOF_ROWS per mode to a proof topic of its own: its log on the broker's disk per record
  (segments, batch headers included), and its records' keys and values per record. Nothing is compacted yet (the
  release of a generated-id write tombstones its proof; the cleaner frees it within about an hour).
* **A re-run's read**: a ``wal.writeId`` write that fails late in its last partition, re-run with a fresh
  ``wal.path`` (as on another host): the records, bytes and seconds its tasks read from the proof topic. Then the
  same after PROOF_HISTORY_ROWS rows of other writes' proof went into the same proof partition first: the read is
  bounded by what the failed run wrote, not by the topic's history.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import uuid
from pathlib import Path
from typing import Any

from bench.harness import OUT, Bench, run_alone
from testing.spark import sink_writer

ROWS = int(os.environ.get("PROOF_ROWS", "1000000"))
REPS = int(os.environ.get("PROOF_REPS", "5"))
HISTORY_ROWS = int(os.environ.get("PROOF_HISTORY_ROWS", "4000000"))
PARTITIONS = 4
EXACTLY_ONCE = {"delivery.guarantee": "exactly_once"}
NO_PROOF = {"proof.kafka": "false"}


def measure(b: Bench) -> dict[str, Any]:
    """The three measurements; the ``proof_cost`` section of results.json."""
    from pyspark.sql import functions as F

    df = b.spark.range(0, ROWS, 1, PARTITIONS).select(
        F.col("id").cast("string").alias("key"), F.lpad(F.col("id").cast("string"), 100, "v").alias("value")).cache()
    df.count()
    out: dict[str, Any] = {"rows": ROWS, "partitions": PARTITIONS, "reps": REPS}
    out["cpu"] = _cpu(b, df)
    out["bytes"] = {mode: _bytes(b, df, mode, options) for mode, options in
                    (("at_least_once", {}), ("exactly_once", EXACTLY_ONCE))}
    out["rerun_read"] = _rerun_read(b, df)
    df.unpersist()
    return out


def _cpu(b: Bench, df: Any) -> dict[str, Any]:
    cases = {"wal_on": {}, "wal_on_no_proof": NO_PROOF, "exactly_once": EXACTLY_ONCE,
             "exactly_once_no_proof": {**EXACTLY_ONCE, **NO_PROOF}}
    for name, options in cases.items():  # warm-up: the JVM, the workers, the proof topic made once
        b.timed(f"{name} warm-up", PARTITIONS, ROWS, b.recoverable(df, True, **options))
    runs: dict[str, list[Any]] = {name: [] for name in cases}
    for _ in range(REPS):
        for name, options in cases.items():
            runs[name].append(b.timed(name, PARTITIONS, ROWS, b.recoverable(df, True, **options)))
    found: dict[str, Any] = {}
    for name, done in runs.items():
        ok = [r for r in done if not r.error]
        cpu = [r.cpu_seconds for r in ok if r.cpu_seconds is not None]
        found[name] = {"seconds": round(statistics.median(r.seconds for r in ok), 3) if ok else None,
                       "cpu_us_per_record": round(statistics.median(cpu) * 1e6 / ROWS, 3) if cpu else None}
    for mode, with_proof, without in (("at_least_once", "wal_on", "wal_on_no_proof"),
                                      ("exactly_once", "exactly_once", "exactly_once_no_proof")):
        a, c = found[with_proof]["cpu_us_per_record"], found[without]["cpu_us_per_record"]
        if a and c:
            found[f"{mode}_cpu_with_vs_without"] = round(a / c, 3)
    return found


def _bytes(b: Bench, df: Any, mode: str, options: dict[str, str]) -> dict[str, Any]:
    """One write to a proof topic of its own: what the topic holds afterwards, per record."""
    proof = f"bench-proof-{uuid.uuid4().hex[:8]}"
    b.timed(f"{mode} proof-bytes", PARTITIONS, ROWS, b.recoverable(df, True, **options, **{"proof.topic": proof}))
    on_disk = sum(f.stat().st_size for f in _log_dirs(b, proof) for f in f.glob("*.log"))
    records, payload = _payload(b, proof)
    b.drop_topic(proof)
    return {"log_bytes_per_record": round(on_disk / ROWS, 2), "records": records,
            "key_value_bytes_per_record": round(payload / ROWS, 2)}


def _log_dirs(b: Bench, topic: str) -> list[Path]:
    data = b.cluster.node_dir(1) / "data"
    return [d for d in data.iterdir() if d.is_dir() and d.name.rsplit("-", 1)[0] == topic]


def _payload(b: Bench, topic: str) -> tuple[int, int]:
    """Every record of the topic as a read_uncommitted reader sees it: how many, and their keys' and values' bytes."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": f"bench-{uuid.uuid4().hex[:6]}",
                  "enable.auto.commit": "false", "isolation.level": "read_uncommitted",
                  "enable.partition.eof": "true"})
    try:
        partitions = c.list_topics(topic, timeout=30).topics[topic].partitions
        ends = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in partitions}
        c.assign([TopicPartition(topic, p, 0) for p, end in ends.items() if end > 0])
        left, records, size = {p for p, end in ends.items() if end > 0}, 0, 0
        while left:
            for m in c.consume(10_000, timeout=5):
                if m.error() is not None:
                    left.discard(m.partition())
                    continue
                records += 1
                size += len(m.key() or b"") + len(m.value() or b"")
                if m.offset() is not None and m.offset() + 1 >= ends[m.partition()]:
                    left.discard(m.partition())
        return records, size
    finally:
        c.close()


def _rerun_read(b: Bench, df: Any) -> dict[str, Any]:
    """A failed wal.writeId write re-run where its WAL is not, with no history in its proof partition and with
    HISTORY_ROWS rows of other writes' proof there first."""
    out: dict[str, Any] = {}
    for label, history in (("no_history", 0), ("history", HISTORY_ROWS)):
        proof = f"bench-proof-{uuid.uuid4().hex[:8]}"
        common = {"proof.topic": proof, "proof.partitions": "2"}  # every write's proof in partition 1
        if history:
            other = b.spark.range(0, history, 1, PARTITIONS).selectExpr("CAST(id AS STRING) AS value")
            b.timed("history", PARTITIONS, history, b.recoverable(other, True, **common))
        out[label] = _failed_then_rerun(b, df, common)
        out[label]["history_rows"] = history
        b.drop_topic(proof)
    return out


def _failed_then_rerun(b: Bench, df: Any, common: dict[str, str]) -> dict[str, Any]:
    from pyspark.sql import functions as F

    fail_at = ROWS - ROWS // (PARTITIONS * 10)  # 90% into the last partition
    failing = df.withColumn("value", F.when(F.col("key") == str(fail_at), F.raise_error(F.lit("bench failure")))
                            .otherwise(F.col("value")))
    topic = b.fresh_topic("rerun", PARTITIONS)
    write_id = f"bench-rerun-{uuid.uuid4().hex[:8]}"
    options = {**common, "wal.writeId": write_id, "summary.path": str(OUT / "summary.jsonl")}
    try:
        sink_writer(failing, b.bootstrap, topic, OUT / f"wal-{write_id}-1", **options).save()
        raise RuntimeError("the failing run succeeded")
    except Exception as exc:  # noqa: BLE001 - the failure is the point
        if "bench failure" not in str(exc):
            raise
    import time

    began = time.perf_counter()
    sink_writer(df, b.bootstrap, topic, OUT / f"wal-{write_id}-2", **options).save()
    seconds = time.perf_counter() - began
    summary = json.loads((OUT / "summary.jsonl").read_text().splitlines()[-1])
    b.drop_topic(topic)
    tasks = summary["tasks"]
    return {"rerun_seconds": round(seconds, 2), "skipped": summary["skipped"], "published": summary["published"],
            "read_records": sum(t["proof_read_records"] for t in tasks),
            "read_bytes": sum(t["proof_read_bytes"] for t in tasks),
            "read_seconds_max": round(max(t["proof_read_seconds"] for t in tasks), 3)}


if __name__ == "__main__":
    sys.exit(run_alone(measure, "proof_cost"))
