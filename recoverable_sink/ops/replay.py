"""Replay, without Spark: finish a failed at_least_once write from this host's WAL. It decides what to resend
(what the newest fully logged attempt of a partition logged and no attempt got acknowledged), refuses what it
cannot finish safely (partitions only partly logged here or missing, exactly_once writes), sends through a
producer and records the acknowledgements in the WAL. Imports no pyspark (the CLI runs it)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from recoverable_sink._logging import get_logger
from recoverable_sink.errors import DeliveryError, RecoverableSinkError
from recoverable_sink.identity import split
from recoverable_sink.options import client_config, parse_options
from recoverable_sink.producer.ledger import Ledger, delivery_timeout_s
from recoverable_sink.producer.pool import producers
from recoverable_sink.producer.protocol import SinkProducer
from recoverable_sink.wal import DONE, LOGGED, AttemptInfo, Wal

log = get_logger("replay")

ProgressFn = Callable[[int, int], None]  # (records done, records in all) of one partition


@dataclass
class ReplayCounts:
    records: int = 0  # records the chosen attempt logged
    sent: int = 0  # sent by this replay
    already_delivered: int = 0  # acknowledged to some attempt before

    def add(self, other: ReplayCounts) -> None:
        for k, v in asdict(other).items():
            setattr(self, k, getattr(self, k) + v)


@dataclass
class ReplayResult:
    """What :func:`replay_write` did: partitions of the write found in this WAL, the sums of their counts, and
    the refusals, each a sentence naming the partitions and what to do instead."""

    write_id: str
    partitions: int
    total: ReplayCounts = field(default_factory=ReplayCounts)
    refused: list[str] = field(default_factory=list)


class NotFullyLogged(RecoverableSinkError):
    """A partition's input never fully reached this WAL; replaying it would leave a hole."""


class OtherCluster(RecoverableSinkError):
    """The brokers named are not the cluster the write was sent to."""


def cluster_id_of(kafka: dict[str, str], timeout_s: float = 30.0) -> str:
    """The id of the cluster that ``kafka``'s bootstrap servers belong to."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    options = parse_options(kafka)
    try:
        # A copy: confluent-kafka's stub asks for a dict of any config value type, which a dict[str, str] is not.
        cluster_id = AdminClient({**client_config(options)}).list_topics(timeout=timeout_s).cluster_id
    except KafkaException as exc:
        raise DeliveryError(f"replay: the brokers {options.bootstrap_servers} did not answer: "
                            f"{options.scrub(str(exc))}") from None
    if not cluster_id:
        raise DeliveryError(f"replay: the brokers {options.bootstrap_servers} reported no cluster id")
    return str(cluster_id)


def check_cluster(write_id: str, attempts: list[AttemptInfo], target: str, allow_other: bool) -> bool:
    """Whether the replay may record what it sends as delivered: only towards the cluster the write's attempts
    were sent to, since their proof of delivery is that cluster's. Another cluster is refused (naming both ids)
    unless ``allow_other``; then records are sent there but nothing is recorded, so that a re-run against the
    write's own cluster still sends them."""
    written = sorted({a.cluster_id for a in attempts if a.cluster_id})
    if not written or written == [target]:
        return True
    if not allow_other:
        raise OtherCluster(
            f"write {write_id} was sent to Kafka cluster {', '.join(written)}, but the brokers named are cluster "
            f"{target}: replaying there would mark records delivered that the write's cluster never got. Name that "
            "cluster's brokers, or pass --allow-other-cluster to copy the records there without counting them as "
            "delivered (a re-run against the write's own cluster still sends them)")
    log.warning("write %s was sent to Kafka cluster %s; replaying to cluster %s as asked (--allow-other-cluster): "
                "nothing is recorded as delivered", write_id, ", ".join(written), target)
    return False


def replay_partition(wal: Wal, attempts: list[AttemptInfo], kafka: dict[str, str],
                     producer: SinkProducer | None = None,
                     progress: ProgressFn | None = None, record: bool = True) -> ReplayCounts:
    """Finish one partition from the newest attempt that logged its whole input: send what that attempt logged
    and no attempt got acknowledged (later attempts' acknowledgements count too, by record digest). Without
    ``record`` (another cluster than the write's) nothing is recorded in the WAL."""
    chosen = next((i for i in range(len(attempts) - 1, -1, -1) if attempts[i].state in (LOGGED, DONE)), None)
    if chosen is None:
        a = attempts[-1]
        raise NotFullyLogged(
            f"partition {a.partition} of write {a.write_id}: no attempt logged its whole input here "
            f"({len(attempts)} partial attempt(s)); replaying would leave a hole. Re-run the write with "
            f".option('wal.writeId', '{a.write_id}') instead: it sends only what was never acknowledged"
        )
    attempt, later = attempts[chosen], attempts[chosen + 1:]
    if any(a.exactly_once for a in attempts):
        # Its acknowledgements may belong to an aborted transaction, and a replay outside the partition's
        # transactional id would not be fenced nor leave a marker.
        raise NotFullyLogged(
            f"partition {attempt.partition} of write {attempt.write_id} was written with "
            "delivery.guarantee=exactly_once: replay cannot keep that promise; re-run the write with "
            f".option('wal.writeId', '{attempt.write_id}') and the same transactional.id.prefix instead"
        )
    options = parse_options(kafka)
    total = wal.record_count(attempt.key) if progress is not None else 0
    producer = producer if producer is not None else producers.get(options)
    acked_later = wal.delivered([a.key for a in later])
    counts = ReplayCounts()
    ledger = Ledger(producer, options.scrub)
    topic = attempt.topic
    for seg in wal.segments(attempt.key):
        counts.records += seg.count
        if seg.batch is None:  # every record acknowledged
            counts.already_delivered += seg.count
            if progress is not None:
                progress(counts.records, total)
            continue
        matched = acked_later.take(d for d, a in zip(split(seg.digests), seg.acked, strict=True) if not a)
        it = iter(matched.skip)
        skip = [bool(a) or next(it) for a in seg.acked]
        sent = ledger.send(seg.batch, topic, seg.first, skip)
        counts.sent += sent
        counts.already_delivered += seg.count - sent
        ledger.wait_for_acks(delivery_timeout_s(options) + 30)
        dirty = ledger.take_changes()
        if record:
            wal.save_acks(attempt.key, dirty)
        if progress is not None:
            progress(counts.records, total)
    if ledger.failed or ledger.outstanding:
        raise DeliveryError(f"replay of partition {attempt.partition} of write {attempt.write_id}: "
                            f"{options.scrub(ledger.first_error() or 'records unacknowledged')}; "
                            "the WAL keeps them, run replay again")
    if record:
        wal.finish(attempt.key, [a.key for a in attempts if a.key != attempt.key])
    return counts


def replay_write(wal: Wal, write_id: str, attempts: list[AttemptInfo], kafka: dict[str, str],
                 expected_partitions: int | None = None,
                 progress: Callable[[int], ProgressFn | None] | None = None,
                 on_partition: Callable[[int, ReplayCounts], None] | None = None,
                 target_cluster: str | None = None, allow_other_cluster: bool = False) -> ReplayResult:
    """Replay every partition of ``write_id`` whose attempts (``attempts``, all of this write in ``wal``) are
    here, in partition order. A partition that cannot be finished safely is refused, not raised; with
    ``expected_partitions`` (the write's partition count) those missing here are refused too.

    ``kafka``: the write's ``kafka.*`` options. ``progress(partition)`` gives the progress callback of a
    partition; ``on_partition(partition, counts)`` is told each partition replayed. A failed delivery raises
    :class:`DeliveryError` (the WAL keeps what was not acknowledged). ``target_cluster``: the id of the cluster
    the brokers belong to (asked of them when None); another cluster than the write's is refused before anything
    is sent (:class:`OtherCluster`) unless ``allow_other_cluster``."""
    record = check_cluster(write_id, attempts, target_cluster or cluster_id_of(kafka), allow_other_cluster) \
        if attempts else True
    by_partition: dict[int, list[AttemptInfo]] = defaultdict(list)
    for a in attempts:
        by_partition[a.partition].append(a)
    result = ReplayResult(write_id=write_id, partitions=len(by_partition))
    for partition in sorted(by_partition):
        try:
            counts = replay_partition(wal, by_partition[partition], kafka,
                                      progress=progress(partition) if progress is not None else None, record=record)
        except NotFullyLogged as exc:
            result.refused.append(str(exc))
            continue
        if on_partition is not None:
            on_partition(partition, counts)
        result.total.add(counts)
    missing = sorted(set(range(expected_partitions)) - set(by_partition)) if expected_partitions else []
    if missing:
        result.refused.append(f"partitions {missing} of write {write_id} are not in {wal.path}: they ran on "
                              "another host or never started; re-run the write with the same wal.writeId")
    return result
