"""The last committed write's summary, handed from the driver's Python worker to the user's program (driver).

Spark runs a Python data source's driver side (its ``commit``) in a Python worker that its driver JVM starts,
not in the program that called ``save()``. The worker writes each committed write's (and micro-batch's) summary
to a file named for that JVM's process, and :func:`last_write` in the program reads the file of its own JVM:
one small file, replaced atomically at each commit, on the driver's host.
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
from typing import TYPE_CHECKING, Any

from recoverable_sink._logging import get_logger

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = get_logger("summary")


def _path(jvm_pid: int) -> str:
    return os.path.join(tempfile.gettempdir(), f"recoverable_kafka-{os.getuid()}", f"driver-{jvm_pid}.json")


def ancestor_jvm() -> int | None:
    """The JVM this process descends from (a Python worker's driver or executor JVM), by /proc."""
    pid = os.getppid()
    for _ in range(8):
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
                head, rest = f.read().rsplit(")", 1)
        except OSError:
            return None
        if head.split("(", 1)[1] == "java":
            return pid
        pid = int(rest.split()[1])
        if pid <= 1:
            return None
    return None


def remember(record: dict[str, Any]) -> None:
    """In the driver's Python worker: keep ``record`` as its JVM's last committed write. Best effort: a summary
    that cannot be kept is logged, never failing a write that Kafka already holds."""
    jvm = ancestor_jvm()
    if jvm is None:
        return
    path = _path(jvm)
    try:
        folder = os.path.dirname(path)
        os.makedirs(folder, mode=0o700, exist_ok=True)
        info = os.lstat(folder)
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
            # In the shared temporary directory: one that another user made, or anyone may write, is not ours.
            log.warning("not keeping the write's summary for last_write(): %s is not a directory of this user's "
                        "alone", folder)
            return
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".last-")
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump(record, out)
        os.replace(tmp, path)
    except OSError as exc:
        log.warning("could not keep the write's summary for last_write() in %s: %s", path, exc)


def last_write(spark: SparkSession) -> dict[str, Any] | None:
    """The summary of the last write (or micro-batch) this session's driver committed through the sink, as the
    ``summary.path`` JSON line has it (counts, the tasks, and ``offsets``: per topic-partition the first and last
    offset written and the records); None before any. Only where the program runs the driver (a classic session):
    under Spark Connect, set ``summary.path`` and read its last line on the server."""
    jvm = getattr(spark, "_jvm", None)
    if jvm is None:
        raise RuntimeError("last_write() needs a classic SparkSession (the driver in this program); under Spark "
                           "Connect set the summary.path option and read its last line")
    path = _path(int(jvm.java.lang.ProcessHandle.current().pid()))
    try:
        with open(path, encoding="utf-8") as f:
            summary: dict[str, Any] = json.load(f)
    except FileNotFoundError:
        return None
    return summary
