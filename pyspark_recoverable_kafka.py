"""Auto-registration shim: Spark scans top-level ``pyspark_*`` modules for a ``DefaultSource`` when it meets
an unknown format, so ``format("recoverable_kafka")`` works with no ``spark.dataSource.register`` call."""

from recoverable_sink.driver.source import RecoverableKafkaDataSource as DefaultSource

__all__ = ["DefaultSource"]
