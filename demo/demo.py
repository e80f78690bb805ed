"""The demo: what the sink is for, in one run. The same DataFrame (its values computed by a Python stage, as
in many pipelines) is written three times, to three fresh topics: by Spark's own ``format("kafka")``, and by
``format("recoverable_kafka")`` in each delivery mode. In every write, the Python worker of each task's first
attempt is SIGKILLed once it has passed 40% of its partition downstream; Spark retries the failed tasks. Then
every topic is read back by an independent ``read_committed`` consumer and the records, lost and duplicated
are printed side by side.

    make demo                                         # uses (or starts) the local broker on 127.0.0.1:9092
    KAFKA_BOOTSTRAP=host1:9092,host2:9092 make demo   # any other cluster (it must allow topic creation)
    DEMO_ROWS=1000000 make demo

Exit status 0 when the sink lost nothing in either mode and repeated nothing under exactly_once. A broker it
started keeps running afterwards (``make kafka-down`` stops it).
"""

from __future__ import annotations

import os
import signal
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from testing.chaos.checker import ids_in_topic, verdict
from testing.kafka_local import REPO, create_topic, ensure_local, metadata
from testing.spark import local_spark

if TYPE_CHECKING:
    import pyarrow as pa

DEMO_DIR = REPO / "build" / "demo"
KILL_AT = 0.4


def _is_local(bootstrap: str) -> bool:
    port = os.environ.get("KAFKA_PORT", "9092")
    return bootstrap in (f"127.0.0.1:{port}", f"localhost:{port}")


def resolve_bootstrap() -> str:
    """KAFKA_BOOTSTRAP if it names another cluster; else the local development broker, started if needed."""
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP", "").strip()
    if bootstrap and not _is_local(bootstrap):
        if metadata(bootstrap, timeout_s=15) is None:
            raise SystemExit(f"KAFKA_BOOTSTRAP={bootstrap}: no Kafka broker answered within 15s")
        return bootstrap
    print("using the local Kafka broker (starting it if it is not up) ...", flush=True)
    return ensure_local()


INTRO = """\
recoverable_kafka demo: what happens to Kafka records when a Spark task's Python worker dies mid-write.

The same {rows:,} records are written three times, each time to a fresh topic: by Spark's own format("kafka"),
then by format("recoverable_kafka") at_least_once and exactly_once. In every write, the Python worker of each
task's first attempt is killed (SIGKILL, as an out-of-memory kill would) once it has passed {kill:.0%} of its
partition; Spark retries the task. An independent read_committed consumer then counts what each topic holds.
Spark's own log, with the stack traces of the deliberate kills, goes to {log}.
"""


def _spark_log_to_file(path: Path) -> None:
    """Send this process's standard error, which the Spark JVM and its Python workers inherit, to ``path``: the
    deliberate kills print pages of stack traces there. The demo's own lines go to standard output."""
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stderr.flush()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 2)
    os.close(fd)


def _kills(since: set[str]) -> list[str]:
    """The kill marks the workers left (one per killed first attempt) that are not in ``since``."""
    return sorted(p.name for p in (DEMO_DIR / "kills").glob("*") if p.name not in since)


def main() -> int:
    rows = int(os.environ.get("DEMO_ROWS", "200000"))
    log_file = DEMO_DIR / "spark.log"
    print(INTRO.format(rows=rows, kill=KILL_AT, log=log_file.relative_to(REPO)), flush=True)
    bootstrap = resolve_bootstrap()
    run = f"demo-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"

    import pyarrow.compute as pc
    from pyspark.sql import functions as F

    _spark_log_to_file(log_file)
    (DEMO_DIR / "kills").mkdir(parents=True, exist_ok=True)
    print("starting Spark (local[2,4]: two cores, up to 4 attempts per task) ...", flush=True)
    spark = local_spark("recoverable-kafka-demo", **{"spark.sql.execution.arrow.maxRecordsPerBatch": "2000"})
    spark.sparkContext.setLogLevel("ERROR")

    per_partition = rows // 4

    def enrich(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:  # a Python stage, as many have
        from pyspark import TaskContext

        ctx, passed = TaskContext.get(), 0
        for batch in batches:
            if ctx is not None and ctx.attemptNumber() == 0 and passed >= KILL_AT * per_partition:
                (DEMO_DIR / "kills" / f"stage{ctx.stageId()}-partition{ctx.partitionId()}").touch()
                os.kill(os.getpid(), signal.SIGKILL)  # the worker dies mid-partition, as an OOM kill would do it
            passed += batch.num_rows
            yield batch.set_column(1, "value", pc.utf8_upper(batch.column(1)))

    df = (spark.range(rows, numPartitions=4)
          .select(F.col("id").cast("string").alias("key"), F.concat(F.lit("event-"), F.col("id")).alias("value"))
          .mapInArrow(enrich, "key string, value string"))

    writes = {
        "format(\"kafka\")": lambda w: w.format("kafka"),
        "recoverable_kafka, at_least_once": lambda w: w.format("recoverable_kafka")
        .option("wal.path", str(DEMO_DIR / "wal")),
        "recoverable_kafka, exactly_once": lambda w: w.format("recoverable_kafka")
        .option("wal.path", str(DEMO_DIR / "wal")).option("delivery.guarantee", "exactly_once"),
    }
    results = []
    for name, configure in writes.items():
        topic = f"{run}-{len(results)}"
        create_topic(bootstrap, topic, partitions=4)  # the cluster's default replication factor
        print(f"{name}: writing {rows:,} records to topic {topic} ...", flush=True)
        before = set(_kills(set()))
        started = time.monotonic()
        try:
            configure(df.write).option("kafka.bootstrap.servers", bootstrap).option("topic", topic) \
                .mode("append").save()
            error = ""
        except Exception as exc:  # noqa: BLE001 - shown in the table
            error = str(exc).splitlines()[0][:120]
        seconds = time.monotonic() - started
        killed = _kills(before)
        print(f"  killed {len(killed)} Python worker(s) mid-partition ({', '.join(k.split('-')[1] for k in killed)}); "
              f"Spark retried {'those tasks' if killed else 'nothing'}; "
              + (f"the write failed: {error}" if error else f"the write finished in {seconds:.1f} s"), flush=True)
        found: Counter[str] = ids_in_topic(bootstrap, topic, expected=rows)
        lost, duplicated, _ = verdict((str(i) for i in range(rows)), found)
        results.append((name, sum(found.values()), lost, duplicated, seconds, error))
    spark.stop()

    print(f"\n{rows:,} records written three times; in each write, every task's first Python worker was SIGKILLed "
          f"at {KILL_AT:.0%} of its partition and Spark retried the task\n")
    print(f"{'write':<36} {'records read':>12} {'lost':>6} {'duplicated':>11} {'seconds':>8}")
    for name, total, lost, duplicated, seconds, error in results:
        note = f"  ({error})" if error else ""
        print(f"{name:<36} {total:>12,} {lost:>6,} {duplicated:>11,} {seconds:>8.1f}{note}")
    sink = results[1:]
    ok = all(lost == 0 and not error for _, _, lost, _, _, error in sink) and sink[1][3] == 0
    print("\nOK: the sink lost nothing, and repeated nothing under exactly_once (read_committed)" if ok else
          "\nNOT OK: see the table")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
