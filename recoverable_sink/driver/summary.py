"""Driver-side summaries of a write's task commit messages: one log line, optionally a JSON line."""

from __future__ import annotations

import json
import logging
import os
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from typing import Any, TypedDict

from recoverable_sink._logging import get_logger
from recoverable_sink.contract import SinkCommitMessage
from recoverable_sink.driver.last_write import remember
from recoverable_sink.offsets import WrittenOffsets

log = get_logger("summary")


class Summary(TypedDict):
    """A write's totals over its tasks' commit messages, in the order the JSON line has them."""

    received: int
    published: int
    acknowledged: int
    skipped: int
    replayed: int
    diverged: int
    unproven: int
    partitions: int
    failed_partitions: int
    retried_partitions: int
    finished: list[int]
    unfinished: list[int]
    tasks: list[dict[str, Any]]
    offsets: list[dict[str, object]]
    offsets_complete: bool
    dead_lettered: dict[str, int]
    dead_letter_topic: str | None


def summarize(messages: Sequence[object]) -> Summary:
    """Totals over the tasks that reported; failed tasks give None and are counted as such."""
    done = [m for m in messages if isinstance(m, SinkCommitMessage)]
    # Where the records went: per topic-partition, over the tasks, the first and last offset and the records.
    written = WrittenOffsets()
    for m in done:
        for entry in m.offsets:
            written.add(*entry)
    dead: Counter[str] = Counter()
    for m in done:
        dead.update(m.dead_lettered)
    return Summary(
        received=sum(m.received for m in done), published=sum(m.published for m in done),
        acknowledged=sum(m.acknowledged for m in done), skipped=sum(m.skipped for m in done),
        replayed=sum(m.replayed for m in done), diverged=sum(m.diverged for m in done),
        unproven=sum(m.unproven for m in done),
        partitions=len(messages), failed_partitions=len(messages) - len(done),
        retried_partitions=sum(1 for m in done if m.attempt > 0),
        finished=sorted(m.partition for m in done),
        unfinished=[i for i, m in enumerate(messages) if not isinstance(m, SinkCommitMessage)],
        tasks=[asdict(m) for m in done],
        offsets=[{"topic": t, "partition": p, "first": f, "last": last, "records": n}
                 for t, p, f, last, n in written.ranges()],
        # False where a task skipped records an earlier attempt had written (their offsets are not known) or failed.
        offsets_complete=len(done) == len(messages) and all(m.offsets_complete for m in done),
        dead_lettered=dict(sorted(dead.items())),
        dead_letter_topic=next((m.dead_letter_topic for m in done if m.dead_letter_topic), None),
    )


def write_summary(path: str | None, event: str, write_id: str, summary: Mapping[str, object]) -> None:
    """Append the summary as one JSON line to ``summary.path`` (for tools and tests), if set; a commit's is also
    kept for :func:`recoverable_sink.last_write`."""
    record = {"event": event, "write_id": write_id, "time": time.time(), **summary}
    if event == "commit":
        remember(record)
    if not path:
        return
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "a", encoding="utf-8") as out:
        out.write(json.dumps(record) + "\n")


def log_commit(label: str, summary: Summary) -> None:
    """One INFO line per committed write or micro-batch (a stream's only sink line per trigger when all goes well),
    and a warning for each thing the user should know of."""
    log.info(
        "%s committed: %d records in %d partitions, %d published, %d acknowledged, %d skipped as already "
        "delivered, %d re-sent after an earlier attempt logged them, %d partitions retried",
        label, summary["received"], summary["partitions"], summary["published"], summary["acknowledged"],
        summary["skipped"], summary["replayed"], summary["retried_partitions"],
    )
    dead = summary["dead_lettered"]
    if dead:
        log.warning("%s: %d records Kafka would refuse went to the dead-letter topic %s instead (%s); their headers "
                    "say why", label, sum(dead.values()), summary["dead_letter_topic"],
                    ", ".join(f"{kind} {n}" for kind, n in dead.items()))
    if summary["unproven"]:
        log.warning("%s: %d records were sent by retries that found no earlier attempt's log on their host (a retry "
                    "on another host, or a WAL removed meanwhile): what the failed attempts had delivered of them "
                    "may be in Kafka twice", label, summary["unproven"])
    if summary["diverged"]:
        log.warning("%s: %d records an earlier attempt delivered were not in the recomputed input (non-deterministic "
                    "input); both versions are in Kafka", label, summary["diverged"])


def wal_location(wal_path: str | None) -> tuple[str, str]:
    """How an abort line names the WAL: (in prose, for the list command's --path)."""
    if wal_path:
        return wal_path, wal_path
    return ("each executor's default wal.path ($RECOVERABLE_KAFKA_WAL_PATH, else recoverable_kafka_wal beside "
            "Spark's local directories)", "DIR")


def log_abort(label: str, summary: Summary, wal_path: str | None, write_id: str,
              how_to_finish: str, level: int | None = None) -> None:
    """The abort line: which partitions finished, which did not, where their records are, what to run. By default
    at ERROR when some partition finished (a write left half done) and at WARNING when none did, where the tasks'
    own error is what the user reads first (a write refused on bad input) and failed tasks do not say whether they
    sent anything; ``level`` sets it (a micro-batch's: its query's next start finishes it)."""
    where, path_arg = wal_location(wal_path)
    sent = bool(summary["finished"] or summary["published"])
    log.log(
        level if level is not None else logging.ERROR if sent else logging.WARNING,
        "%s aborted: %d of %d partitions did not finish (%s); partitions that finished: %s, with %d records, %d "
        "acknowledged by Kafka%s (a failed task reports nothing to the driver: the list command below counts what "
        "its attempts logged and what Kafka acknowledged). Records Kafka did not "
        "acknowledge stay in the WAL under %s on the executors that ran them (write id %s): "
        "`recoverable-kafka-wal list --path %s --write-id %s` on each executor host shows which partitions are "
        "there, whether each was fully logged and what no attempt got acknowledged; a partition found on no host "
        "never started. To finish the write: %s",
        label, summary["failed_partitions"], summary["partitions"], summary["unfinished"] or "none",
        summary["finished"] or "none", summary["received"], summary["acknowledged"], _dead_letters(summary), where,
        write_id, path_arg, write_id, how_to_finish,
    )


def _dead_letters(summary: Summary) -> str:
    """How the finished partitions' dead letters are named in the abort line ("" when there are none)."""
    dead = summary["dead_lettered"]
    if not dead:
        return ""
    kinds = ", ".join(f"{kind} {n}" for kind, n in dead.items())
    return f" and {sum(dead.values())} sent to the dead-letter topic {summary['dead_letter_topic']} ({kinds})"
