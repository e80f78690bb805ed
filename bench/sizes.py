"""Cost over size (``make soak`` runs it after the stream): batch writes of 1M, 10M and 50M rows of 100 B values
on 4 and 64 partitions, each under a generated id with the WAL on. Per write: time per record, the Python
workers' peak memory (RSS and anonymous), and the WAL's peak disk use, sampled from /proc and the WAL file's
allocated blocks. Time per record should not grow with size, nor memory; the WAL's peak should follow what is
unacknowledged, not the partition's size (its proof of delivery, 16 bytes a record, is the part that does).

    .venv/bin/python -m bench.sizes                  # SOAK_SIZES=1000000,10000000,50000000 SOAK_PARTITIONS=4,64

Writes the ``sizes`` section of build/soak/results.json (keeping the rest of the file); each entry also has the
fixed cost of a write on as many partitions (the fastest of three one-record-per-partition writes) and the time
per record beyond it.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from bench.harness import frame, spark_session
from bench.rss import WorkerRssSampler
from testing.kafka_check import count_topic
from testing.kafka_local import REPO, create_topic, ensure_local
from testing.spark import sink_writer

OUT = REPO / "build" / "soak"


class DiskSampler:
    """Every ``interval_s``, the bytes allocated to the files under ``path``; keeps the maximum."""

    def __init__(self, path: Path, interval_s: float = 0.2) -> None:
        self.path = path
        self.interval_s = interval_s
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="disk-sampler", daemon=True)

    def __enter__(self) -> DiskSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()

    def sample(self) -> None:
        total = 0
        for root, _, files in os.walk(self.path):
            for name in files:
                try:
                    total += os.stat(os.path.join(root, name)).st_blocks * 512
                except OSError:
                    pass
        self.peak = max(self.peak, total)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval_s)


def _ints(name: str, default: str) -> list[int]:
    return [int(x) for x in os.environ.get(name, default).split(",") if x.strip()]


def one_write(spark: Any, bootstrap: str, rows: int, partitions: int) -> dict[str, Any]:
    topic = create_topic(bootstrap, f"size-{uuid.uuid4().hex[:8]}", 4)
    wal = OUT / "sizes-wal" / topic
    df = frame(spark, rows, 100, partitions=partitions)
    with WorkerRssSampler(interval_s=0.2) as rss, DiskSampler(wal) as disk:
        started = time.perf_counter()
        sink_writer(df, bootstrap, topic, wal).save()
        seconds = time.perf_counter() - started
    landed = count_topic(bootstrap, topic, timeout_s=60)
    shutil.rmtree(wal, ignore_errors=True)
    from confluent_kafka.admin import AdminClient

    AdminClient({"bootstrap.servers": bootstrap}).delete_topics([topic])
    peak_rss, peak_anon = rss.peak_mib(), rss.peak_anon_mib()
    return {"rows": rows, "partitions": partitions, "seconds": round(seconds, 2),
            "us_per_record": round(seconds * 1e6 / rows, 3), "worker_peak_rss_mib": peak_rss and round(peak_rss, 1),
            "worker_peak_anon_mib": peak_anon and round(peak_anon, 1),
            "wal_peak_mib": round(disk.peak / 2**20, 1), "verified": landed == rows}


def main() -> int:
    sizes, partition_counts = _ints("SOAK_SIZES", "1000000,10000000,50000000"), _ints("SOAK_PARTITIONS", "4,64")
    bootstrap = ensure_local()
    spark = spark_session()
    OUT.mkdir(parents=True, exist_ok=True)
    one_write(spark, bootstrap, min(sizes), partition_counts[0])  # warm-up: the JVM's JIT, the workers
    results = []
    for partitions in partition_counts:
        # A write's fixed cost on this many partitions (one record each: job, tasks, producers, commit), so that
        # the time per record beyond it shows whether records get dearer with size, apart from its share.
        fixed = min(one_write(spark, bootstrap, partitions, partitions)["seconds"] for _ in range(3))
        for rows in sizes:
            entry = one_write(spark, bootstrap, rows, partitions)
            entry["fixed_seconds"] = fixed
            entry["us_per_record_beyond_fixed"] = round(max(0.0, entry["seconds"] - fixed) * 1e6 / rows, 3)
            sys.stdout.write(json.dumps(entry) + "\n")
            sys.stdout.flush()
            results.append(entry)
    spark.stop()
    path = OUT / "results.json"
    doc = json.loads(path.read_text()) if path.exists() else {}
    doc["sizes"] = {"value_bytes": 100, "runs": results}
    path.write_text(json.dumps(doc, indent=2) + "\n")
    return 0 if all(r["verified"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
