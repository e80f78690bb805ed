"""The DataSource Spark looks up as ``format("recoverable_kafka")`` (driver).

Validation happens here, at planning time, before any task runs: options, schema, save mode, and that the
brokers answer and the topic exists. A stream's micro-batches reuse the answers for a while (:class:`RecentChecks`).
"""

from __future__ import annotations

import os
import time
from typing import NamedTuple

from pyspark.sql.datasource import DataSource, DataSourceStreamWriter, DataSourceWriter
from pyspark.sql.types import StructType

from recoverable_sink._logging import get_logger
from recoverable_sink.columns import SchemaPlan
from recoverable_sink.driver import shared_checks
from recoverable_sink.driver.batch_write import RecoverableKafkaBatchWriter
from recoverable_sink.driver.preflight import (
    TopicQuestions,
    check_cluster,
    check_dead_letter_topic,
    check_proof_topic,
    check_transactions,
    fit_topic_limit,
)
from recoverable_sink.driver.registry import frame_with_registry
from recoverable_sink.driver.schema import plan_schema
from recoverable_sink.driver.stream_write import RecoverableKafkaStreamWriter
from recoverable_sink.errors import OptionError, sentence_first
from recoverable_sink.options import SinkOptions, parse_options

log = get_logger("driver")


class WriterArgs(NamedTuple):
    options: SinkOptions
    plan: SchemaPlan
    cluster_id: str


class RecentChecks:
    """The driver's answers for a stream's writer, reused for up to ``REUSE_S`` seconds by the same options and
    schema. Spark asks for a stream writer twice per micro-batch (to plan it and to commit it, each in a Python
    worker it keeps), and the checks are most of what the sink adds to a micro-batch over a Python sink that does
    nothing (docs/performance.md, "A stream's checks reused"). A batch write always checks. What changes within the
    window (a topic deleted, a right revoked, a smaller ``max.message.bytes``) fails the tasks instead, with the
    brokers' own error, and the next check after the window says it before any task runs. The answers are shared
    with the driver's other Python workers (:mod:`.shared_checks`): a micro-batch's commit or abort does not check
    again what its planning just checked."""

    REUSE_S = 60.0

    def __init__(self) -> None:
        self._answers: dict[tuple[tuple[tuple[str, str], ...], str], tuple[float, WriterArgs]] = {}

    def get(self, source: RecoverableKafkaDataSource, schema: StructType) -> WriterArgs:
        key = (tuple(sorted((str(k).lower(), str(v)) for k, v in source.options.items())), schema.json())
        now = time.monotonic()
        found = self._answers.get(key)
        if found is not None and now - found[0] < self.REUSE_S:
            log.debug("reusing the driver's checks of %.1f s ago", now - found[0])
            return found[1]
        # Another Python worker of this driver (the micro-batch's planning, for its commit or abort) may have checked.
        raw = {str(k): str(v) for k, v in source.options.items()}
        shared_key = shared_checks.key_of(raw, schema.json())
        shared = shared_checks.load(shared_key, parse_options(raw), self.REUSE_S)
        if shared is not None:
            log.debug("reusing the checks another Python worker of this driver made")
            args = WriterArgs(*shared)
        else:
            args = source._writer_args(schema)
            shared_checks.save(shared_key, args.options, args.plan, args.cluster_id)
        self._answers = {k: v for k, v in self._answers.items() if now - v[0] < self.REUSE_S}
        self._answers[key] = (now, args)
        return args


_RECENT = RecentChecks()


class RecoverableKafkaDataSource(DataSource):
    """Write a DataFrame to Apache Kafka with no loss and no retry duplicates.

    A drop-in for ``format("kafka")`` on the write side: same options (``kafka.*``, ``topic``) and input
    columns (``key``, ``value``, ``topic``, ``partition``, ``headers``, plus ``timestamp``), the Java client's
    partitioning. Each task first stores its records in an executor-local LMDB write-ahead log (``wal.path``,
    bounded by ``wal.maxBytes``); a retried task re-sends only what Kafka never acknowledged.

    Examples
    --------
    >>> from recoverable_sink import RecoverableKafkaDataSource
    >>> spark.dataSource.register(RecoverableKafkaDataSource)  # doctest: +SKIP
    >>> (spark.range(1000).selectExpr("CAST(id AS STRING) AS key", "CAST(id * 2 AS STRING) AS value")
    ...     .write.format("recoverable_kafka")
    ...     .option("kafka.bootstrap.servers", "127.0.0.1:9092")
    ...     .option("topic", "events")
    ...     .mode("append").save())  # doctest: +SKIP
    """

    @classmethod
    def name(cls) -> str:
        return "recoverable_kafka"

    def schema(self) -> StructType:
        raise OptionError("recoverable_kafka is a sink: read the topic back with format('kafka')")

    def _writer_args(self, schema: StructType) -> WriterArgs:
        """Options, schema plan and cluster id, all checked on the driver before any task runs."""
        started = time.monotonic()
        options = parse_options(self.options)
        encoded = frozenset(r.field for r in options.registry)
        plan = frame_with_registry(options, plan_schema(schema, options.topic, encoded), schema)
        questions = TopicQuestions.ask(options)  # answered while check_cluster waits for the brokers' metadata
        cluster_id = check_cluster(options, questions)
        options = fit_topic_limit(options, questions)
        options = check_dead_letter_topic(options)
        options = check_proof_topic(options)
        if options.exactly_once:
            check_transactions(options)
        log.debug("the driver's checks took %.1f ms (Python worker %d)", (time.monotonic() - started) * 1000,
                  os.getpid())
        return WriterArgs(options, plan, cluster_id)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        with sentence_first():
            if overwrite:
                raise OptionError(
                    "save mode Overwrite is not supported: a Kafka topic is an append-only log that cannot be "
                    "truncated by a write; use mode('append') (format('kafka') refuses Overwrite too)"
                )
            return RecoverableKafkaBatchWriter(*self._writer_args(schema))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:  # noqa: N802
        # overwrite is set for outputMode("complete"): like format("kafka"), every trigger then appends the whole
        # result table to the topic; there is nothing to truncate in Kafka.
        with sentence_first():
            checkpoint = next((str(v) for k, v in self.options.items() if str(k).lower() == "checkpointlocation"), None)
            return RecoverableKafkaStreamWriter(*_RECENT.get(self, schema), checkpoint_location=checkpoint)
