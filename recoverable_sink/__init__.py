"""recoverable_sink: a PySpark DataSource (``format("recoverable_kafka")``) that writes to Apache Kafka
through an executor-local LMDB write-ahead log, so that a dead Python worker, executor or broker loses no
record and a retried task does not repeat the ones Kafka already acknowledged."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from recoverable_sink.driver.deployment import POINT_WORKERS, missing_here

_missing = missing_here()
if _missing:  # said here, in Spark's workers too, rather than as a bare "No module named" further in
    raise ModuleNotFoundError(
        f"recoverable_sink needs {', '.join(_missing)}, which this Python ({sys.executable}) cannot import. Install "
        f"recoverable-sink with its dependencies into it or, if Spark started it for its workers, {POINT_WORKERS}")

from recoverable_sink.errors import (  # noqa: E402
    DeliveryError,
    OptionError,
    RecordError,
    RecoverableSinkError,
    SchemaError,
    WalCorruptionError,
    WalError,
    WalFullError,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from recoverable_sink.driver.source import RecoverableKafkaDataSource

__all__ = [
    "DeliveryError",
    "OptionError",
    "RecordError",
    "RecoverableKafkaDataSource",
    "RecoverableSinkError",
    "SchemaError",
    "WalCorruptionError",
    "WalError",
    "WalFullError",
    "last_write",
    "register",
]


def register(spark: SparkSession) -> None:
    """Make ``format("recoverable_kafka")`` resolvable in ``spark`` from the calling thread.

    Where the sink is installed in the Python Spark starts, the main thread needs no call: Spark finds the format
    by itself. Call this (after creating the session) where it does not:

    - in a Python thread: Spark looks Python data sources up through the JVM thread's active session, which a
      Python thread (even a ``pyspark.InheritableThread``) does not have;
    - with ``spark-submit --py-files``: Spark's own search does not look inside the shipped archives;
    - wherever Spark reports DATA_SOURCE_NOT_FOUND: on a local master this first checks that the Python Spark
      starts for its workers can import the sink, and if not says which Python that is and what to set."""
    from recoverable_sink.driver.deployment import check_worker_python
    from recoverable_sink.driver.source import RecoverableKafkaDataSource

    jvm = getattr(spark, "_jvm", None)
    if jvm is not None:  # a classic session: its workers' Python is Spark's to start (Connect: the server's)
        check_worker_python(spark)
    try:
        spark.dataSource.register(RecoverableKafkaDataSource)
    except Exception as exc:
        # pyspark 4.0 refuses a name Spark already found by itself (this same class); later versions replace it.
        if "DATA_SOURCE_ALREADY_EXISTS" not in str(exc):
            raise
    if jvm is not None:  # a classic session (Spark Connect resolves on the server)
        jvm.org.apache.spark.sql.SparkSession.setActiveSession(spark._jsparkSession)


def last_write(spark: SparkSession) -> dict[str, Any] | None:
    """The summary of the last write (or micro-batch) that ``spark``'s driver committed through the sink: its
    counts, its tasks, and ``offsets``, per Kafka topic-partition the first and last offset it wrote and the
    records (under exactly_once, those of the committed transactions); None before any. See
    :func:`recoverable_sink.driver.last_write.last_write`."""
    from recoverable_sink.driver.last_write import last_write as read

    return read(spark)


def __getattr__(name: str) -> object:
    # Imported on first use so that the recoverable-kafka-wal CLI, which needs no Spark, never imports pyspark.
    if name == "RecoverableKafkaDataSource":
        from recoverable_sink.driver.source import RecoverableKafkaDataSource

        return RecoverableKafkaDataSource
    raise AttributeError(f"module 'recoverable_sink' has no attribute {name!r}")
