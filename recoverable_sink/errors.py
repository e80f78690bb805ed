"""Exceptions the sink raises. Every message names the option, column, record or WAL location at fault
and says what to do about it."""

from __future__ import annotations

from confluent_kafka import KafkaError


class RecoverableSinkError(Exception):
    """Base class of every error raised by ``recoverable_sink``."""


class OptionError(RecoverableSinkError, ValueError):
    """A write option is missing, malformed, or would break a guarantee the sink gives."""


class SchemaError(RecoverableSinkError, ValueError):
    """The DataFrame's columns do not fit the Kafka sink schema."""


class RecordError(RecoverableSinkError, ValueError):
    """A record cannot be published as it is (null topic, partition out of range, too large, ...)."""


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


class FatalProducerError(DeliveryError):
    """The producer cannot go on (idempotence or transaction state lost; under exactly_once most often: another
    attempt of the partition fenced this one). The task fails; what was acknowledged is checkpointed."""


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
