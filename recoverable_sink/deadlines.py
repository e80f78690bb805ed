"""Deadlines the sink owns (driver and executor): a client call that can block runs on a helper thread, and its caller
waits for it only until a deadline derived from the option that bounds the call.

librdkafka's own timeouts do not always end a call: a coordinator request whose own timeout is never checked
(confluentinc/librdkafka#5456) and a group coordinator left in the cache after it moved (#5511) can hold
``send_offsets_to_transaction``, ``commit_transaction`` or ``abort_transaction`` for ever, and while one is stuck
every other call on the same handle fails as conflicting, so nothing can abort it from another thread. Past the
deadline the caller gets :class:`~recoverable_sink.errors.DeadlineExceededError` at once, and the handle is
*abandoned*: never called again and never destroyed (its destructor would wait for the stuck call), kept alive for
the rest of the process. A Spark Python worker whose task failed exits once the task has reported, so no later task
inherits it.
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from recoverable_sink._logging import get_logger
from recoverable_sink.errors import DeadlineExceededError

log = get_logger("deadlines")

T = TypeVar("T")

# Past the bound of the call's own timeout: librdkafka ends a call that works at its timeout, so only a stuck one
# is left to the deadline.
MARGIN_S = 5.0

_abandoned: list[object] = []  # handles a stuck call holds: referenced for the process's life


def abandon(handle: object) -> None:
    """Keep ``handle`` alive for the rest of the process: it is never destroyed, not even when the interpreter
    exits (a destructor run then would wait for the stuck call and hold the exit)."""
    if handle is None or any(h is handle for h in _abandoned):
        return
    _abandoned.append(handle)
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(handle))


def abandoned() -> int:
    """How many handles this process abandoned."""
    return len(_abandoned)


def within(call: Callable[[], T], what: str, limit_s: float, bound_by: str, waiting_on: str,
           handle: object | None = None, next_step: str | None = None, margin_s: float = MARGIN_S) -> T:
    """``call()``, or :class:`DeadlineExceededError` once ``limit_s`` (the call's own timeout, from ``bound_by``, an
    option with its value) plus :data:`MARGIN_S` passed; ``handle`` (the client the call runs on) is then
    abandoned. ``waiting_on`` names what the call waits for (a coordinator, a broker); ``next_step`` what happens
    after the failure.

    >>> within(lambda: 42, "a call", 1.0, "a limit", "nothing")
    42
    """
    returned: list[T] = []
    raised: list[BaseException] = []
    done = threading.Event()

    def run() -> None:
        try:
            returned.append(call())
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            raised.append(exc)
        finally:
            done.set()

    deadline_s = max(0.0, limit_s) + margin_s
    started = time.monotonic()
    threading.Thread(target=run, name=f"recoverable-sink-{what.split(' ')[0]}", daemon=True).start()
    if not done.wait(deadline_s):
        waited = time.monotonic() - started
        abandon(handle)
        step = next_step or "the task fails now, and Spark retries it"
        message = (f"{what} did not return within {waited:.1f} s ({bound_by}, plus {margin_s:g} s) waiting on "
                   f"{waiting_on}: a reply that never came, as in librdkafka's coordinator bugs "
                   f"(confluentinc/librdkafka#5456, #5511). {step[0].upper()}{step[1:]}; this process abandons that "
                   "Kafka client (never called or destroyed again), and a Spark Python worker exits once its failed "
                   "task has reported, so no later task inherits it")
        log.error("%s", message)
        raise DeadlineExceededError(message, seconds=waited)
    if raised:
        raise raised[0]
    return returned[0]
