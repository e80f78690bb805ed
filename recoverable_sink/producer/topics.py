"""A topic that does not exist (driver, and tasks for a ``topic`` column): created as the brokers would auto-create it
for Spark's ``format("kafka")``, where they do.

Spark's sink writes through the Java producer, whose metadata request lets a broker with
``auto.create.topics.enable=true`` (Apache Kafka's default) create a missing topic with the broker's
``num.partitions`` and ``default.replication.factor``. librdkafka's metadata request does not, so the sink asks the
brokers whether they auto-create and, if they do, creates the topic with those defaults (CreateTopics with -1 for
both, KIP-464), or with the partitions, replication factor and topic configs of the ``topic.creation.default.*``
options (Kafka Connect's names). Where they do not, the write fails with the reason; ``topic.mustExist=true`` fails it
in any case, for users who want a misspelt topic caught.
"""

from __future__ import annotations

import time
from typing import TypeGuard

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AclOperation, AdminClient, ConfigResource, NewTopic, ResourceType

from recoverable_sink._logging import get_logger
from recoverable_sink.deadlines import MARGIN_S
from recoverable_sink.options import TOPIC_CREATION_PREFIX, SinkOptions, TopicCreation, client_config

log = get_logger("topics")


def missing_operations(allowed: list[AclOperation] | None,
                       required: tuple[AclOperation, ...]) -> list[AclOperation]:
    """Of ``required``, what a topic's authorized operations (KIP-430) lack: none where the brokers did not say (no
    authorizer, or an older broker) or allow ALL."""
    if not allowed or AclOperation.ALL in allowed:
        return []
    return [op for op in required if op not in allowed]


def says_missing(err: object) -> TypeGuard[KafkaError]:
    """Whether a client's error is the cluster's answer that a topic does not exist (not a time-out, not a refusal
    to describe it): only that answer lets the sink create the topic, or route its records as dead letters."""
    return isinstance(err, KafkaError) and err.code() in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC)


# The brokers' answers that refuse how a topic would be made (not the name, not the principal's rights).
_REFUSED_SETTINGS = {KafkaError.INVALID_CONFIG: None, KafkaError.POLICY_VIOLATION: None,
                     KafkaError.INVALID_PARTITIONS: "partitions", KafkaError.INVALID_REPLICATION_FACTOR:
                     "replication.factor", KafkaError.INVALID_REPLICA_ASSIGNMENT: "replication.factor"}


def refused_setting(err: KafkaError, how: TopicCreation) -> str | None:
    """The ``topic.creation.default.*`` option a CreateTopics error refuses (the options in general where the brokers'
    message names none of them); None if the error is not about how the topic is made."""
    if how.brokers_defaults or err.code() not in _REFUSED_SETTINGS:
        return None
    named = _REFUSED_SETTINGS[err.code()] or next((k for k, _ in how.configs if k in err.str()), None)
    return f"{TOPIC_CREATION_PREFIX}{named}" if named else f"the {TOPIC_CREATION_PREFIX}* options"


def new_topic(topic: str, how: TopicCreation) -> NewTopic:
    """The CreateTopics entry for ``topic`` made as ``how`` says (-1: the brokers' default, KIP-464)."""
    return NewTopic(topic, num_partitions=how.partitions, replication_factor=how.replication_factor,
                    config=dict(how.configs))


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
    how = options.topic_creation
    try:
        admin.create_topics([new_topic(topic, how)], request_timeout=timeout_s)[topic].result(timeout=wait_s)
        log.info("topic %s did not exist: created with %s, as the brokers' auto-creation would create it%s "
                 "(topic.mustExist=true refuses a missing topic instead)", topic, how.describe(),
                 "" if how.brokers_defaults else " with the topic.creation.default.* options")
    except KafkaException as exc:
        err = exc.args[0]
        if err.code() != KafkaError.TOPIC_ALREADY_EXISTS:
            setting = refused_setting(err, how)
            if setting is not None:
                return f"the brokers refuse to create it as {setting} says ({options.scrub(err.str())}); fix that"
            return f"creating it failed ({options.scrub(err.str())})"
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
