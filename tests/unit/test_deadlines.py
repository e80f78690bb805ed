"""Deadlines the sink owns around blocking client calls (recoverable_sink.deadlines): a call that never returns ends
its caller's wait at its deadline, its handle kept alive and never called again."""

from __future__ import annotations

import gc
import sys
import threading
import time
import weakref

import pytest

from recoverable_sink.deadlines import abandoned, within
from recoverable_sink.errors import DeadlineExceededError, DeliveryError


class Handle:
    """Stands for a librdkafka client whose call is stuck."""


def test_a_call_that_never_returns_ends_at_its_deadline_naming_the_call_the_wait_and_the_coordinator():
    stuck = threading.Event()
    handle = Handle()
    before = abandoned()
    started = time.monotonic()
    with pytest.raises(DeadlineExceededError) as raised:
        within(stuck.wait, "partition 3: commit_transaction", 0.2, "kafka.transaction.timeout.ms=200",
               "the transaction coordinator of transactional.id t-3", handle=handle, margin_s=0.3)
    waited = time.monotonic() - started
    assert 0.5 <= waited < 2.0 and 0.5 <= raised.value.seconds < 2.0
    first = str(raised.value).splitlines()[0]
    for part in ("partition 3: commit_transaction did not return within", "kafka.transaction.timeout.ms=200",
                 "transaction coordinator of transactional.id t-3", "confluentinc/librdkafka#5456", "Spark retries"):
        assert part in first, part
    assert isinstance(raised.value, DeliveryError) and abandoned() == before + 1
    stuck.set()


def test_an_abandoned_handle_is_never_destroyed_not_even_once_the_call_returns():
    handle = Handle()
    ref = weakref.ref(handle)
    refs = sys.getrefcount(handle)
    with pytest.raises(DeadlineExceededError):
        within(lambda: time.sleep(0.5), "a call", 0.0, "a limit", "a broker", handle=handle, margin_s=0.05)
    time.sleep(0.6)  # the call returned meanwhile
    del handle
    gc.collect()
    assert ref() is not None and refs > 0


def test_a_call_that_returns_or_raises_in_time_is_answered_as_it_would_be_without_a_deadline():
    assert within(lambda: "ok", "a call", 1.0, "a limit", "a broker") == "ok"
    with pytest.raises(KeyError, match="nope"):
        within(lambda: {}["nope"], "a call", 1.0, "a limit", "a broker")
