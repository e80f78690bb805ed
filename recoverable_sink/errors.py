"""Exceptions the sink raises. Every message names the option, column, record or WAL location at fault
and says what to do about it."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from confluent_kafka import KafkaError


class RecoverableSinkError(Exception):
    """Base class of every error raised by ``recoverable_sink``."""


class OptionError(RecoverableSinkError, ValueError):
    """A write option is missing, malformed, or would break a guarantee the sink gives."""


class SchemaError(RecoverableSinkError, ValueError):
    """The DataFrame's columns do not fit the Kafka sink schema."""


class RecordError(RecoverableSinkError, ValueError):
    """A record cannot be published as it is (null topic, partition out of range, too large, ...)."""


class UnknownTopicError(RecordError):
    """A record's topic column names a topic the cluster does not have, and the sink may not create it."""


class WalError(RecoverableSinkError):
    """The write-ahead log cannot be opened or written (permissions, disk full, ...)."""


class WalFullError(WalError):
    """Appending would take the WAL past ``wal.maxBytes``; nothing was dropped."""


class WalCorruptionError(WalError):
    """A WAL entry failed its checksum or could not be decoded; it is never replayed blindly."""


class DeliveryError(RecoverableSinkError):
    """Kafka did not acknowledge every record; the unacknowledged ones stay in the WAL."""


class InputCutShortError(RecoverableSinkError):
    """Spark ended the task's input early because the JVM side of the task failed; nothing is committed."""


class StaleAttemptError(RecoverableSinkError):
    """A task of a run (or micro-batch) that a newer one has already superseded: a zombie. It sends nothing."""


class RerunRefusedError(DeliveryError):
    """A re-run's partition cannot be judged against what an earlier run committed; nothing of it was sent."""


class DeadlineExceededError(DeliveryError):
    """A client call that can block did not return within the deadline the sink owns for it (its own timeout plus a
    margin); its handle is abandoned. ``seconds``: how long the caller waited."""

    def __init__(self, message: str, seconds: float = 0.0) -> None:
        super().__init__(message)
        self.seconds = seconds


class FatalProducerError(DeliveryError):
    """The producer cannot go on (idempotence or transaction state lost; under exactly_once most often: another
    attempt of the partition fenced this one). The task fails; what was acknowledged is checkpointed."""


# pyspark's worker modules that run a Python data source write: its tasks, its planning (writer(), streamWriter())
# and a stream's commit. Each reports a failure to the JVM and then exits.
_SPARK_WORKERS = ("pyspark.worker", "pyspark.sql.worker.write_into_data_source",
                  "pyspark.sql.worker.python_streaming_sink_runner")


def _in_a_spark_worker() -> bool:
    main = getattr(sys.modules.get("__main__"), "__spec__", None)
    return getattr(main, "name", None) in _SPARK_WORKERS or any(m in sys.modules for m in _SPARK_WORKERS)


@contextmanager
def sentence_first() -> Iterator[None]:
    """Let a sink error raised in one of Spark's Python workers reach the user as its sentence alone.

    pyspark's worker sends a failure to the JVM as a whole traceback, which Spark puts after its own prefix
    (``[PYTHON_DATA_SOURCE_ERROR] Failed to initialize Python data source writer:`` on the driver, ``An exception
    was thrown from the Python worker:`` from a task), so the sink's sentence came after 8 to 12 lines of frames.
    With ``SPARK_HIDE_TRACEBACK`` set (what ``spark.sql.execution.pyspark.udf.hideTraceback.enabled`` sets) the
    worker sends ``Type: sentence`` alone; the variable is read when the worker reports the error, and the worker
    exits right after, so nothing else is affected. Any other exception (a bug) keeps its traceback."""
    try:
        yield
    except RecoverableSinkError:
        if _in_a_spark_worker():
            os.environ["SPARK_HIDE_TRACEBACK"] = "1"
        raise


def transaction_problem(err: KafkaError, what: str, txn_id: str) -> str:
    """An actionable sentence for a transaction error."""
    code = err.code()
    if code == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED:
        hint = (f"grant WRITE on TransactionalId {txn_id} (a PREFIXED ACL on transactional.id.prefix covers every "
                "write)")
    elif code == KafkaError.GROUP_AUTHORIZATION_FAILED:
        hint = (f"grant READ on the consumer group {txn_id} (PREFIXED on transactional.id.prefix): it holds the "
                "commit marker")
    elif code == KafkaError.INVALID_TRANSACTION_TIMEOUT:
        hint = "lower kafka.transaction.timeout.ms to at most the brokers' transaction.max.timeout.ms"
    elif code in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH):
        hint = ("another attempt of the same partition took over (a speculative or retried task); this attempt "
                "stops and leaves the partition to it")
    elif code in (KafkaError._TIMED_OUT, KafkaError.COORDINATOR_NOT_AVAILABLE):
        hint = ("the transaction coordinator did not answer: check the brokers run transactions "
                "(transaction.state.log.replication.factor and .min.isr no larger than the brokers you have)")
    else:
        hint = "see the Kafka error"
    return f"{what} for transactional.id {txn_id} failed: {err.name()}: {err.str()}; {hint}"
