"""Schema Registry framing against plain Avro bytes: the same rows written three ways, interleaved, medians of
REGISTRY_REPS. Part of ``make bench``; alone, against the development broker:

    .venv/bin/python -m bench.registry      # REGISTRY_ROWS=1000000 REGISTRY_REPS=3

* ``avro_binary``: ``value`` is ``to_avro(struct)`` and the sink writes it as it is (no registry);
* ``avro_framed``: the same bytes framed for the registry (``value.schema.registry.url`` + ``value.avro.schema``);
* ``struct_encoded``: ``value`` is the struct itself, encoded as Avro by the sink.

Each row is a long, a 20-character string and a nullable double (about 30 bytes of Avro). Reported per case:
seconds and CPU per record (the driver, its JVM and the Python workers; the broker and the registry excluded).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from typing import Any

from bench.harness import OUT, Bench, run_alone
from testing.schema_registry import SchemaRegistry
from testing.spark import sink_writer

ROWS = int(os.environ.get("REGISTRY_ROWS", "1000000"))
REPS = int(os.environ.get("REGISTRY_REPS", "3"))
PARTITIONS = 4
SCHEMA = json.dumps({"type": "record", "name": "Order", "fields": [
    {"name": "id", "type": "long"}, {"name": "item", "type": "string"}, {"name": "half", "type": ["double", "null"]}]})


def measure(b: Bench) -> dict[str, Any]:
    """The three cases; returns the ``schema_registry`` section of results.json."""
    from pyspark.sql import functions as F
    from pyspark.sql.avro.functions import to_avro

    registry = SchemaRegistry().start()
    try:
        struct = F.struct(F.col("id"), F.lpad(F.col("id").cast("string"), 20, "x").alias("item"),
                          F.when(F.col("id") % 3 == 0, F.lit(None)).otherwise(F.col("id") / 2).alias("half"))
        base = b.spark.range(0, ROWS, 1, PARTITIONS).select(F.col("id").cast("string").alias("key"), struct.alias("s"))
        avro = base.select("key", to_avro(F.col("s"), SCHEMA).alias("value")).cache()
        structs = base.select("key", F.col("s").alias("value")).cache()
        avro.count(), structs.count()
        framing = {"value.schema.registry.url": registry.url}
        cases = {
            "avro_binary": (avro, {}),
            "avro_framed": (avro, {**framing, "value.avro.schema": SCHEMA}),
            "struct_encoded": (structs, framing),
        }
        for df, options in cases.values():  # warm-up: the JVM, the workers, the subjects
            b.timed("warm-up", PARTITIONS, ROWS, lambda t, df=df, o=options: _write(b, df, t, o))
        runs: dict[str, list[Any]] = {name: [] for name in cases}
        for _ in range(REPS):
            for name, (df, options) in cases.items():
                runs[name].append(b.timed(name, PARTITIONS, ROWS, lambda t, df=df, o=options: _write(b, df, t, o)))
        avro.unpersist(), structs.unpersist()
    finally:
        registry.stop()
    out: dict[str, Any] = {"rows": ROWS, "partitions": PARTITIONS, "reps": REPS, "cases": []}
    for name, done in runs.items():
        ok = [r for r in done if not r.error]
        seconds = statistics.median(r.seconds for r in ok) if ok else None
        cpu = [r.cpu_seconds for r in ok if r.cpu_seconds is not None]
        out["cases"].append({"case": name, "seconds": seconds and round(seconds, 3),
                             "cpu_us_per_record": round(statistics.median(cpu) * 1e6 / ROWS, 3) if cpu else None,
                             "errors": [r.error for r in done if r.error]})
    return out


def _write(b: Bench, df: Any, topic: str, options: dict[str, str]) -> None:
    sink_writer(df, b.bootstrap, topic, OUT / "wal", **options).save()


def main() -> int:
    return run_alone(measure, "registry")


if __name__ == "__main__":
    sys.exit(main())
