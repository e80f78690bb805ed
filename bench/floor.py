"""What any Python sink pays before it sends a byte: the same cached DataFrame as ``make bench`` (100 B values,
keyed, 4 partitions, ``local[2,4]``) written by

* ``noop``          Spark's ``format("noop")``: the scan of the cache alone, in the JVM
* ``python_floor``  a Python ``DataSourceArrowWriter`` that only counts its Arrow batches: the scan, the JVM's
                    Arrow encoding, the socket to the Python worker and the worker's decoding, nothing else
* ``spark_kafka``, ``wal_off``, ``wal_on``  as in ``make bench``, to a 4-partition topic

interleaved, medians. The gap between ``python_floor`` and ``noop`` is what the Python Data Source API costs
for this data; what is left of Spark's own sink's time after ``noop`` is what its JVM producer costs.

    .venv/bin/python -m bench.floor        # FLOOR_ROWS=2000000 FLOOR_REPS=3

Writes build/bench/floor.json.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, DataSourceStreamWriter, WriterCommitMessage

try:
    from pyspark.sql.datasource import DataSourceStreamArrowWriter as _StreamArrowWriter
except ImportError:  # pyspark 4.0 hands Arrow batches to a stream writer that is also an Arrow writer
    class _StreamArrowWriter(DataSourceStreamWriter, DataSourceArrowWriter):  # type: ignore[no-redef]
        pass

from bench.harness import OUT, Bench, frame, spark_session
from testing.kafka_local import KafkaCluster

ROWS = int(os.environ.get("FLOOR_ROWS", "2000000"))
REPS = int(os.environ.get("FLOOR_REPS", "3"))
CASES = ("noop", "python_floor", "spark_kafka", "wal_off", "wal_on")


class _Counted(WriterCommitMessage):
    def __init__(self, rows: int) -> None:
        self.rows = rows


class _CountingWriter(DataSourceArrowWriter):
    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        return _Counted(sum(batch.num_rows for batch in iterator))


class _CountingStreamWriter(_StreamArrowWriter):
    """A stream's micro-batches as Arrow batches, as the sink reads them, counted and dropped."""

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        return _Counted(sum(batch.num_rows for batch in iterator))

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        pass

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        pass


class PythonFloor(DataSource):
    """A sink that receives every Arrow batch and drops it."""

    @classmethod
    def name(cls) -> str:
        return "python_floor"

    def writer(self, schema: Any, overwrite: bool) -> DataSourceArrowWriter:
        return _CountingWriter()

    def streamWriter(self, schema: Any, overwrite: bool) -> DataSourceStreamWriter:  # noqa: N802
        return _CountingStreamWriter()


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    cluster = KafkaCluster(OUT / "floor-kafka", 1)
    cluster.wipe()
    cluster.start()
    spark = None
    try:
        spark = spark_session()
        from recoverable_sink import RecoverableKafkaDataSource

        spark.dataSource.register(RecoverableKafkaDataSource)
        spark.dataSource.register(PythonFloor)
        b = Bench(spark, cluster)
        df = frame(spark, ROWS, 100).cache()
        assert df.count() == ROWS

        def timed_plain(fmt: str) -> float:
            started = time.perf_counter()
            df.write.format(fmt).mode("append").save()
            return time.perf_counter() - started

        writers = {"spark_kafka": b.spark_kafka(df), "wal_off": b.recoverable(df, wal=False),
                   "wal_on": b.recoverable(df, wal=True)}
        seconds: dict[str, list[float]] = {c: [] for c in CASES}
        for rep in range(REPS + 1):  # the first round warms the workers, producers and JIT, and is not kept
            for case in CASES:
                if case in writers:
                    run = b.timed(f"{case} rep {rep}", 4, ROWS, writers[case])
                    took = run.seconds if run.error is None else None
                else:
                    took = timed_plain(case)
                    print(f"  {case} rep {rep}: {took:.2f} s ({ROWS / took:,.0f} rows/s)", flush=True)
                if rep and took is not None:
                    seconds[case].append(took)
        medians = {c: statistics.median(s) for c, s in seconds.items() if s}
        report = {"rows": ROWS, "reps": REPS, "value_bytes": 100, "topic_partitions": 4,
                  "runs": {c: [round(x, 3) for x in s] for c, s in seconds.items()},
                  "median_seconds": {c: round(m, 3) for c, m in medians.items()},
                  "rows_per_second": {c: round(ROWS / m) for c, m in medians.items()},
                  "errors": b.errors}
        (OUT / "floor.json").write_text(json.dumps(report, indent=2) + "\n")
        print(json.dumps({k: report[k] for k in ("median_seconds", "rows_per_second", "errors")}, indent=2))
        return 0 if not b.errors and len(medians) == len(CASES) else 1
    finally:
        if spark is not None:
            spark.stop()
        cluster.stop()


if __name__ == "__main__":
    sys.exit(main())
