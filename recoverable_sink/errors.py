"""Exceptions the sink raises. Every message names the option, column, record or WAL location at fault
and says what to do about it."""

from __future__ import annotations


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
