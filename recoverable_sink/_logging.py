"""Logging set-up for code that runs in Spark's Python workers, whose root logger has no handler."""

from __future__ import annotations

import logging
import os
import sys

LOGGER_NAME = "recoverable_sink"


def get_logger(name: str) -> logging.Logger:
    """Return a child of the package logger, making sure its records reach the worker's stderr.

    Spark forwards a Python worker's stderr to the executor's (and in local mode the driver's) log, so
    an INFO line written there is where a Spark user looks for it. ``RECOVERABLE_SINK_LOG_LEVEL``
    overrides the level.
    """
    root = logging.getLogger(LOGGER_NAME)
    if not root.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        root.addHandler(handler)
        root.setLevel(os.environ.get("RECOVERABLE_SINK_LOG_LEVEL", "INFO").upper())
        root.propagate = False
    return logging.getLogger(f"{LOGGER_NAME}.{name}")
