"""Counts what landed by the unique id every chaos record carries as its key, with a consumer that has
nothing to do with the sink: Debian's kcat when installed, else a plain confluent-kafka consumer; and turns
the counts into a trial's verdict."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from recoverable_sink import wal as wal_module
from testing.chaos.lab import Lab, Trial, last_summary, short_error
from testing.kafka_check import end_offsets, read_topic


def ids_in_topic(bootstrap: str, topic: str, expected: int | None = None, timeout_s: float = 120,
                 isolation: str = "read_committed") -> Counter[str]:
    """How many times each key is in ``topic`` (read to the end offsets), as a consumer with ``isolation``
    (``read_committed``, librdkafka's default, or ``read_uncommitted``) sees it."""
    if shutil.which("kcat") is None:
        return Counter(r["key"].decode() for r in read_topic(bootstrap, topic, timeout_s, expected=expected,
                                                             isolation=isolation))
    # Wait on the offsets only (kcat -e reads every partition to its end). Past the deadline, count what is
    # there: fewer records than expected is a result (lost), not an error.
    deadline = time.monotonic() + timeout_s
    while expected is not None and sum(end_offsets(bootstrap, topic).values()) < expected \
            and time.monotonic() < deadline:
        time.sleep(0.2)
    out = subprocess.run(["kcat", "-C", "-b", bootstrap, "-X", f"isolation.level={isolation}", "-t", topic,
                          "-o", "beginning", "-e", "-q",
                          "-f", "%k\\n"], capture_output=True, text=True, timeout=timeout_s, check=True).stdout
    return Counter(line for line in out.splitlines() if line)


def verdict(expected_ids: Iterable[str], found: Counter[str]) -> tuple[int, int, int]:
    """(lost, duplicated, unexpected): ids never found, extra copies, ids that were never written."""
    expected = set(expected_ids)
    lost = sum(1 for i in expected if found[i] == 0)
    duplicated = sum(count - 1 for i, count in found.items() if count > 1)
    unexpected = sum(count for i, count in found.items() if i not in expected)
    return lost, duplicated, unexpected


def check(lab: Lab, trial: Trial, bootstrap: str, topic: str, ids: list[str]) -> Trial:
    """Count as a read_committed consumer; under exactly_once, also report what read_uncommitted sees."""
    found = ids_in_topic(bootstrap, topic, expected=len(ids))
    trial.lost, trial.duplicated, unexpected = verdict(ids, found)
    trial.records_expected = len(ids)
    report_uncommitted(lab, trial, bootstrap, topic, ids)
    if unexpected:
        trial.errors.append(f"{unexpected} records with ids that were never written")
    trial.passed = trial.passed and trial.lost == 0 and trial.duplicated == 0 and not unexpected
    return trial


def report_uncommitted(lab: Lab, trial: Trial, bootstrap: str, topic: str, ids: list[str]) -> None:
    if lab.exactly_once:
        lost, duplicated, _ = verdict(ids, ids_in_topic(bootstrap, topic, isolation="read_uncommitted"))
        trial.notes["read_uncommitted"] = {"lost": lost, "duplicated": duplicated}


def wal_ids(wal_path: Path, acked: bool | None = None) -> set[str]:
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


def rerun_and_count(lab: Lab, trial: Trial, d: Path, topic: str, df: Any, ids: list[str],
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
        trial.errors.append(f"re-run with wal.writeId failed: {short_error(exc)}")
        trial.passed = False
    found = ids_in_topic(lab.kafka.bootstrap_servers, topic, expected=len(ids))
    trial.lost, trial.duplicated, unexpected = verdict(ids, found)
    trial.records_expected = len(ids)
    report_uncommitted(lab, trial, lab.kafka.bootstrap_servers, topic, ids)
    if lab.exactly_once:
        unknown_fate = set()  # an aborted transaction's records are invisible: nothing may repeat
    repeated = {i for i, c in found.items() if c > 1}
    trial.notes["repeated_outside_unknown_fate"] = len(repeated - unknown_fate)
    trial.passed = trial.passed and trial.lost == 0 and not unexpected and repeated <= unknown_fate
    return trial
