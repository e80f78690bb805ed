"""Acknowledgements learnt at drains (executor): serve a producer's reports, wait for its queue to empty, and
tell the task's :class:`~recoverable_sink.producer.tracker.DeliveryTracker` what Kafka acknowledged.

The task drains every checkpoint interval and at its end, so it knows as much as a per-record report would have
told it at its checkpoints (see :mod:`recoverable_sink.producer.tracker`).
"""

from __future__ import annotations

import time

from recoverable_sink.options import SinkOptions
from recoverable_sink.producer.protocol import SinkProducer, fatal_errors
from recoverable_sink.producer.tracker import DeliveryTracker

_DEFAULT_DELIVERY_TIMEOUT_MS = 300_000  # librdkafka's default message.timeout.ms


def delivery_timeout_s(options: SinkOptions) -> float:
    conf = options.producer_config()
    ms = conf.get("delivery.timeout.ms") or conf.get("message.timeout.ms") or _DEFAULT_DELIVERY_TIMEOUT_MS
    return int(ms) / 1000


def serve(producer: SinkProducer, tracker: DeliveryTracker) -> None:
    """Serve reports that are ready, without waiting; an empty queue is a drain."""
    with fatal_errors():
        producer.poll(0)
    if tracker.window and len(producer) == 0:
        tracker.drained()


def drain(producer: SinkProducer, tracker: DeliveryTracker, timeout_s: float) -> None:
    """Wait up to ``timeout_s`` for the producer's queue to empty (serving failure reports); if it emptied,
    learn what was acknowledged."""
    with fatal_errors():
        left = producer.flush(timeout_s)
    if left == 0:
        tracker.drained()


def wait_for_acks(producer: SinkProducer, tracker: DeliveryTracker, timeout_s: float) -> None:
    """Drain until every handed-over record is acknowledged or has failed, with a deadline past
    librdkafka's own delivery timeout (after which it reports every undelivered record as failed)."""
    deadline = time.monotonic() + timeout_s
    while tracker.outstanding > 0:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        drain(producer, tracker, min(1.0, remaining))
