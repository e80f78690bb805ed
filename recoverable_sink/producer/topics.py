"""A topic that does not exist (driver, and tasks for a ``topic`` column): created as the brokers would auto-create it
for Spark's ``format("kafka")``, where they do.

Spark's sink writes through the Java producer, whose metadata request lets a broker with
``auto.create.topics.enable=true`` (Apache Kafka's default) create a missing topic with the broker's
``num.partitions`` and ``default.replication.factor``. librdkafka's metadata request does not, so the sink asks the
brokers whether they auto-create and, if they do, creates the topic with those defaults (CreateTopics with -1 for
both, KIP-464). Where they do not, the write fails with the reason; ``topic.mustExist=true`` fails it in any case,
for users who want a misspelt topic caught.
"""

from __future__ import annotations

import time
from typing import TypeGuard

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, ResourceType

from recoverable_sink._logging import get_logger
from recoverable_sink.deadlines import MARGIN_S
from recoverable_sink.options import SinkOptions, client_config

log = get_logger("topics")


def says_missing(err: object) -> TypeGuard[KafkaError]:
    """Whether a client's error is the cluster's answer that a topic does not exist (not a time-out, not a refusal
    to describe it): only that answer lets the sink create the topic, or route its records as dead letters."""
    return isinstance(err, KafkaError) and err.code() in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC)


def create_as_brokers_would(options: SinkOptions, topic: str, timeout_s: float) -> str | None:
    """Create ``topic`` with the brokers' defaults if they auto-create topics: None once it exists with leaders, else
    why it was not created (the brokers do not auto-create, or refused), for the caller's error."""
    # A copy: confluent-kafka's stub asks for a dict of any config value type, which a dict[str, str] is not.
    admin = AdminClient({**client_config(options)})
    wait_s = timeout_s + MARGIN_S  # past the requests' own timeouts: an answer that never came
    try:
        brokers = sorted(admin.list_topics(timeout=timeout_s).brokers)
        resource = ConfigResource(ResourceType.BROKER, str(brokers[0]))
        entry = admin.describe_configs([resource], request_timeout=timeout_s)[resource].result(timeout=wait_s) \
            .get("auto.create.topics.enable")
    except (KafkaException, IndexError, TimeoutError) as exc:
        return f"whether the brokers auto-create topics could not be read ({options.scrub(str(exc))})"
    if entry is None or str(entry.value).lower() != "true":
        return "the brokers do not auto-create topics (auto.create.topics.enable=false)"
    try:
        admin.create_topics([NewTopic(topic, num_partitions=-1, replication_factor=-1)],
                            request_timeout=timeout_s)[topic].result(timeout=wait_s)
        log.info("topic %s did not exist: created with the brokers' defaults, as their auto-creation would "
                 "(topic.mustExist=true refuses a missing topic instead)", topic)
    except KafkaException as exc:
        if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
            return f"creating it failed ({options.scrub(exc.args[0].str())})"
    except TimeoutError:
        return f"creating it got no answer within {wait_s:g} s"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:  # created: every partition has a leader before the first record goes
        meta = admin.list_topics(topic, timeout=max(0.1, deadline - time.monotonic())).topics.get(topic)
        if meta is not None and meta.error is None and meta.partitions and \
                all(p.leader >= 0 for p in meta.partitions.values()):
            return None
        time.sleep(0.1)
    return f"it was created but had no leader within {timeout_s:g} s"


def max_message_bytes(options: SinkOptions, topic: str, timeout_s: float) -> int | None:
    """A topic's ``max.message.bytes`` (None where it cannot be read: the brokers still enforce it, and a record they
    refuse fails its task with their error)."""
    resource = ConfigResource(ResourceType.TOPIC, topic)
    admin = AdminClient({**client_config(options)})
    try:
        config = admin.describe_configs([resource], request_timeout=timeout_s)[resource].result(
            timeout=timeout_s + MARGIN_S)
        entry = config.get("max.message.bytes")
        return int(entry.value) if entry is not None and entry.value is not None else None
    except (KafkaException, ValueError, TimeoutError) as exc:
        log.info("could not read topic %s's max.message.bytes (%s); the brokers still enforce it", topic,
                 options.scrub(str(exc)))
        return None
