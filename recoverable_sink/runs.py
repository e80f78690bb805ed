"""Run ids: one per run of a write (one driver-side writer), made so that runs of a write sort by the time their
drivers made them. Imports no pyspark: the WAL's attempt record (which the CLI reads) orders attempts by run."""

from __future__ import annotations

import time
import uuid


def new_run_id() -> str:
    """The id of one run of a write (one driver-side writer): it sorts by the time the driver made it, so a
    task can tell a newer run of its write from an older one, and ends with a random part."""
    return f"{time.time_ns():020d}-{uuid.uuid4().hex[:8]}"


def later_run(run: object, than: object) -> bool:
    """Whether run id ``run`` was made after ``than``; False where either is not a time-ordered run id.

    >>> later_run("00000000000000000002-ab", "00000000000000000001-cd"), later_run("x", "00000000000000000001-cd")
    (True, False)
    """
    if not (isinstance(run, str) and isinstance(than, str)):
        return False
    a, b = run.split("-", 1)[0], than.split("-", 1)[0]
    return len(a) == len(b) == 20 and a.isdigit() and b.isdigit() and a > b
