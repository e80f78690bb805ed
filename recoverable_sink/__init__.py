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
]


def __getattr__(name: str) -> object:
    # Imported on first use so that the recoverable-kafka-wal CLI, which needs no Spark, never imports pyspark.
    if name == "RecoverableKafkaDataSource":
        from recoverable_sink.source import RecoverableKafkaDataSource

        return RecoverableKafkaDataSource
    raise AttributeError(f"module 'recoverable_sink' has no attribute {name!r}")
