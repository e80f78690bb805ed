"""How a task's input ended (executor): complete, or cut short by a failure on the JVM side of the task.

Both look alike to the writer: its Arrow iterator simply stops. pyspark's worker protocol tells them apart one
step later. At a normal end the JVM closes the Arrow stream and then writes Spark's ``END_OF_STREAM`` word on
the worker's input; when the JVM side of the task fails (an upstream error, a shuffle fetch failure, a bad cast
under ANSI mode, a killed task) it shuts the worker's input down instead, so the stream ends without either.
Measured in pyspark 4.0.1, 4.1.1 and 4.2.1 (a Python data source writing 20,000 rows, then the same with
``raise_error`` at row 15,000: the word after all 20,000, end-of-file after 10,000), and tested on every run by
tests/integration/test_cut_short.py.

The worker's input is found on the call stack (pyspark's ``worker.main`` and its ``process`` hold it as
``infile``; the module runs as ``pyspark.worker``, or as ``__main__`` where Spark starts workers without its
daemon) and only peeked at, never read: pyspark reads the word itself once the writer returns.
"""

from __future__ import annotations

import enum
import os
import sys
import threading
from types import FrameType
from typing import Protocol, runtime_checkable

from recoverable_sink._logging import get_logger

log = get_logger("spark_input")

END_OF_STREAM = b"\xff\xff\xff\xfc"  # pyspark.serializers.SpecialLengths.END_OF_STREAM (-4), big-endian

# The word follows the Arrow stream at once at a normal end; waiting longer than this for it means the
# protocol is not the one measured, and the writer goes on as it would without the check (logged).
_PEEK_TIMEOUT_S = 30.0


class InputEnd(enum.Enum):
    COMPLETE = "complete"  # Spark's end-of-stream word follows: the JVM sent the whole partition
    CUT_SHORT = "cut short"  # end of file: the JVM side failed and shut the worker's input
    UNKNOWN = "unknown"  # not running in a pyspark worker, or a protocol this module does not know


_WORKER_FILE = os.path.join("pyspark", "worker.py")
_warned: list[bool] = []


@runtime_checkable
class _Peekable(Protocol):
    """The worker's input as pyspark opens it, a buffered reader; isinstance() asks only that it has ``peek``."""

    def peek(self, size: int = 0, /) -> bytes: ...


def _worker_input() -> _Peekable | None:
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        infile = frame.f_locals.get("infile")
        if isinstance(infile, _Peekable) and (
                frame.f_globals.get("__name__") == "pyspark.worker"
                or frame.f_code.co_filename.endswith(_WORKER_FILE)):
            return infile
        frame = frame.f_back
    return None


def _in_a_spark_task() -> bool:
    try:
        from pyspark import TaskContext
    except ImportError:
        return False
    return TaskContext.get() is not None


def how_input_ended() -> InputEnd:
    """Call once the writer's iterator is exhausted, from inside the Python data source's ``write``."""
    infile = _worker_input()
    if infile is None:
        if not _warned and _in_a_spark_task():
            _warned.append(True)
            log.warning("this pyspark's worker does not hold its input where the sink looks for it: a task whose "
                        "input the JVM cut short cannot be told from a complete one, and would be committed")
        return InputEnd.UNKNOWN
    result: list[bytes] = []

    def peek() -> None:
        try:
            result.append(infile.peek(len(END_OF_STREAM))[: len(END_OF_STREAM)])
        except (OSError, ValueError):  # a closed or reset socket is a cut-short input too
            result.append(b"")

    # A thread only so that a protocol which withholds the word cannot hang the task: peek blocks until a byte
    # or end-of-file arrives, unless the bytes are already buffered (the usual case).
    peeker = threading.Thread(target=peek, name="recoverable-sink-input-end", daemon=True)
    peeker.start()
    peeker.join(_PEEK_TIMEOUT_S)
    if not result:
        log.warning("no end-of-stream word from Spark within %.0f s of the input's end; going on as if the input "
                    "were complete", _PEEK_TIMEOUT_S)
        return InputEnd.UNKNOWN
    if result[0] == b"":
        return InputEnd.CUT_SHORT
    if result[0] != END_OF_STREAM[: len(result[0])]:
        log.warning("unexpected bytes after the input's Arrow stream (%s); going on as if the input were complete",
                    result[0].hex())
        return InputEnd.UNKNOWN
    return InputEnd.COMPLETE
