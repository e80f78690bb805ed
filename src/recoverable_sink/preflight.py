"""Checks made on the driver before any task runs: the producer configuration is one librdkafka accepts,
the brokers answer, and the ``topic`` option names a topic that exists."""

from __future__ import annotations

import re

from confluent_kafka import KafkaException, Producer

from recoverable_sink._logging import get_logger
from recoverable_sink.errors import OptionError, transaction_problem
from recoverable_sink.options import SinkOptions

log = get_logger("preflight")

_PROPERTY = re.compile(r"""property:? ["']?([\w.]+)""")
# librdkafka names a property by its canonical name; users often write the alias (the Java client's name).
_ALIASES = {
    "queue.buffering.max.ms": "linger.ms",
    "message.timeout.ms": "delivery.timeout.ms",
    "message.send.max.retries": "retries",
    "max.in.flight.requests.per.connection": "max.in.flight",
    "compression.codec": "compression.type",
    "request.required.acks": "acks",
    "metadata.broker.list": "bootstrap.servers",
}


def _option_name(property_name: str, options: SinkOptions) -> str:
    """The user's own ``kafka.*`` spelling of a property librdkafka complained about."""
    conf = options.producer_config()
    for name in (property_name, _ALIASES.get(property_name, "")):
        if name and name in conf:
            return f"kafka.{name}"
    return f"kafka.{property_name}"


def check_cluster(options: SinkOptions) -> str:
    """Raise an OptionError naming the option at fault if a task could not possibly succeed; return the
    cluster id, part of every record's delivery identity (a write to another cluster never matches)."""
    try:
        producer = Producer(options.producer_config())
    except KafkaException as exc:
        text = options.scrub(exc.args[0].str() if exc.args else str(exc))
        m = _PROPERTY.search(text)
        name = _option_name(m.group(1), options) if m else "a kafka.* option"
        raise OptionError(f"{name} is not valid for the producer (librdkafka): {text}; fix or remove it") from None
    try:
        try:
            metadata = producer.list_topics(options.topic, timeout=options.preflight_timeout_s)
        except KafkaException as exc:
            raise OptionError(
                f"cannot reach kafka.bootstrap.servers={options.bootstrap_servers} within "
                f"{options.preflight_timeout_s:g}s ({options.scrub(str(exc.args[0].str()))}); check the address, "
                "that the brokers are up and the kafka.security.* settings (preflight.timeoutMs sets the wait)"
            ) from None
        if options.topic is not None:
            topic = metadata.topics.get(options.topic)
            if topic is None or topic.error is not None:
                reason = topic.error.str() if topic is not None and topic.error is not None else "not in metadata"
                raise OptionError(
                    f"option topic={options.topic}: the topic does not exist or is not accessible ({reason}); "
                    "create it first (the sink does not rely on broker auto-creation)"
                )
        if not metadata.cluster_id:
            raise OptionError(f"kafka.bootstrap.servers={options.bootstrap_servers} did not report a cluster id; "
                              "the sink needs Kafka 0.10.1 or later")
        return metadata.cluster_id
    finally:
        producer.flush(0)


_LIBRDKAFKA_BATCH_SIZE = 1_000_000  # librdkafka's default batch.size; the Java client's is 16384


def fit_topic_limit(options: SinkOptions) -> SinkOptions:
    """Read the ``topic`` option's ``max.message.bytes`` so that tasks refuse a record the broker would refuse
    before it enters the WAL, and keep librdkafka's batches within it: its default ``batch.size`` (1 MB, the
    Java client's is 16 KB) makes every batch to a topic with a smaller limit fail as MSG_SIZE_TOO_LARGE.
    Without a ``topic`` option, or without the right to describe the topic's configuration, the options come
    back unchanged (the broker still refuses what is too large, and the WAL keeps it)."""
    from dataclasses import replace

    from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

    from recoverable_sink.options import client_config

    if options.topic is None:
        return options
    resource = ConfigResource(ResourceType.TOPIC, options.topic)
    try:
        admin = AdminClient(client_config(options))
        entry = admin.describe_configs([resource], request_timeout=options.preflight_timeout_s)[resource] \
            .result().get("max.message.bytes")
        limit = int(entry.value) if entry is not None and entry.value is not None else None
    except (KafkaException, ValueError) as exc:
        log.info("could not read topic %s's max.message.bytes (%s); the brokers still enforce it", options.topic,
                 options.scrub(str(exc)))
        return options
    if limit is None:
        return options
    conf = options.producer_config()
    if "batch.size" in conf:
        if int(conf["batch.size"]) > limit:
            raise OptionError(
                f"option kafka.batch.size={conf['batch.size']} exceeds topic {options.topic}'s max.message.bytes="
                f"{limit}: the broker would refuse every full batch; set kafka.batch.size to at most {limit}")
        return replace(options, topic_max_message_bytes=limit)
    extra: tuple[tuple[str, str], ...] = ()
    if limit < _LIBRDKAFKA_BATCH_SIZE:
        extra = (("batch.size", str(limit)),)
        log.info("topic %s has max.message.bytes=%d: the producer's batch.size is set to it (librdkafka's default "
                 "is %d)", options.topic, limit, _LIBRDKAFKA_BATCH_SIZE)
    return replace(options, producer_items=options.producer_items + extra, topic_max_message_bytes=limit)


def check_transactions(options: SinkOptions) -> None:
    """For delivery.guarantee=exactly_once: the brokers run transactions, this principal may use the sink's
    transactional ids and marker groups, and kafka.transaction.timeout.ms is within the brokers' maximum.
    Each is an OptionError naming what to change, raised before any task starts."""
    from confluent_kafka import ConsumerGroupTopicPartitions, KafkaError
    from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

    from recoverable_sink.options import client_config

    timeout_s = options.preflight_timeout_s
    asked_ms = int(options.producer_config()["transaction.timeout.ms"])
    admin = AdminClient(client_config(options))
    brokers = list(admin.list_topics(timeout=timeout_s).brokers)
    try:
        resource = ConfigResource(ResourceType.BROKER, str(brokers[0]))
        configs = admin.describe_configs([resource], request_timeout=timeout_s)[resource].result()
        entry = configs.get("transaction.max.timeout.ms")
        broker_max = int(entry.value) if entry is not None and entry.value is not None else None
    except (KafkaException, IndexError) as exc:  # no DESCRIBE_CONFIGS right: init_transactions will tell
        broker_max = None
        log.info("could not read the brokers' transaction.max.timeout.ms (%s); init_transactions checks it",
                 options.scrub(str(exc)))
    if broker_max is not None and asked_ms > broker_max:
        raise OptionError(
            f"option kafka.transaction.timeout.ms={asked_ms} exceeds the brokers' transaction.max.timeout.ms="
            f"{broker_max}: a partition's transaction must commit within it; lower the option (and write smaller "
            "partitions), or raise the brokers' maximum")

    # A probe transactional id and marker group under the same prefix: ACLs and the coordinator, on the driver.
    probe = f"{options.transactional_id_prefix}preflight"
    producer: Producer | None = None
    try:
        producer = Producer({**options.producer_config(), "transactional.id": probe})
        producer.init_transactions(timeout_s)
    except KafkaException as exc:
        problem = transaction_problem(exc.args[0], "init_transactions", probe)
        raise OptionError(f"delivery.guarantee=exactly_once: {options.scrub(problem)}") from None
    finally:
        if producer is not None:
            producer.flush(0)
    try:
        admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(probe)],
                                          request_timeout=timeout_s)[probe].result()
    except KafkaException as exc:
        if exc.args[0].code() != KafkaError.GROUP_ID_NOT_FOUND:
            problem = transaction_problem(exc.args[0], "reading the commit marker group", probe)
            raise OptionError(f"delivery.guarantee=exactly_once: {options.scrub(problem)}") from None
