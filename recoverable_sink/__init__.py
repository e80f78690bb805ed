"""recoverable_sink: a PySpark DataSource (``format("recoverable_kafka")``) that writes to Apache Kafka
through an executor-local LMDB write-ahead log, so that a dead Python worker, executor or broker loses no
record and a retried task does not repeat the ones Kafka already acknowledged."""

from __future__ import annotations

from typing import TYPE_CHECKING

from recoverable_sink.errors import (
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

    from recoverable_sink.source import RecoverableKafkaDataSource

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
    "register",
]


def register(spark: SparkSession) -> None:
    """Make ``format("recoverable_kafka")`` resolvable in ``spark`` from the calling thread.

    The main thread needs no call: Spark finds the format by itself. Spark looks Python data sources up
    through the JVM thread's active session, which a Python thread (even a ``pyspark.InheritableThread``) does
    not have, so a write from one fails with DATA_SOURCE_NOT_FOUND; call this first in each such thread."""
    from recoverable_sink.source import RecoverableKafkaDataSource

    spark.dataSource.register(RecoverableKafkaDataSource)
    jvm = getattr(spark, "_jvm", None)
    if jvm is not None:  # a classic session (Spark Connect resolves on the server)
        jvm.org.apache.spark.sql.SparkSession.setActiveSession(spark._jsparkSession)


def __getattr__(name: str) -> object:
    # Imported on first use so that the recoverable-kafka-wal CLI, which needs no Spark, never imports pyspark.
    if name == "RecoverableKafkaDataSource":
        from recoverable_sink.source import RecoverableKafkaDataSource

        return RecoverableKafkaDataSource
    raise AttributeError(f"module 'recoverable_sink' has no attribute {name!r}")
