"""The proof topic itself: its settings, its creation on the driver where it is missing, and small writes to it
outside any task's producer (the directory, tombstones) with a deadline the sink owns.

Settings, and why: ``cleanup.policy=compact,delete`` (compaction takes what a release tombstoned; time-based retention,
``proof.retentionHours``, takes what nothing released, such as a ``wal.writeId`` write's proof or a killed task's);
``segment.ms`` of one hour and ``segment.bytes`` of 64 MiB (the active segment is never compacted, so a release frees
its proof within about an hour, or sooner where a busy topic fills a segment first);
``min.cleanable.dirty.ratio=0.1`` (the cleaner runs once a tenth of the log is released, keeping the topic near its
live size); ``delete.retention.ms`` of one hour (a tombstone outlives a reader that started before it). A broker that
refuses a setting (some managed services fix them) gets the topic with the two that matter, the policy and the
retention, and the driver says which it could not set.
"""

from __future__ import annotations

import concurrent.futures
import time

from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, ResourceType

from recoverable_sink._logging import get_logger
from recoverable_sink.deadlines import MARGIN_S
from recoverable_sink.errors import OptionError
from recoverable_sink.options import KafkaProof, SinkOptions, short_lived
from recoverable_sink.producer.topics import missing_operations, says_missing

log = get_logger("proof")

_HOUR_MS = 3_600_000
_SEGMENT_BYTES = 64 * 2**20


def topic_configs(proof: KafkaProof) -> dict[str, str]:
    """The proof topic's settings (see the module's docstring)."""
    return {"cleanup.policy": "compact,delete", "retention.ms": str(int(proof.retention_hours * _HOUR_MS)),
            "segment.ms": str(_HOUR_MS), "segment.bytes": str(_SEGMENT_BYTES), "min.cleanable.dirty.ratio": "0.1",
            "delete.retention.ms": str(_HOUR_MS)}


_ESSENTIAL = ("cleanup.policy", "retention.ms")


def ensure_topic(options: SinkOptions, admin: AdminClient, proof: KafkaProof) -> int:
    """The proof topic's partition count, creating it first where it is missing; an OptionError names what to grant
    or create where that is refused."""
    timeout_s = options.preflight_timeout_s
    count = _partitions(admin, proof.topic, timeout_s)
    if count is not None:
        _check_allowed(admin, proof, timeout_s)
        _check_policy(admin, proof, timeout_s)
        return count
    for configs in (topic_configs(proof), {k: topic_configs(proof)[k] for k in _ESSENTIAL}):
        new = NewTopic(proof.topic, num_partitions=proof.partitions, replication_factor=proof.replication,
                       config=configs)
        try:
            admin.create_topics([new], request_timeout=timeout_s)[proof.topic].result(timeout=timeout_s + MARGIN_S)
        except KafkaException as exc:
            err = exc.args[0]
            if err.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                break  # another driver created it meanwhile
            if err.code() in (KafkaError.INVALID_CONFIG, KafkaError.POLICY_VIOLATION) and len(configs) > 2:
                log.warning("the brokers refused some of the proof topic's settings (%s); creating %s with "
                            "cleanup.policy and retention.ms only", err.str(), proof.topic)
                continue
            raise OptionError(_refused(options, proof, err)) from None
        except concurrent.futures.TimeoutError:
            raise OptionError(f"creating the proof topic {proof.topic} got no answer within {timeout_s + MARGIN_S:g} "
                              "s (preflight.timeoutMs): check the brokers") from None
        log.info("created the proof topic %s (%d partitions, %s)", proof.topic, proof.partitions,
                 ", ".join(f"{k}={v}" for k, v in configs.items()))
        break
    # A topic just created reaches the brokers' metadata a moment later: poll for it within the preflight deadline.
    deadline = time.monotonic() + timeout_s
    while (count := _partitions(admin, proof.topic, timeout_s)) is None:
        if time.monotonic() >= deadline:
            raise OptionError(f"the proof topic {proof.topic} was created but the brokers did not list it within "
                              f"{timeout_s:g} s (preflight.timeoutMs): check the brokers, then try again")
        time.sleep(0.1)
    return count


def _refused(options: SinkOptions, proof: KafkaProof, err: KafkaError) -> str:
    settings = ", ".join(f"{k}={v}" for k, v in topic_configs(proof).items())
    what = (f"grant this principal CREATE on topic {proof.topic} (or on the cluster)"
            if err.code() in (KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.CLUSTER_AUTHORIZATION_FAILED)
            else "check the brokers' answer above")
    return (f"the proof topic {proof.topic} does not exist and could not be created ({options.scrub(err.str())}): "
            f"{what}, or create it with {proof.partitions} partitions and {settings}; or set proof.kafka=false, "
            "which keeps proof of delivery only in the executors' WALs (a retry or re-run elsewhere then repeats "
            "what was delivered)")


def _partitions(admin: AdminClient, topic: str, timeout_s: float) -> int | None:
    meta = admin.list_topics(topic, timeout=timeout_s)
    found = meta.topics.get(topic)
    if found is None or (found.error is not None and says_missing(found.error)):
        return None
    if found.error is not None:
        raise OptionError(f"the proof topic {topic}'s metadata could not be read ({found.error.str()}): grant this "
                          f"principal READ and WRITE on topic {topic} (kafka-acls --add --allow-principal User:<name> "
                          f"--operation Read --operation Write --topic {topic}), or set proof.kafka=false, which keeps "
                          "proof of delivery only in the executors' WALs")
    return len(found.partitions)


def _check_allowed(admin: AdminClient, proof: KafkaProof, timeout_s: float) -> None:
    """Under an authorizer, the principal must READ and WRITE the proof topic (KIP-430's authorized operations),
    asked here rather than learnt from a task that sent its records and then could not prove them."""
    from confluent_kafka import TopicCollection
    from confluent_kafka.admin import AclOperation

    try:
        described = admin.describe_topics(TopicCollection([proof.topic]), include_authorized_operations=True,
                                          request_timeout=timeout_s)[proof.topic].result(timeout=timeout_s + MARGIN_S)
    except (KafkaException, ValueError, concurrent.futures.TimeoutError) as exc:
        log.info("could not read the operations allowed on the proof topic %s (%s); the brokers still enforce them",
                 proof.topic, exc)
        return
    allowed = described.authorized_operations
    missing = [op.name for op in missing_operations(allowed, (AclOperation.READ, AclOperation.WRITE))]
    if missing:
        raise OptionError(
            f"the brokers do not allow this principal to {' and '.join(missing)} the proof topic {proof.topic} "
            f"(allowed: {', '.join(sorted(op.name for op in allowed))}); grant it (kafka-acls --add --allow-principal "
            f"User:<name> {' '.join('--operation ' + m.title() for m in missing)} --topic {proof.topic}), or set "
            "proof.kafka=false, which keeps proof of delivery only in the executors' WALs (a retry or re-run on "
            "another host then repeats what was delivered)")


def _check_policy(admin: AdminClient, proof: KafkaProof, timeout_s: float) -> None:
    """A proof topic made elsewhere: say so where its cleanup policy will not free released proof."""
    resource = ConfigResource(ResourceType.TOPIC, proof.topic)
    try:
        config = admin.describe_configs([resource], request_timeout=timeout_s)[resource].result(
            timeout=timeout_s + MARGIN_S)
    except (KafkaException, concurrent.futures.TimeoutError):
        return  # DESCRIBE_CONFIGS not granted: nothing to say
    policy = config.get("cleanup.policy")
    if policy is not None and "compact" not in (policy.value or ""):
        log.warning("the proof topic %s has cleanup.policy=%s: released proof then stays until its retention.ms; "
                    "compact,delete keeps it near its live size", proof.topic, policy.value)


def produce(options: SinkOptions, proof: KafkaProof, records: list[tuple[int, bytes, bytes | None]],
            what: str) -> None:
    """Write records (partition, key, value; None for a tombstone) to the proof topic and wait until each is
    acknowledged, within the delivery timeout plus a margin; a failure raises naming ``what``."""
    if not records:
        return
    from recoverable_sink.producer.ledger import delivery_timeout_s

    # Not idempotent: an idempotent producer asks for a producer id as it starts and, no broker connected yet, asks
    # again only 500 ms later, a fixed cost on every write's directory entry and release. These records are keyed and
    # compacted, a repeat of one changes nothing, and one request in flight keeps their order.
    conf = short_lived({**options.producer_config(), "linger.ms": "5", "enable.idempotence": "false",
                        "max.in.flight.requests.per.connection": "1"})
    conf.pop("transactional.id", None)
    from recoverable_sink.producer.client_log import ClientLogger, RepeatSummary

    logs = RepeatSummary()
    producer = Producer({**conf, "logger": ClientLogger(logs)})
    failed: list[KafkaError] = []

    def report(err: KafkaError | None, _msg: object) -> None:
        if err is not None:
            failed.append(err)

    limit = delivery_timeout_s(options) + MARGIN_S
    deadline = time.monotonic() + limit
    try:
        for partition, key, value in records:
            while True:
                try:
                    producer.produce(proof.topic, value=value, key=key, partition=partition, on_delivery=report)
                    break
                except BufferError:
                    producer.poll(0.05)
        while len(producer) and time.monotonic() < deadline:
            producer.flush(min(1.0, max(0.0, deadline - time.monotonic())))
        left = len(producer)
    finally:
        logs.flush()
        producer.purge()
        producer.flush(0)
    if failed or left:
        cause = options.scrub(failed[0].str()) if failed else f"{left} not acknowledged within {limit:.0f} s"
        raise KafkaException(KafkaError(KafkaError._FAIL, f"writing {what} to the proof topic {proof.topic}: "
                                                          f"{cause}"))
