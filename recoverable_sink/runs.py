"""Run ids: one per run of a write (one driver-side writer). They only tell runs apart: nothing orders runs by
them (a driver's clock may be behind or ahead), see :mod:`recoverable_sink.executor.resume_plan`. Imports no
pyspark: the WAL's attempt record, which the CLI reads, carries the run."""

from __future__ import annotations

import uuid


def new_run_id() -> str:
    """The id of one run of a write (one driver-side writer): random, unique."""
    return uuid.uuid4().hex
