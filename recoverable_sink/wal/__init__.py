"""The executor-local write-ahead log: one LMDB environment per ``wal.path``, shared by the Python workers
of the executors on a host (LMDB serialises their write transactions across processes).

This package re-exports what the sink, the CLI and the tests use; its modules each have one job:
:mod:`.format` the bytes and key layout, :mod:`.attempt` the attempt record and the rules read from it,
:mod:`.env` the LMDB environments, :mod:`.store` an attempt's reads and writes (:class:`Wal`). Which logs may go is
the executor's decision (:func:`recoverable_sink.executor.resume_plan.release`). Imports go one way: store -> attempt,
format, env.
"""

from __future__ import annotations

from recoverable_sink.wal.attempt import DONE, LOGGED, OPEN, AttemptInfo, AttemptState, Owner, decode_attempt
from recoverable_sink.wal.env import close_wal, close_wals, map_size
from recoverable_sink.wal.format import Segment
from recoverable_sink.wal.store import Wal, WalStats, open_wal

__all__ = [
    "DONE",
    "LOGGED",
    "OPEN",
    "AttemptInfo",
    "AttemptState",
    "Owner",
    "Segment",
    "Wal",
    "WalStats",
    "close_wal",
    "close_wals",
    "decode_attempt",
    "map_size",
    "open_wal",
]
