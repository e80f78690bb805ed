"""The native producer hands librdkafka each value in place, not a copy: what lands in a real topic must not
depend on the Python batch outliving the send."""

from __future__ import annotations

import gc
import os
from collections.abc import Callable

import pyarrow as pa
import pytest

from recoverable_sink.producer import native as native_producer
from recoverable_sink.producer.ledger import Ledger
from recoverable_sink.producer.native import NativeProducer
from testing.kafka_check import read_topic
from testing.kafka_local import KafkaCluster

pytestmark = pytest.mark.skipif(native_producer.native_module() is None,
                                reason="the _produce extension is not built here (no rdkafka.h at install)")


def test_values_arrive_intact_when_the_batch_is_dropped_and_its_memory_reused_before_delivery(
        kafka: KafkaCluster, new_topic: Callable[..., str]) -> None:
    """The producer keeps each send's value buffers until its queue is empty. Values of 2 KB (copied into the
    request) and 100 KB (over message.copy.max.bytes: the request points into the buffer) still queued when every
    reference to their batch is dropped and the freed memory is filled with other bytes arrive as sent; once
    drained the producer keeps nothing."""
    topic = new_topic(partitions=4)
    # linger.ms: the records are still in librdkafka's queue when the batch is dropped.
    producer = NativeProducer({"bootstrap.servers": kafka.bootstrap_servers, "acks": "all",
                               "enable.idempotence": "true", "linger.ms": "200"})
    ledger = Ledger(producer)
    values = [os.urandom(2000) for _ in range(3000)] + [os.urandom(100_000) for _ in range(20)]
    gc.collect()  # else the collection below may free an earlier test's Arrow buffers (CI: 432 bytes short)
    before = pa.total_allocated_bytes()
    batch = pa.RecordBatch.from_pydict({"key": [b"%d" % i for i in range(len(values))], "value": values})
    size = batch.column("value").nbytes  # the producer keeps the values' buffers; the keys are copied
    assert ledger.send(batch, topic, 0) == len(values)
    del batch
    gc.collect()
    assert pa.total_allocated_bytes() - before >= size  # every reference dropped here; the producer keeps it
    overwrite = [pa.array([b"\xee" * len(v) for v in values], pa.binary()) for _ in range(3)]
    kept = pa.total_allocated_bytes() - sum(a.nbytes for a in overwrite)
    ledger.wait_for_acks(60)
    assert ledger.acked == len(values) and ledger.failed == 0
    assert kept - (pa.total_allocated_bytes() - sum(a.nbytes for a in overwrite)) >= size  # let go once drained
    got = read_topic(kafka.bootstrap_servers, topic, expected=len(values))
    assert sorted(r["value"] for r in got) == sorted(values)
    del overwrite
