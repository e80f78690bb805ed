"""Private fault injection for the test suite and the chaos campaign; not part of the public options.

Enabled only by the underscore-prefixed options ``_test.killAfterRecords`` (SIGKILL the Python worker of a
first attempt once that many records are acknowledged and checkpointed) and ``_test.pauseAfterRecords`` with
``_test.pauseFile`` (checkpoint, create the marker file once, then wait for the test to kill a process; with
``_test.pauseSeconds``, go on writing after that long if nobody did: a stalled task, for speculation).
Faults at random moments need none of this: the chaos campaign kills processes from outside.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from recoverable_sink._logging import get_logger
from recoverable_sink.errors import OptionError

log = get_logger("faults")

FAULT_PREFIX = "_test."


@dataclass(frozen=True)
class FaultPlan:
    kill_after_records: int | None = None
    pause_after_records: int | None = None
    pause_file: str | None = None
    pause_seconds: int | None = None

    def after_batch(self, write_id: str, partition: int, attempt: int, position: int,
                    checkpoint: Callable[[], None]) -> None:
        """Called by a task after handing the records up to ``position`` to the producer."""
        where = f"partition {partition} (attempt {attempt}) of write {write_id}"
        if self.kill_after_records is not None and attempt == 0 and position >= self.kill_after_records:
            checkpoint()
            log.warning("%s: _test.killAfterRecords reached at %d records; killing this worker", where, position)
            os.kill(os.getpid(), signal.SIGKILL)
        marker = self.pause_file
        if self.pause_after_records is None or not marker or position < self.pause_after_records \
                or os.path.exists(marker):
            return
        checkpoint()
        # The marker appears whole (link of a written file) and only once (link fails if it exists), so a
        # restarted query does not pause again and the test never reads it half-written.
        staging = f"{marker}.{os.getpid()}"
        with open(staging, "w", encoding="utf-8") as out:
            out.write(f"{write_id} {partition} {position} {os.getpid()}\n")  # the tests read the pid
        try:
            os.link(staging, marker)
        except FileExistsError:
            return
        finally:
            os.unlink(staging)
        log.warning("%s: _test.pauseAfterRecords reached at %d records; pausing for the test to kill a process",
                    where, position)
        parent, deadline = os.getppid(), time.monotonic() + (self.pause_seconds or 300)
        while os.getppid() == parent and time.monotonic() < deadline:
            time.sleep(0.1)
        if self.pause_seconds is not None and os.getppid() == parent:
            log.warning("%s: _test.pauseSeconds over; going on as a zombie would", where)
            return
        # Whoever we paused for is gone (or never came): leave without touching the WAL again.
        os._exit(1)


def _count(name: str, value: str | None) -> int | None:
    if value is None:
        return None
    if not value.strip().isdigit():
        raise OptionError(f"option {name}={value!r} must be a whole number of records")
    return int(value)


def parse_faults(lowered: Mapping[str, str]) -> FaultPlan | None:
    """The fault plan of a write's (lower-cased) options, or None when it asks for none."""
    kill = _count("_test.killAfterRecords", lowered.get("_test.killafterrecords"))
    pause = _count("_test.pauseAfterRecords", lowered.get("_test.pauseafterrecords"))
    pause_s = _count("_test.pauseSeconds", lowered.get("_test.pauseseconds"))
    unknown = sorted(set(k for k in lowered if k.startswith(FAULT_PREFIX))
                     - {"_test.killafterrecords", "_test.pauseafterrecords", "_test.pausefile", "_test.pauseseconds"})
    if unknown:
        raise OptionError(f"unknown private test option(s) {', '.join(unknown)}")
    if pause is not None and not lowered.get("_test.pausefile"):
        raise OptionError("option _test.pauseAfterRecords needs _test.pauseFile (the marker the test waits for)")
    if kill is None and pause is None:
        return None
    return FaultPlan(kill_after_records=kill, pause_after_records=pause, pause_file=lowered.get("_test.pausefile"),
                     pause_seconds=pause_s)
