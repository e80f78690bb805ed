"""Logging set-up for code that runs in Spark's Python workers, whose root logger has no handler."""

from __future__ import annotations

import logging
import os
import sys

LOGGER_NAME = "recoverable_sink"
_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def _root() -> logging.Logger:
    root = logging.getLogger(LOGGER_NAME)
    if not root.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(_FORMAT))
        root.addHandler(handler)
        root.setLevel(_level_from_environment())
        root.propagate = False
    return root


def _level_from_environment() -> str:
    """``RECOVERABLE_KAFKA_LOG_LEVEL``, the product's one environment prefix (as ``RECOVERABLE_KAFKA_WAL_PATH``);
    the name it had before, ``RECOVERABLE_SINK_LOG_LEVEL``, is still read where the new one is not set."""
    return (os.environ.get("RECOVERABLE_KAFKA_LOG_LEVEL") or os.environ.get("RECOVERABLE_SINK_LOG_LEVEL")
            or "INFO").upper()


def get_logger(name: str) -> logging.Logger:
    """Return a child of the package logger, making sure its records reach the worker's stderr.

    Spark forwards a Python worker's stderr to the executor's (and in local mode the driver's) log, so
    an INFO line written there is where a Spark user looks for it. ``RECOVERABLE_KAFKA_LOG_LEVEL``
    overrides the level.
    """
    _root()
    return logging.getLogger(f"{LOGGER_NAME}.{name}")


def configure(fmt: str, level: int | str) -> None:
    """Set the package logger's format and level (the CLI's own, terser, format)."""
    root = _root()
    root.setLevel(level)
    for handler in root.handlers:
        handler.setFormatter(logging.Formatter(fmt))
