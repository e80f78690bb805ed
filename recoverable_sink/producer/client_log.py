"""librdkafka's log lines on the sink's logger (executor), each kind at most once a minute, its repeats counted.

librdkafka logs a line per failed connection attempt, every ``reconnect.backoff.ms`` while a broker is down: 9,102
``Connection refused`` lines in seven minutes of one failing write. A line of a kind (its text with the numbers
left out) is logged as it comes the first time; later ones of the same kind are counted and said in one line, with
the count and the last of them, once a minute and when the producer is closed.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass

from recoverable_sink._logging import get_logger

_NUMBERS = re.compile(r"\d+")
SUMMARY_EVERY_S = 60.0


@dataclass
class _Kind:
    since: float  # when the count began
    repeats: int  # lines of this kind since then, not logged
    last: str  # the last of them


class RepeatSummary:
    """Where a client's librdkafka lines go: :meth:`log` for each line, :meth:`flush` when the client is closed (or
    before a task's failure is reported) to say the repeats not said yet."""

    def __init__(self, logger: logging.Logger | None = None, every_s: float = SUMMARY_EVERY_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.logger = logger or get_logger("librdkafka")
        self.every_s = every_s
        self.clock = clock
        self._kinds: dict[tuple[int, str], _Kind] = {}

    def log(self, level: int, line: str) -> None:
        key = (level, _NUMBERS.sub("#", line))
        now = self.clock()
        kind = self._kinds.get(key)
        if kind is None:
            self._kinds[key] = _Kind(now, 0, line)
            self.logger.log(level, "%s", line)
            return
        kind.repeats += 1
        kind.last = line
        if now - kind.since >= self.every_s:
            self._say(level, kind, now)

    def due(self) -> None:
        """Say the repeats of every kind whose minute has passed (called when the client is polled)."""
        now = self.clock()
        for (level, _), kind in self._kinds.items():
            if kind.repeats and now - kind.since >= self.every_s:
                self._say(level, kind, now)

    def flush(self) -> None:
        """Say every repeat not said yet."""
        now = self.clock()
        for (level, _), kind in self._kinds.items():
            if kind.repeats:
                self._say(level, kind, now)

    def _say(self, level: int, kind: _Kind, now: float) -> None:
        self.logger.log(level, "%s (librdkafka logged %d more like it in the last %.0f s, not shown)", kind.last,
                        kind.repeats, now - kind.since)
        kind.since, kind.repeats = now, 0


class ClientLogger:
    """confluent-kafka's ``logger`` interface (``log(level, fmt, *args)``, Python's levels) over a
    :class:`RepeatSummary`, for the clients made through confluent-kafka."""

    def __init__(self, summary: RepeatSummary) -> None:
        self.summary = summary

    def log(self, level: int, fmt: str, *args: object) -> None:
        self.summary.log(level, fmt % args if args else fmt)
