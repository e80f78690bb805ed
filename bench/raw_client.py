"""``make bench``'s ``raw_client`` case in a Python process of its own: one confluent-kafka producer with a
per-record delivery callback (the usual way to use the client), no Spark.

It builds its records first (not timed), then times producing them until every one is acknowledged, and
prints ``{"seconds": ...}``. A process of its own because the records are a Python list: 2M x 1 KB values
is about 2.3 GB, and held in the bench's driver for a whole shape it slowed the Spark cases run beside it
(docs/performance.md, "The bench's own fault").

    .venv/bin/python -m bench.raw_client BOOTSTRAP TOPIC ROWS VALUE_BYTES [--headers]
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from confluent_kafka import Producer

DISTINCT_KEYS = 100_000
# The sink's producer defaults (options.PRODUCER_DEFAULTS); linger and batch sizes stay librdkafka's.
PRODUCER = {"acks": "all", "enable.idempotence": "true", "partitioner": "murmur2_random"}

Record = tuple[bytes, bytes, list[tuple[str, bytes]] | None]


def row(i: int, value_bytes: int, headers: bool = False) -> Record:
    """Row ``i`` of ``bench.harness.frame``: key k<i % 100000>, value "<i>:" padded with x, two headers."""
    return (b"k%d" % (i % DISTINCT_KEYS), (b"%d:" % i).ljust(value_bytes, b"x")[:value_bytes],
            [("source", b"bench"), ("seq", b"%d" % i)] if headers else None)


def produce_all(bootstrap: str, topic: str, records: list[Record]) -> float:
    """Produce every record and wait for every acknowledgement; returns the seconds it took."""
    started = time.perf_counter()
    producer = Producer({"bootstrap.servers": bootstrap, **PRODUCER})
    acked = failed = 0

    def on_delivery(err: object, _msg: object) -> None:
        nonlocal acked, failed
        if err is None:
            acked += 1
        else:
            failed += 1

    produce, poll = producer.produce, producer.poll
    for i, (key, value, hdrs) in enumerate(records):
        while True:
            try:
                produce(topic, value, key, on_delivery=on_delivery, headers=hdrs)
                break
            except BufferError:  # local queue full: serve delivery reports, then retry
                poll(0.05)
        if i % 10_000 == 0:
            poll(0)
    while acked + failed < len(records):
        producer.flush(1.0)
    seconds = time.perf_counter() - started
    if failed:
        raise RuntimeError(f"{failed} of {len(records)} records were not acknowledged")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bootstrap")
    parser.add_argument("topic")
    parser.add_argument("rows", type=int)
    parser.add_argument("value_bytes", type=int)
    parser.add_argument("--headers", action="store_true")
    args = parser.parse_args()
    records = [row(i, args.value_bytes, args.headers) for i in range(args.rows)]
    cpu_before = time.process_time()  # every thread of this process: librdkafka's too
    result: dict[str, Any] = {"seconds": produce_all(args.bootstrap, args.topic, records)}
    result["cpu_seconds"] = time.process_time() - cpu_before
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
