"""recoverable_sink: a PySpark DataSource (``format("recoverable_kafka")``) that writes to Apache Kafka
through an executor-local LMDB write-ahead log, so that a dead Python worker, executor or broker loses no
record and a retried task does not repeat the ones Kafka already acknowledged."""

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
