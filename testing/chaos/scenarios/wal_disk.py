"""Fault family: the write-ahead log and its disk: wal.maxBytes reached while the broker is down, then a
re-run (7); a WAL with a flipped byte or a truncated data file (8); wal.path on a full 1 MiB tmpfs (9).

A read_committed reader must see: after 7, every record, a repeat only of a record whose fate was unknown under
at_least_once and none under exactly_once; after 8, nothing from the damaged part under at_least_once (replay
refuses it), under exactly_once every record once after a flipped byte and nothing after a truncated file;
after 9, nothing twice of what the failed write sent.
"""

from __future__ import annotations

import os
import random
import subprocess
from pathlib import Path

import pyarrow as pa

from recoverable_sink import wal as wal_module
from recoverable_sink.identity import record_digests
from testing.chaos.checker import check, ids_in_topic, rerun_and_count, verdict, wal_ids
from testing.chaos.lab import (
    Lab,
    Trial,
    cli,
    names_the_brokers_gone,
    random_fault_setup,
    short_error,
    write_through_broker_death,
)
from testing.kafka_check import count_topic

# ---- 7. WAL bound ----------------------------------------------------------------------------------------

def wal_bound(lab: Lab, rng: random.Random, n: int) -> Trial:
    """The broker dies at a random moment, so acknowledgements stop and unacknowledged payload piles up until
    wal.maxBytes refuses a batch: a clear error, no later batch in the log. The broker comes back and a re-run
    with the same wal.writeId delivers the rest: none lost."""
    d, topic, df, ids, target = random_fault_setup(lab, rng, n, "wal-bound", 4)
    bound = rng.randint(250_000, 600_000)  # one to three 2,000-record segments of payload
    trial, summary = write_through_broker_death(
        lab, d, topic, df, target, {"wal.maxBytes": bound, "at_records": int(target)},
        **{"wal.maxBytes": str(bound), "kafka.delivery.timeout.ms": "8000"})
    if summary is not None:
        trial.notes["outcome"] = "the write finished before the WAL filled"
        return check(lab, trial, lab.kafka.bootstrap_servers, topic, ids)
    error = trial.errors[-1] if trial.errors else ""
    trial.notes["refused_by_bound"] = f"wal.maxBytes={bound}" in error
    if "wal.maxBytes" not in error and not names_the_brokers_gone(error, lab.exactly_once):
        trial.passed = False
    return rerun_and_count(lab, trial, d, topic, df, ids, wal_ids(d / "wal", acked=False))


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
        out = cli("replay", "--path", str(d / "wal"), "--write-id", "corrupt-write",
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
        outcome = short_error(exc)
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
            message = short_error(exc)
            trial.errors.append(message)
            trial.passed = "disk is full" in message
        found = ids_in_topic(lab.kafka.bootstrap_servers, topic)
        trial.duplicated = sum(c - 1 for c in found.values() if c > 1)
        trial.notes["published_before_full"] = len(found)
        trial.passed = trial.passed and trial.duplicated == 0
    finally:
        subprocess.run(["umount", "-l", str(tiny)], capture_output=True)
    return trial
