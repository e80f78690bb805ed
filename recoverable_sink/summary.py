"""Driver-side summaries of a write's task commit messages: one log line, optionally a JSON line."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from dataclasses import asdict

from recoverable_sink._logging import get_logger
from recoverable_sink.task import SinkCommitMessage

log = get_logger("summary")

_COUNTS = ("received", "published", "acknowledged", "skipped", "replayed", "diverged")


def summarize(messages: Sequence[object]) -> dict[str, object]:
    """Totals over the tasks that reported; failed tasks give None and are counted as such."""
    done = [m for m in messages if isinstance(m, SinkCommitMessage)]
    totals: dict[str, object] = {k: sum(getattr(m, k) for m in done) for k in _COUNTS}
    totals["partitions"] = len(messages)
    totals["failed_partitions"] = len(messages) - len(done)
    totals["retried_partitions"] = sum(1 for m in done if m.attempt > 0)
    totals["tasks"] = [asdict(m) for m in done]
    return totals


def write_summary(path: str | None, event: str, write_id: str, summary: dict[str, object]) -> None:
    """Append the summary as one JSON line to ``summary.path`` (for tools and tests), if set."""
    if not path:
        return
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "a", encoding="utf-8") as out:
        out.write(json.dumps({"event": event, "write_id": write_id, "time": time.time(), **summary}) + "\n")


def log_commit(label: str, summary: dict[str, object]) -> None:
    log.info(
        "%s committed: %d records in %d partitions, %d published, %d acknowledged, %d skipped as already "
        "delivered, %d replayed, %d diverged, %d partitions retried",
        label, summary["received"], summary["partitions"], summary["published"], summary["acknowledged"],
        summary["skipped"], summary["replayed"], summary["diverged"], summary["retried_partitions"],
    )
    if summary["diverged"]:
        log.warning("%s: %d records differed from what an earlier attempt had delivered (non-deterministic "
                    "input); both versions are in Kafka", label, summary["diverged"])


def log_abort(label: str, summary: dict[str, object], wal_path: str, write_id: str) -> None:
    tasks = summary["tasks"]
    assert isinstance(tasks, list)
    purged = sorted(t["partition"] for t in tasks)
    log.error(
        "%s aborted: %d of %d partitions did not finish; the records Kafka did not acknowledge stay in the WAL "
        "under %s on the executors that ran them (write id %s; `recoverable-kafka-wal list --path %s "
        "--write-id %s` shows them). Partitions that finished and purged their WAL: %s",
        label, summary["failed_partitions"], summary["partitions"], wal_path, write_id, wal_path, write_id,
        purged or "none",
    )
