"""``delivery.guarantee=exactly_once`` (executor): one Kafka transaction per (write, Spark partition), with a
commit marker inside it.

Every attempt of a partition, on any host, uses the same ``transactional.id``, so ``init_transactions()`` fences an
earlier attempt's producer (a zombie or a speculative twin), aborts its open transaction, or waits until a
commit already under way has completed. The id is ``<prefix><scope>-<partition>``: the scope is a batch write's
write id, and a streaming query's id for all its micro-batches, so a long query keeps one transactional id and
one marker group per partition on the brokers, not one per micro-batch (the coordinator keeps every id for
``transactional.id.expiration.ms``). The marker names the write (for a stream, the micro-batch) it commits.

The transaction carries the data and a **commit marker**: an offset committed for a consumer group of the same name with
``send_offsets_to_transaction`` (the group never consumes; Apache Beam's exactly-once Kafka sink keeps its
progress the same way). Data and marker become visible together or not at all, so after ``init_transactions()``
a retry reads the marker (``require_stable``: pending transactional offsets are waited for) and knows whether
the partition is already in Kafka, whatever host or input order it runs with.

The marker lives in Kafka, not in the WAL: a retry on another host, with no local log, still finds it. The
driver deletes a batch write's markers once Spark has committed it (see ``batch``); a query's markers are
overwritten by each micro-batch and expire with the brokers' ``offsets.retention.minutes`` once it stops.

A marker also names the WAL attempts whose transactions hold the partition's records, and how many records
they hold in all. An attempt commits only after Spark's input ended normally (see ``spark_input``), so a
marker covers a whole partition; should a retry's input hold more records than the marker (a source that
changed), it sends the rest where this host's WAL has the committed attempts' digests, and refuses otherwise.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from recoverable_sink._logging import get_logger
from recoverable_sink.deadlines import MARGIN_S, within
from recoverable_sink.errors import DeadlineExceededError, DeliveryError, transaction_problem
from recoverable_sink.options import SinkOptions, client_config, short_lived
from recoverable_sink.producer.ledger import delivery_timeout_s
from recoverable_sink.producer.marker import Marker
from recoverable_sink.producer.pool import new_producer
from recoverable_sink.producer.protocol import SinkProducer

log = get_logger("transactions")

# How long a new transactional producer waits for a first broker (at most half of init_transactions' time
# limit) before init_transactions is called anyway.
_CONNECT_WAIT_S = 10.0

T = TypeVar("T")


_admins: dict[tuple[tuple[str, str], ...], AdminClient] = {}
_admins_lock = threading.Lock()
_ADMINS_MAX = 4


def _admin(options: SinkOptions) -> AdminClient:
    """An admin client for these connection settings, kept for the process's later calls (a worker's later
    tasks, a driver's later writes): a new client's first request waits for its connection to the cluster, which
    every partition's marker read would pay again (docs/performance.md, "Short-lived clients connect at once")."""
    key = tuple(sorted(client_config(options).items()))
    with _admins_lock:
        admin = _admins.pop(key, None)
        if admin is None:
            admin = AdminClient(dict(key))
        while len(_admins) >= _ADMINS_MAX:  # the least recently used goes
            del _admins[next(iter(_admins))]
        _admins[key] = admin
        return admin


def _init_timeout_s(options: SinkOptions) -> float:
    """How long init_transactions may wait (for the coordinator, or an earlier attempt's commit or abort to
    complete): the delivery timeout, within 10 s .. 2 min, so brokers that are down fail a task as soon as
    its records would."""
    return min(120.0, max(10.0, delivery_timeout_s(options)))


def transactional_id(options: SinkOptions, scope: str, partition: int) -> str:
    """The transactional id of one (scope, partition), also the name of its marker's consumer group; the scope
    is a batch write's id or a streaming query's id (see :attr:`TaskIdentity.transaction_scope`).

    >>> from recoverable_sink.options import parse_options
    >>> o = parse_options({"kafka.bootstrap.servers": "b:9092", "delivery.guarantee": "exactly_once"})
    >>> transactional_id(o, "w1", 3)
    'recoverable-kafka-w1-3'
    """
    return f"{options.transactional_id_prefix}{scope}-{partition}"


def marker_groups(options: SinkOptions, scope: str, partitions: list[int]) -> list[str]:
    return [transactional_id(options, scope, p) for p in partitions]


class PartitionTransaction:
    """The transactional producer of one (write, partition) attempt.

    ``open()`` fences every earlier attempt and answers whether the partition is already committed; if not,
    a transaction is open and ``producer`` sends into it (after a committed one, ``begin()`` opens one for the
    records it missed); ``commit(...)`` adds the marker and commits; ``abort()`` gives up (the records stay in
    the WAL; a re-run sends them under the same id)."""

    def __init__(self, options: SinkOptions, write_id: str, partition: int, where: str,
                 scope: str | None = None, run: str | None = None) -> None:
        self.options = options
        self.write_id = write_id
        self.partition = partition
        self.where = where
        self.run = run
        self.txn_id = transactional_id(options, scope or write_id, partition)
        # A query's micro-batches share the id and marker group: the group then holds one marker per topic it was
        # ever committed for, and only one naming this write counts.
        self.shared = scope is not None and scope != write_id
        self.producer: SinkProducer | None = None
        self.in_transaction = False
        self.marker: Marker | None = None  # the committed marker of this write open() found, if any
        self.first_send: float | None = None  # when the open transaction got its first record (the brokers' clock)
        self.latest_batch: int | None = None  # of the query, as open() found its markers (a stream's only)

    def fail(self, exc: KafkaException, what: str) -> DeliveryError:
        err = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
        text = transaction_problem(err, what, self.txn_id) if err is not None else f"{what} failed: {exc}"
        timed_out = self.timed_out()
        return DeliveryError(f"{self.where}: {timed_out or ''}{self.options.scrub(text)}")

    def timed_out(self) -> str | None:
        """A sentence naming the transaction timeout, when the open transaction has outlived it: the brokers
        then abort it and bump the producer's epoch, which the producer reports as being fenced."""
        if self.first_send is None:
            return None
        limit_ms = int(self.options.producer_config()["transaction.timeout.ms"])
        open_s = time.monotonic() - self.first_send
        if open_s * 1000 < limit_ms:
            return None
        return (f"the transaction was open {open_s:.0f} s, longer than kafka.transaction.timeout.ms={limit_ms}, so "
                "the brokers aborted it on timeout; raise kafka.transaction.timeout.ms (up to the brokers' "
                "transaction.max.timeout.ms) or write smaller partitions (more of them). ")

    def open(self, topic: str | None) -> Marker | None:
        """Fence earlier attempts; return the marker of this write if one of its transactions already committed
        the partition (no transaction is open then), else None with a transaction open.

        With a ``topic`` option, a marker counts only for that topic: a streaming query restarted from its
        checkpoint towards another topic re-sends a re-run batch there, as it would under at_least_once. The latest
        micro-batch the query's markers name is kept in :attr:`latest_batch`, for the resume plan."""
        conf = short_lived({**self.options.producer_config(), "transactional.id": self.txn_id})
        try:
            self.producer = new_producer(conf, self.options.native_producer, client_config(self.options))
            # Connected first, init_transactions finds its coordinator at once instead of 500 ms later (a
            # fixed cost per partition). Not connected in time: init_transactions waits and reports on its own,
            # within what is left of the same time limit.
            limit = _init_timeout_s(self.options)
            started = time.monotonic()
            producer = self.producer
            connect_s = min(_CONNECT_WAIT_S, limit / 2)
            reason = self._within(lambda: producer.connect(connect_s, topic), "connecting", connect_s,
                                  f"half of init_transactions' {limit:.0f} s, from kafka.delivery.timeout.ms",
                                  "a broker's metadata answer")
            if reason is not None:
                log.info("%s: no broker answered yet (%s); init_transactions waits for one", self.where, reason)
            left = limit - (time.monotonic() - started)
            self._within(lambda: producer.init_transactions(left), "init_transactions", left,
                         f"init_transactions' {limit:.0f} s, from kafka.delivery.timeout.ms", self._coordinator)
        except KafkaException as exc:
            # A producer left to the garbage collector would go on asking for a producer id, and once the
            # coordinator answered it would fence the next attempt under the same transactional.id.
            self.close()
            raise self.fail(exc, "init_transactions") from None
        try:
            markers = self.read_markers(topic)
        except BaseException:
            self.close()
            raise
        # The latest micro-batch of the query the group's markers name: a task of an earlier one is a zombie's, which
        # the resume plan makes stand down.
        self.latest_batch = max((m.batch for m in markers if m.batch is not None), default=None) \
            if self.shared else None
        # A marker without a write id (never written so) counts only in a group of this write's own.
        mine = [m for m in markers if (m.write_id or (None if self.shared else self.write_id)) == self.write_id]
        marker = next((m for m in mine if topic is None or (m.topic or topic) == topic), None)
        if marker is None and mine:
            log.info("%s: committed earlier to topic %s, now writing to %s: sending again", self.where,
                     mine[0].topic, topic)
        if marker is not None:
            log.info("%s: a transaction of this write already committed this partition in Kafka (%s)", self.where,
                     marker)
            self.marker = marker
            return marker
        self.begin()
        return None

    def begin(self) -> None:
        assert self.producer is not None
        try:
            self.producer.begin_transaction()
        except KafkaException as exc:
            raise self.fail(exc, "begin_transaction") from None
        self.in_transaction = True
        self.first_send = None

    def sending(self) -> None:
        """Records are about to go into the open transaction: the brokers start its timeout at the first."""
        if self.first_send is None:
            self.first_send = time.monotonic()

    @property
    def committed_records(self) -> int:
        """Records the committed transactions of this partition hold in all (0 without a marker)."""
        return self.marker.records if self.marker is not None else 0

    @property
    def committed_attempts(self) -> tuple[str, ...] | None:
        """The WAL attempt names whose transactions hold the partition (None: a marker without them)."""
        return self.marker.attempts if self.marker is not None else None

    def read_markers(self, topic: str | None = None) -> list[Marker]:
        """The markers committed in this partition's group (one per topic a marker was committed for; with
        ``topic``, that topic's only)."""
        return read_markers(self.options, self.txn_id, [topic] if topic is not None else None, self.fail)

    def commit(self, marker: Marker, timeout_s: float) -> None:
        """Commit the data with the marker (one transaction); the producer has delivered every record. The marker's
        ``records`` and ``attempts`` count every committed transaction of the partition, this one included; its
        ``wal`` is where the attempts' digests are (named in a retry's error when it runs elsewhere), its
        ``fingerprint`` this attempt's whole input's."""
        assert self.producer is not None and marker.topic is not None
        metadata, topic, records = marker.encode(), marker.topic, marker.records
        producer, limit = self.producer, min(timeout_s, self.call_limit_s)
        try:
            self._within(lambda: producer.send_marker(self.txn_id, topic, 0, records, metadata, limit),
                         "send_offsets_to_transaction (the commit marker)", limit, self._bound_by,
                         f"the group coordinator of {self.txn_id}")
            self._within(lambda: producer.commit_transaction(limit), "commit_transaction", limit, self._bound_by,
                         self._coordinator)
            self.in_transaction = False
        except KafkaException as exc:
            raise self.fail(exc, "committing the transaction") from None

    def abort(self) -> None:
        """Best effort: abort the open transaction (a later init_transactions would abort it anyway)."""
        if self.producer is None:
            return
        producer = self.producer
        try:
            if self.in_transaction:
                producer.purge()
                self._within(lambda: producer.abort_transaction(10), "abort_transaction", 10,
                             "abort_transaction's 10 s", self._coordinator)
        except DeadlineExceededError as exc:
            log.warning("%s: %s", self.where, exc)
        except KafkaException as exc:
            log.info("%s: abort_transaction: %s (the next attempt's init_transactions aborts it)", self.where,
                     self.options.scrub(str(exc)))
        finally:
            self.in_transaction = False
            self.close()

    @property
    def _coordinator(self) -> str:
        return f"the transaction coordinator of transactional.id {self.txn_id}"

    @property
    def call_limit_s(self) -> float:
        """How long one transaction call (the marker, the commit) may take: the delivery timeout, and never past the
        transaction timeout, after which the brokers abort the transaction anyway."""
        return min(delivery_timeout_s(self.options),
                   int(self.options.producer_config()["transaction.timeout.ms"]) / 1000)

    @property
    def _bound_by(self) -> str:
        conf = self.options.producer_config()
        return (f"kafka.delivery.timeout.ms={conf.get('delivery.timeout.ms')}, kafka.transaction.timeout.ms="
                f"{conf['transaction.timeout.ms']}")

    def _within(self, call: Callable[[], T], what: str, limit_s: float, bound_by: str, waiting_on: str) -> T:
        """A transaction call under its deadline (:func:`recoverable_sink.deadlines.within`); past it the producer is
        abandoned and this transaction makes no more calls."""
        try:
            return within(call, f"{self.where}: {what}", limit_s, bound_by, waiting_on, handle=self.producer,
                          next_step="the task fails now; Spark retries it, and the retry's init_transactions fences "
                                    "the stuck transaction (the brokers abort it)")
        except DeadlineExceededError:
            self.producer, self.in_transaction = None, False
            raise

    def close(self) -> None:
        if self.producer is not None:
            try:
                self.producer.flush(0)
            except (KafkaException, RuntimeError):
                pass
            self.producer = None


# Coordinator answers that mean "ask again": librdkafka does not flag them retriable, whichever client asks.
_COORDINATOR_BUSY = frozenset({KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_NOT_AVAILABLE,
                               KafkaError.COORDINATOR_LOAD_IN_PROGRESS, KafkaError._WAIT_COORD, KafkaError._TRANSPORT,
                               KafkaError.REQUEST_TIMED_OUT, KafkaError.UNSTABLE_OFFSET_COMMIT, KafkaError._TIMED_OUT})


def group_offsets(options: SinkOptions, group: str, topics: list[str] | None,
                  timeout_s: float) -> list[TopicPartition]:
    """A marker group's committed offsets on partition 0 of each of ``topics`` (None: every topic of the cluster,
    so every marker the group can hold), waiting for pending transactional ones; empty if there are none.
    Coordinator errors (loading, moving, not yet known) are asked again until ``timeout_s``; others are raised.

    Read through a consumer whose group is the marker group (it never subscribes, so it never joins it), with
    read_committed, which asks for stable offsets as ``require_stable`` does. Not through an AdminClient: when
    the answer says the coordinator moved, librdkafka (up to 2.16 at least) dereferences the admin client's
    absent consumer-group state on its main thread and the process dies of SIGSEGV (docs/operations.md,
    "Known librdkafka faults")."""
    deadline = time.monotonic() + timeout_s
    # Short-lived: connected to every broker at once, or its coordinator request waited out half the reconnect
    # backoff in about half the reads (docs/performance.md, "Short-lived clients connect at once").
    consumer = Consumer(short_lived({**client_config(options), "group.id": group, "enable.auto.commit": "false",
                                     "isolation.level": "read_committed"}))
    try:
        while True:
            try:
                if topics is None:
                    topics = [t for t in consumer.list_topics(timeout=max(0.1, deadline - time.monotonic())).topics
                              if not t.startswith("__")]
                if not topics:
                    return []
                got = consumer.committed([TopicPartition(t, 0) for t in topics],
                                         timeout=max(0.1, deadline - time.monotonic()))
                failed = [tp for tp in got if tp.error is not None and
                          tp.error.code() != KafkaError.UNKNOWN_TOPIC_OR_PART]
                if failed:  # an error read as "no marker" would re-send a committed partition
                    raise KafkaException(failed[0].error)
                return [tp for tp in got if tp.offset >= 0]
            except KafkaException as exc:
                err = exc.args[0]
                if err.code() == KafkaError.GROUP_ID_NOT_FOUND:
                    return []
                if not ((err.retriable() or err.code() in _COORDINATOR_BUSY) and time.monotonic() < deadline):
                    raise
                time.sleep(0.2)
    finally:
        consumer.close()


def read_markers(options: SinkOptions, group: str, topics: list[str] | None,
                 fail: Callable[[KafkaException, str], Exception] | None = None) -> list[Marker]:
    """The markers committed in one marker group (one per topic a marker was committed for; ``topics``: only
    those topics' markers)."""
    limit = _init_timeout_s(options)
    try:
        offsets = within(lambda: group_offsets(options, group, topics, limit), f"reading the commit marker of {group}",
                         limit, f"{limit:.0f} s, from kafka.delivery.timeout.ms", f"the group coordinator of {group}")
    except KafkaException as exc:
        if fail is None:
            raise
        raise fail(exc, "reading the commit marker") from None
    return [Marker.parse(tp.metadata) for tp in offsets if tp.offset >= 0]


def delete_markers(options: SinkOptions, groups: list[str]) -> int:
    """Delete commit markers (driver, after Spark committed the write); returns how many were deleted. A
    marker that cannot be deleted expires with the brokers' offsets.retention.minutes (7 days by default)."""
    if not groups:
        return 0
    admin = _admin(options)
    deleted = 0
    for group, future in admin.delete_consumer_groups(groups, request_timeout=30).items():
        try:
            future.result(timeout=30 + MARGIN_S)  # past the request's own timeout: a reply that never came
            deleted += 1
        except concurrent.futures.TimeoutError:
            log.warning("could not delete commit marker group %s: no answer within %g s (it expires with the "
                        "brokers' offsets.retention.minutes)", group, 30 + MARGIN_S)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.GROUP_ID_NOT_FOUND:
                log.warning("could not delete commit marker group %s: %s (it expires with the brokers' "
                            "offsets.retention.minutes)", group, options.scrub(str(exc)))
    return deleted
