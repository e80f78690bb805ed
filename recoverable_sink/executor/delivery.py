"""The delivery modes (executor): what ``delivery.guarantee`` changes in a partition's write, as one small protocol the
partition writer calls (:mod:`recoverable_sink.executor.partition_writer`), in the spirit of Flink's KafkaWriter and
its delivery strategies.

- :class:`AtLeastOnce`: the pooled idempotent producer; what Kafka acknowledged counts at once; an abort waits for
  what is in flight, since an acknowledgement saved now is one a retry need not send.
- :class:`Transactional`: the partition's own transactional producer, which fences every earlier attempt of the
  partition on any host when it opens; records count only once the transaction commits, with the partition's marker.

Each mode is carried through five steps: :meth:`~DeliveryMode.open` (the producer to send through, and what opening
found), :meth:`~DeliveryMode.before_send`, :meth:`~DeliveryMode.locate_error`, :meth:`~DeliveryMode.finish` and
:meth:`~DeliveryMode.abort`; the writer never asks which mode it holds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from recoverable_sink._logging import get_logger
from recoverable_sink.contract import TaskIdentity
from recoverable_sink.errors import DeliveryError, FatalProducerError, RecordError
from recoverable_sink.options import SinkOptions
from recoverable_sink.producer.marker import Marker
from recoverable_sink.producer.pool import producers
from recoverable_sink.producer.protocol import SinkProducer
from recoverable_sink.producer.transactions import PartitionTransaction, read_markers, transactional_id

log = get_logger("delivery")


@dataclass(frozen=True)
class Opened:
    """What opening a mode gives the writer: the producer to send through; exactly_once: this write's committed marker
    of the partition (None: none, or none for this topic) and the latest micro-batch the partition's marker group
    names (a stream's)."""

    producer: SinkProducer
    own_marker: Marker | None = None
    latest_micro_batch: int | None = None


@dataclass(frozen=True)
class Commit:
    """What a finishing attempt hands its mode: the partition's marker as this attempt's commit makes it (None where
    there is no topic to commit it for: nothing was sent), and whether it handed anything over."""

    marker: Marker | None
    produced: bool


class DeliveryMode(Protocol):
    """One delivery guarantee, as the partition writer carries it out (see the module's docstring)."""

    exactly_once: bool
    # Whether an abort waits for what is in flight: an acknowledgement saved then is one a retry need not send.
    waits_on_abort: bool

    def open(self, topic: str | None) -> Opened:
        """Take the producer; exactly_once: fence every earlier attempt of the partition and read its marker."""
        ...

    def markers(self, partitions: list[int], topic: str | None) -> dict[int, tuple[Marker, ...]]:
        """This write's committed markers of other partitions (exactly_once; empty otherwise)."""
        ...

    def before_send(self) -> None:
        """Records are about to be handed to the producer."""
        ...

    def locate_error(self, exc: DeliveryError | RecordError) -> str:
        """What to add to a delivery error's message about this mode ("" for nothing)."""
        ...

    def finish(self, commit: Commit | None) -> bool:
        """Every record is acknowledged: make the attempt's records count, and release what the mode holds (None: a
        skipped partition, nothing to commit). Returns whether a transaction committed anything (at_least_once: always
        True, its records counted at once)."""
        ...

    def abort(self) -> None:
        """After a failure: release the producer so no stale delivery reaches the next task (exactly_once: abort
        the transaction, whatever Kafka acknowledged)."""
        ...


class AtLeastOnce:
    """``delivery.guarantee=at_least_once``: the pooled idempotent producer (or ``producer``, a test's)."""

    exactly_once = False
    waits_on_abort = True

    def __init__(self, options: SinkOptions, producer: SinkProducer | None = None) -> None:
        self.options = options
        self._given = producer

    def open(self, topic: str | None) -> Opened:
        return Opened(self._given if self._given is not None else producers.get(self.options))

    def markers(self, partitions: list[int], topic: str | None) -> dict[int, tuple[Marker, ...]]:
        return {}

    def before_send(self) -> None:
        """Nothing to note."""

    def locate_error(self, exc: DeliveryError | RecordError) -> str:
        return ""

    def finish(self, commit: Commit | None) -> bool:
        return True  # acknowledged records are visible at once; the producer stays in the pool

    def abort(self) -> None:
        if self._given is None:
            producers.discard(self.options)


class TransactionClient(Protocol):
    """What :class:`Transactional` asks of a partition's transaction (:class:`PartitionTransaction`, or a test's
    scripted one)."""

    producer: SinkProducer | None
    marker: Marker | None
    latest_batch: int | None
    in_transaction: bool

    def open(self, topic: str | None) -> Marker | None: ...

    def begin(self) -> None: ...

    def sending(self) -> None: ...

    def timed_out(self) -> str | None: ...

    def commit(self, marker: Marker, timeout_s: float) -> None: ...

    def abort(self) -> None: ...

    def close(self) -> None: ...


MarkerReader = Callable[[int, str | None], tuple[Marker, ...]]


class Transactional:
    """``delivery.guarantee=exactly_once``: one transaction per partition attempt, committed with the partition's
    marker, which names every attempt whose transaction holds records of the partition."""

    exactly_once = True
    waits_on_abort = False  # the transaction is aborted whatever was acknowledged

    def __init__(self, options: SinkOptions, ident: TaskIdentity, commit_wait_s: float,
                 transaction: TransactionClient | None = None, marker_reader: MarkerReader | None = None) -> None:
        self.options = options
        self.ident = ident
        self.commit_wait_s = commit_wait_s
        self.txn: TransactionClient = transaction if transaction is not None else PartitionTransaction(
            options, ident.write_id, ident.partition, ident.where, ident.transaction_scope, ident.run)
        self._read_markers = marker_reader if marker_reader is not None else self._from_groups

    def open(self, topic: str | None) -> Opened:
        marker = self.txn.open(topic)
        assert self.txn.producer is not None
        return Opened(self.txn.producer, own_marker=marker, latest_micro_batch=self.txn.latest_batch)

    def markers(self, partitions: list[int], topic: str | None) -> dict[int, tuple[Marker, ...]]:
        """This write's markers (for this topic) of ``partitions``: one marker read per partition."""
        return {p: self._read_markers(p, topic) for p in partitions}

    def _from_groups(self, partition: int, topic: str | None) -> tuple[Marker, ...]:
        group = transactional_id(self.options, self.ident.transaction_scope, partition)
        fail = getattr(self.txn, "fail", None)
        markers = read_markers(self.options, group, [topic] if topic else None, fail)
        return tuple(m for m in markers if m.write_id == self.ident.write_id
                     and (topic is None or (m.topic or topic) == topic))

    def before_send(self) -> None:
        if not self.txn.in_transaction:
            self.txn.begin()  # open() began none: a transaction of this write committed the partition, and this
            # attempt sends what it lacks
        self.txn.sending()

    def locate_error(self, exc: DeliveryError | RecordError) -> str:
        if not isinstance(exc, FatalProducerError):
            return ""
        timed_out = self.txn.timed_out()
        return (f"; {timed_out.strip()}" if timed_out else
                "; under exactly_once this most often means another attempt of this partition (a retry or a "
                "speculative copy) fenced this one: its transaction is aborted and the other attempt's data is the "
                "one that counts")

    def finish(self, commit: Commit | None) -> bool:
        if commit is None:
            self.txn.close()
            return False
        # Between here and commit's return a kill leaves the outcome to the next attempt's init_transactions (it
        # completes a commit under way, or aborts) and its marker read.
        if commit.marker is None or not commit.produced:
            self.txn.abort()  # nothing was sent: no transaction, no new marker
            return False
        self.txn.commit(commit.marker, self.commit_wait_s)
        self.txn.close()
        return True

    def abort(self) -> None:
        self.txn.abort()  # the records stay in the WAL; a re-run under the same id sends them
