"""Steps the wall clock of every Python process started with this directory on its PYTHONPATH (a job's driver and its
Spark workers) by ``$RECOVERABLE_KAFKA_CLOCK_STEP_S`` seconds: an NTP step, or a virtual machine resumed, as the
tests make it. The monotonic clock is left alone, as the kernel leaves it."""

import os
import time

_STEP = float(os.environ.get("RECOVERABLE_KAFKA_CLOCK_STEP_S", "0"))
if _STEP:
    _time, _time_ns = time.time, time.time_ns
    time.time = lambda: _time() + _STEP
    time.time_ns = lambda: _time_ns() + int(_STEP * 1e9)
