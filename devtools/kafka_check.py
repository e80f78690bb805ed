"""An independent reader of what landed in a topic: a plain confluent-kafka consumer that knows nothing of
``recoverable_sink``. It reads every partition up to the end offsets taken at the start, so it stops on a
condition, not on an idle timeout."""

from __future__ import annotations

import time
import uuid

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition


def read_topic(bootstrap: str, topic: str, timeout_s: float = 60, expected: int | None = None) -> list[dict]:
    """Every record of ``topic`` as dicts (key, value, topic, partition, offset, timestamp, headers).

    With ``expected``, waits (up to ``timeout_s``) until the topic's end offsets hold at least that many."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"check-{uuid.uuid4().hex}",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest",
                         "isolation.level": "read_committed"})
    try:
        deadline = time.monotonic() + timeout_s
        meta = consumer.list_topics(topic, timeout=timeout_s).topics[topic]
        partitions = sorted(meta.partitions)
        while True:
            ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in partitions}
            if expected is None or sum(ends.values()) >= expected or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        todo = {p for p, end in ends.items() if end > 0}
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in todo])
        out: list[dict] = []
        while todo and time.monotonic() < deadline:
            for msg in consumer.consume(10_000, timeout=1.0):
                if msg.error():
                    if msg.error().code() == KafkaError._PARTITION_EOF:
                        continue
                    raise RuntimeError(msg.error().str())
                out.append({"key": msg.key(), "value": msg.value(), "topic": msg.topic(),
                            "partition": msg.partition(), "offset": msg.offset(),
                            "timestamp": msg.timestamp()[1], "headers": msg.headers()})
                if msg.offset() + 1 >= ends[msg.partition()]:
                    todo.discard(msg.partition())
        if todo:
            raise TimeoutError(f"topic {topic}: partitions {sorted(todo)} not read to their end in {timeout_s}s")
        return out
    finally:
        consumer.close()


def count_topic(bootstrap: str, topic: str) -> int:
    """Records in a topic by its offsets (no data read): cheap, for progress checks."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"count-{uuid.uuid4().hex}"})
    try:
        meta = consumer.list_topics(topic, timeout=10).topics[topic]
        return sum(consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] -
                   consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[0]
                   for p in meta.partitions)
    finally:
        consumer.close()
