"""Where a task's producer comes from (executor): :func:`new_producer` picks the implementation once per
configuration, and :class:`ProducerPool` keeps producers by configuration across the tasks a Python worker runs
(connection set-up is paid once per worker, not once per task).
"""

from __future__ import annotations

import threading
import time
from typing import Any

from confluent_kafka import KafkaException

from recoverable_sink._logging import get_logger
from recoverable_sink.errors import DeliveryError
from recoverable_sink.options import SinkOptions
from recoverable_sink.producer.confluent import ConfluentProducer
from recoverable_sink.producer.native import NativeProducer, native_module
from recoverable_sink.producer.protocol import SinkProducer

log = get_logger("producer")

_POOL_MAX = 8
_POOL_IDLE_S = 600.0  # like Spark's producer cache (spark.kafka.producer.cache.timeout, 10 minutes)

ProducerKey = tuple[tuple[str, str], ...]


def new_producer(conf: dict[str, Any], native: bool, client_conf: dict[str, Any] | None = None) -> SinkProducer:
    """A native producer where asked for and available, else confluent-kafka's. ``client_conf`` (the client
    settings without the producer's) is needed by confluent-kafka's for a transaction's commit marker."""
    if native and native_module() is not None:
        return NativeProducer(conf)
    return ConfluentProducer.open(conf, client_conf)


class ProducerPool:
    """Producers by configuration, reused across the tasks a Python worker runs. At most ``max_size`` are
    kept; one idle for ``idle_s`` is flushed briefly and closed the next time the pool is used."""

    def __init__(self, max_size: int = _POOL_MAX, idle_s: float = _POOL_IDLE_S) -> None:
        self.max_size = max_size
        self.idle_s = idle_s
        self._producers: dict[tuple[ProducerKey, bool], tuple[SinkProducer, float]] = {}
        self._lock = threading.Lock()

    def get(self, options: SinkOptions) -> SinkProducer:
        now = time.monotonic()
        key = (options.producer_items, options.native_producer)
        with self._lock:
            expired = [k for k, (_, used) in self._producers.items() if now - used > self.idle_s]
            entry = self._producers.get(key)
            if entry is None:
                while len(self._producers) - len(expired) >= self.max_size:
                    expired.append(min((k for k in self._producers if k not in expired),
                                       key=lambda k: self._producers[k][1]))
                try:
                    producer = new_producer(options.producer_config(), options.native_producer)
                except KafkaException as exc:
                    raise DeliveryError(f"cannot create the Kafka producer: {options.scrub(str(exc))}") from None
            else:
                producer = entry[0]
            self._producers[key] = (producer, now)
            stale = [self._producers.pop(k)[0] for k in expired if k != key]
        for old in stale:
            _close(old, flush_s=1.0)
        return producer

    def discard(self, options: SinkOptions) -> None:
        """Drop a producer after a failure so the next task starts with an empty queue and a fresh state."""
        with self._lock:
            entry = self._producers.pop((options.producer_items, options.native_producer), None)
        if entry is not None:
            _close(entry[0], flush_s=0.0, purge=True)

    def close(self) -> None:
        """Flush (briefly) and drop every producer."""
        with self._lock:
            producers = [p for p, _ in self._producers.values()]
            self._producers.clear()
        for producer in producers:
            _close(producer, flush_s=5.0)

    def __len__(self) -> int:
        return len(self._producers)


def _close(producer: SinkProducer, flush_s: float, purge: bool = False) -> None:
    try:
        if purge:
            producer.purge()
        producer.flush(flush_s)
    except (KafkaException, RuntimeError, SystemError) as exc:  # SystemError: see fatal_errors()
        log.debug("closing a producer: %s", exc)
    finally:
        producer.close_logs()  # the counts of its repeated librdkafka lines, before it goes


producers = ProducerPool()
