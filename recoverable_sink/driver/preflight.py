"""Checks made on the driver before any task runs: the producer configuration is one librdkafka accepts, the
brokers answer and accept the credentials and the CA, the ``topic`` option names a topic that exists and that
this principal may write, librdkafka's batches fit the topic's ``max.message.bytes``, the brokers accept the
``topic.creation.default.*`` options, and (exactly_once) the transaction coordinator, ACLs and timeout allow
transactions."""

from __future__ import annotations

import logging
import re
import socket
import time
import uuid
from contextlib import suppress

from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, ClusterMetadata

from recoverable_sink._logging import get_logger
from recoverable_sink.deadlines import within
from recoverable_sink.errors import OptionError, transaction_problem
from recoverable_sink.option_names import suggest_kafka
from recoverable_sink.options import DEFAULT_BATCH_SIZE, DeadLetterTopic, SinkOptions, client_config, short_lived
from recoverable_sink.producer.topics import (
    create_as_brokers_would,
    missing_operations,
    new_topic,
    refused_setting,
    says_missing,
)

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


class _ProbeLog:
    """librdkafka's log lines of a probe producer, at DEBUG: a broker that cannot be reached would otherwise
    print a line per connection attempt on the driver's stderr before the OptionError that says what to check.
    Set RECOVERABLE_KAFKA_LOG_LEVEL=DEBUG to see them."""

    def log(self, level: int, fmt: str, *args: object) -> None:  # confluent-kafka's ``logger`` interface
        log.debug("librdkafka (%s): %s", logging.getLevelName(level), fmt % args if args else fmt)


def _probe_config(options: SinkOptions, **extra: object) -> dict[str, object]:
    """A probe producer's configuration: the tasks' own, connected to every broker at once, logging quietly."""
    return short_lived({**options.producer_config(), "logger": _ProbeLog(), **extra})


def _probe_admin(options: SinkOptions) -> AdminClient:
    """A new admin client for one write's checks, connected to every broker at once, logging quietly. Not the
    one a Python process keeps for the tasks' marker reads: with it, the re-run that recovers from a broker that
    died during a write (and stayed down past delivery.timeout.ms) timed out reading the commit-marker group
    (the chaos suite's scenario 5 under exactly_once, twice of two)."""
    return AdminClient(short_lived({**client_config(options), "logger": _ProbeLog()}))


class TopicQuestions:
    """The driver's two questions about the ``topic`` option, sent at once on one admin client: which
    operations this principal may perform on it (KIP-430) and its ``max.message.bytes``. Sent together before
    the probe producer's metadata request, they are answered while it is awaited (:func:`check_cluster`;
    docs/performance.md, "The driver's checks at once")."""

    def __init__(self, options: SinkOptions) -> None:
        from confluent_kafka import TopicCollection
        from confluent_kafka.admin import ConfigResource, ResourceType

        assert options.topic is not None
        timeout_s = options.preflight_timeout_s
        self.admin = _probe_admin(options)
        resource = ConfigResource(ResourceType.TOPIC, options.topic)
        self.operations = self.admin.describe_topics(TopicCollection([options.topic]),
                                                     include_authorized_operations=True,
                                                     request_timeout=timeout_s)[options.topic]
        self.config = self.admin.describe_configs([resource], request_timeout=timeout_s)[resource]

    @classmethod
    def ask(cls, options: SinkOptions) -> TopicQuestions | None:
        """The questions on their way; None without a ``topic`` option, or when they cannot be sent (an invalid
        ``kafka.*`` option: the probe producer then names it; otherwise each check asks again and logs why)."""
        if options.topic is None:
            return None
        try:
            return cls(options)
        except (KafkaException, ValueError) as exc:
            log.debug("asking about topic %s: %s", options.topic, options.scrub(str(exc)))
            return None


def _answer_wait_s(options: SinkOptions) -> float:
    """How long the driver waits for an admin answer: past the request's own timeout, which should end it first,
    so that no lost answer can hold a write forever."""
    return options.preflight_timeout_s + 5


_METADATA_TRY_S = 1.0  # metadata is asked in short tries, so an authentication or TLS failure ends the wait early


def _connect_problem(err: KafkaError, options: SinkOptions) -> str | None:
    """What to check for a connection error librdkafka reports that retrying will not cure."""
    text = options.scrub(err.str())
    if err.code() == KafkaError._AUTHENTICATION:
        return (f"authentication with kafka.bootstrap.servers={options.bootstrap_servers} failed ({text}); check "
                "kafka.sasl.mechanism, kafka.sasl.username and kafka.sasl.password (or kafka.sasl.jaas.config)")
    if err.code() == KafkaError._SSL:
        return (f"TLS with kafka.bootstrap.servers={options.bootstrap_servers} failed ({text}); check "
                "kafka.ssl.ca.location (the CA that signed the brokers' certificates) and kafka.security.protocol")
    return None


def refusing(bootstrap: str, timeout_s: float = 2.0) -> list[str]:
    """The bootstrap addresses, if every one of them refuses a TCP connection at once (nothing listens there: a
    typo, or brokers that are down); empty if any accepts or does not answer (left to the metadata wait)."""
    refused = []
    for address in (a.strip() for a in bootstrap.split(",")):
        if not address:
            continue
        host, _, port = address.rsplit("://", 1)[-1].rpartition(":")
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
                return []
        except ConnectionRefusedError:
            refused.append(address)
        except (OSError, ValueError):
            return []
    return refused


def _metadata(producer: Producer, options: SinkOptions, errors: list[KafkaError]) -> ClusterMetadata:
    deadline = time.monotonic() + options.preflight_timeout_s
    while True:
        try:
            # confluent-kafka's stub types a producer's list_topics() as Any; it is the admin client's ClusterMetadata.
            metadata: ClusterMetadata = producer.list_topics(
                options.topic, timeout=max(0.1, min(_METADATA_TRY_S, deadline - time.monotonic())))
            return metadata
        except KafkaException as exc:
            producer.poll(0)  # serves error_cb: the cause of a failed connection
            for err in errors:
                if (problem := _connect_problem(err, options)) is not None:
                    raise OptionError(problem) from None
            if refused := refusing(options.bootstrap_servers):
                raise OptionError(
                    f"kafka.bootstrap.servers={options.bootstrap_servers}: every address refused the connection "
                    f"({', '.join(refused)}): nothing listens there; check the host names and ports, and that the "
                    "brokers are up") from None
            if time.monotonic() >= deadline:
                cause = errors[-1] if errors else exc.args[0]
                raise OptionError(
                    f"cannot reach kafka.bootstrap.servers={options.bootstrap_servers} within "
                    f"{options.preflight_timeout_s:g}s ({options.scrub(cause.str())}); check the address, that the "
                    "brokers are up and the kafka.security.* settings (preflight.timeoutMs sets the wait)"
                ) from None


def _check_write_allowed(options: SinkOptions, questions: TopicQuestions | None) -> None:
    """Under an authorizer, the principal must be allowed to WRITE to the topic: asked on the driver (the
    topic's authorized operations, KIP-430) rather than learnt from every task's failed deliveries."""
    from confluent_kafka.admin import AclOperation

    assert options.topic is not None
    try:
        # Kept in a name: a temporary TopicQuestions would take its admin client with it, and the answer with it.
        asked = questions or TopicQuestions(options)
        allowed = asked.operations.result(timeout=_answer_wait_s(options)).authorized_operations
    except (KafkaException, ValueError, TimeoutError) as exc:
        log.info("could not read the operations allowed on topic %s (%s); the brokers still enforce them",
                 options.topic, options.scrub(str(exc)))
        return
    if missing_operations(allowed, (AclOperation.WRITE,)):
        names = ", ".join(sorted(op.name for op in allowed))
        raise OptionError(
            f"option topic={options.topic}: the brokers do not allow this principal to WRITE to the topic (allowed: "
            f"{names}); grant it WRITE on the topic (kafka-acls --add --allow-principal User:<name> --operation "
            f"Write --topic {options.topic}), or use the credentials of a principal that has it")


def check_cluster(options: SinkOptions, questions: TopicQuestions | None = None) -> str:
    """Raise an OptionError naming the option at fault if a task could not possibly succeed; return the
    cluster id, part of every record's delivery identity (a write to another cluster never matches).
    ``questions``: the topic's, already sent (:meth:`TopicQuestions.ask`); asked here otherwise."""
    errors: list[KafkaError] = []
    try:
        producer = Producer(_probe_config(options, error_cb=errors.append))
    except KafkaException as exc:
        text = options.scrub(exc.args[0].str() if exc.args else str(exc))
        m = _PROPERTY.search(text)
        name = _option_name(m.group(1), options) if m else "a kafka.* option"
        near = suggest_kafka(m.group(1)) if m and "No such configuration property" in text else None
        hint = f"did you mean {near}?" if near else "fix or remove it"
        raise OptionError(f"{name} is not valid for the producer (librdkafka): {text}; {hint}") from None
    try:
        metadata = _metadata(producer, options, errors)
        check_topic_creation(options)  # the brokers answer: before any topic is made as these options say
        if options.topic is not None:
            topic = metadata.topics.get(options.topic)
            if topic is None or topic.error is not None:
                if topic is not None and topic.error is not None \
                        and topic.error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
                    raise OptionError(
                        f"option topic={options.topic}: the brokers do not let this principal see the topic "
                        f"(TOPIC_AUTHORIZATION_FAILED); grant it DESCRIBE and WRITE on topic {options.topic}")
                reason = topic.error.str() if topic is not None and topic.error is not None else "not in metadata"
                why = "topic.mustExist=true" if options.topic_must_exist else \
                    create_as_brokers_would(options, options.topic, options.preflight_timeout_s)
                if why is not None:
                    raise OptionError(
                        f"option topic={options.topic}: the topic does not exist or is not accessible ({reason}), and "
                        f"{why}: create it first, or check its name")

            _check_write_allowed(options, questions)
        if not metadata.cluster_id:
            raise OptionError(f"kafka.bootstrap.servers={options.bootstrap_servers} did not report a cluster id; "
                              "the sink needs Kafka 0.10.1 or later")
        _check_not_fatal(producer, errors, options)
        return metadata.cluster_id
    finally:
        _close_quietly(producer, options)


def _close_quietly(producer: Producer, options: SinkOptions) -> None:
    """A probe producer's flush raises a fatal error already reported (or one that came late): the error being
    raised, if any, is the one that explains."""
    try:
        producer.flush(0)
    except (KafkaException, SystemError) as exc:
        log.debug("closing a preflight producer: %s", options.scrub(str(exc)))


def _check_not_fatal(producer: Producer, errors: list[KafkaError], options: SinkOptions) -> None:
    """A fatal producer error seen so far (say, no right to an idempotent producer id) would fail every task."""
    try:
        producer.poll(0)
    except (KafkaException, SystemError):
        pass  # a fatal error is also passed to error_cb
    for err in errors:
        if err.fatal():
            hint = ("an idempotent producer needs WRITE on a topic or IDEMPOTENT_WRITE on the cluster: grant WRITE "
                    "on the topic" if err.code() == KafkaError.CLUSTER_AUTHORIZATION_FAILED else "see the Kafka error")
            raise OptionError(f"the producer cannot work with these kafka.* settings: {err.name()}: "
                              f"{options.scrub(err.str())}; {hint}")


def fit_topic_limit(options: SinkOptions, questions: TopicQuestions | None = None) -> SinkOptions:
    """Read the ``topic`` option's ``max.message.bytes`` so that tasks refuse a record the broker would refuse
    before it enters the WAL, and keep librdkafka's batches within it: a ``batch.size`` above it (the sink's
    default is 384 KiB, librdkafka's 1 MB, the Java client's 16 KB) makes every full batch fail as
    MSG_SIZE_TOO_LARGE. The default is lowered to the limit; a ``kafka.batch.size`` of the user's above it is
    refused (one equal to the default is taken as the default).
    Without a ``topic`` option, or without the right to describe the topic's configuration, the options come
    back unchanged (the broker still refuses what is too large, and the WAL keeps it). ``questions``: as
    :func:`check_cluster`'s."""
    from dataclasses import replace

    if options.topic is None:
        return _fit_column_topics(options)
    try:
        asked = questions or TopicQuestions(options)
        entry = asked.config.result(timeout=_answer_wait_s(options)).get("max.message.bytes")
        limit = int(entry.value) if entry is not None and entry.value is not None else None
    except (KafkaException, ValueError, TimeoutError) as exc:
        log.info("could not read topic %s's max.message.bytes (%s); the brokers still enforce it", options.topic,
                 options.scrub(str(exc)))
        return options
    if limit is None:
        return options
    conf = options.producer_config()
    given = conf.get("batch.size", str(DEFAULT_BATCH_SIZE))
    if given != str(DEFAULT_BATCH_SIZE):  # the user's own: refused if too large, never changed
        if int(given) > limit:
            raise OptionError(
                f"option kafka.batch.size={given} exceeds topic {options.topic}'s max.message.bytes="
                f"{limit}: the broker would refuse every full batch; set kafka.batch.size to at most {limit}")
        return replace(options, topic_max_message_bytes=limit)
    items = options.producer_items
    if limit < DEFAULT_BATCH_SIZE:
        items = tuple(sorted({**conf, "batch.size": str(limit)}.items()))
        log.info("topic %s has max.message.bytes=%d: the producer's batch.size is set to it (the sink's default "
                 "is %d)", options.topic, limit, DEFAULT_BATCH_SIZE)
    return replace(options, producer_items=items, topic_max_message_bytes=limit)


def check_dead_letter_topic(options: SinkOptions) -> SinkOptions:
    """With errors.tolerance=all: the dead-letter topic exists (made as the brokers would auto-create it, unless
    topic.mustExist), and its ``max.message.bytes`` is read, so that a task refuses a dead letter too large for it
    before it enters the WAL."""
    from dataclasses import replace

    dead = options.errors
    if not isinstance(dead, DeadLetterTopic):
        return options
    as_topic = replace(options, topic=dead.topic)
    wait_s = _answer_wait_s(options)
    for created in (False, True):
        questions = TopicQuestions.ask(as_topic)
        try:
            if questions is None:
                raise KafkaException(KafkaError(KafkaError._TRANSPORT, "the admin client could not be made"))
            entry = questions.config.result(timeout=wait_s).get("max.message.bytes")
            limit = int(entry.value) if entry is not None and entry.value is not None else None
            return replace(options, errors=DeadLetterTopic(dead.topic, limit))
        except (KafkaException, ValueError, TimeoutError) as exc:
            err = exc.args[0] if isinstance(exc, KafkaException) and exc.args else None
            if not says_missing(err):
                # Not an answer that the topic is missing (no right to describe it, no answer in time): as for the
                # topic option's limit, the brokers still enforce it, and a dead letter they refuse fails its task.
                log.info("could not read dead-letter topic %s's max.message.bytes (%s); the brokers still enforce "
                         "it", dead.topic, options.scrub(str(exc)))
                return options
            reason = options.scrub(err.str())
        why: str | None
        if created:
            why = "it was created but is still not accessible"
        elif options.topic_must_exist:
            why = "topic.mustExist=true"
        else:
            why = create_as_brokers_would(options, dead.topic, options.preflight_timeout_s)
        if why is not None:
            raise OptionError(
                f"option errors.deadletterqueue.topic.name={dead.topic}: the topic does not exist ({reason}), and "
                f"{why}: create it first, or check its name")
    raise AssertionError("unreachable")


def check_topic_creation(options: SinkOptions) -> None:
    """With ``topic.creation.default.*`` options: the brokers accept them, asked as a CreateTopics that only
    validates (for a name no topic has), so that a misspelt topic config or a replication factor the cluster cannot
    give fails the write here, naming the option, rather than in the tasks that would create a topic column's topic.
    No right to create topics, or no answer in time, leaves the check to the brokers when a topic is made."""
    how = options.topic_creation
    if how.brokers_defaults:
        return
    probe = f"recoverable-kafka-creation-check-{uuid.uuid4().hex[:12]}"
    admin = _probe_admin(options)  # kept in a name until the answer came: a dropped client cancels its futures
    try:
        admin.create_topics([new_topic(probe, how)], validate_only=True,
                            request_timeout=options.preflight_timeout_s)[probe].result(timeout=_answer_wait_s(options))
    except KafkaException as exc:
        err = exc.args[0]
        setting = refused_setting(err, how)
        if setting is None:
            log.info("could not check the topic.creation.default.* options (%s); the brokers check them when the sink "
                     "creates a topic", options.scrub(err.str()))
            return
        raise OptionError(f"option {setting}: the brokers would refuse to create a topic with {how.describe()} "
                          f"({options.scrub(err.str())}); fix {setting}") from None
    except TimeoutError:
        log.info("the brokers did not answer the check of the topic.creation.default.* options in time; they check "
                 "them when the sink creates a topic")


def check_transactions(options: SinkOptions) -> None:
    """For delivery.guarantee=exactly_once: the brokers run transactions, this principal may use the sink's
    transactional ids and marker groups, and kafka.transaction.timeout.ms is within the brokers' maximum.
    Each is an OptionError naming what to change, raised before any task starts."""
    from confluent_kafka.admin import ConfigResource, ResourceType

    timeout_s = options.preflight_timeout_s
    asked_ms = int(options.producer_config()["transaction.timeout.ms"])
    # A probe transactional id and marker group under the same prefix: ACLs and the coordinator, on the driver.
    # The probe producer is made first, so that it connects while the admin client asks its questions.
    probe = f"{options.transactional_id_prefix}preflight"
    try:
        producer = Producer(_probe_config(options, **{"transactional.id": probe}))
    except KafkaException as exc:
        problem = transaction_problem(exc.args[0], "init_transactions", probe)
        raise OptionError(f"delivery.guarantee=exactly_once: {options.scrub(problem)}") from None
    try:
        admin = _probe_admin(options)
        brokers = list(admin.list_topics(timeout=timeout_s).brokers)
        try:
            resource = ConfigResource(ResourceType.BROKER, str(brokers[0]))
            configs = admin.describe_configs([resource], request_timeout=timeout_s)[resource] \
                .result(timeout=_answer_wait_s(options))
            entry = configs.get("transaction.max.timeout.ms")
            broker_max = int(entry.value) if entry is not None and entry.value is not None else None
        except (KafkaException, IndexError, TimeoutError) as exc:  # no DESCRIBE_CONFIGS right: init_transactions tells
            broker_max = None
            log.info("could not read the brokers' transaction.max.timeout.ms (%s); init_transactions checks it",
                     options.scrub(str(exc)))
        if broker_max is not None and asked_ms > broker_max:
            raise OptionError(
                f"option kafka.transaction.timeout.ms={asked_ms} exceeds the brokers' transaction.max.timeout.ms="
                f"{broker_max}: a partition's transaction must commit within it; lower the option (and write "
                "smaller partitions), or raise the brokers' maximum")
        # A broker answered first: init_transactions then finds its coordinator at once instead of after
        # librdkafka's 500 ms retry. No answer is left to init_transactions to report.
        with suppress(KafkaException):
            producer.list_topics(timeout=timeout_s)
        try:
            within(lambda: producer.init_transactions(timeout_s), "the driver's init_transactions probe", timeout_s,
                   f"preflight.timeoutMs={int(timeout_s * 1000)}", f"the transaction coordinator of {probe}",
                   handle=producer, next_step="the write fails before any task runs")
        except KafkaException as exc:
            problem = transaction_problem(exc.args[0], "init_transactions", probe)
            raise OptionError(f"delivery.guarantee=exactly_once: {options.scrub(problem)}") from None
    finally:
        _close_quietly(producer, options)
    # The tasks' marker read, retries and all: a coordinator still loading (COORDINATOR_LOAD_IN_PROGRESS on a
    # freshly started broker) is asked again within preflight.timeoutMs.
    from recoverable_sink.producer.transactions import group_offsets

    try:
        within(lambda: group_offsets(options, probe, [options.topic] if options.topic else None, timeout_s),
               "the driver's marker read probe", timeout_s, f"preflight.timeoutMs={int(timeout_s * 1000)}",
               f"the group coordinator of {probe}", next_step="the write fails before any task runs")
    except KafkaException as exc:
        problem = transaction_problem(exc.args[0], "reading the commit marker group", probe)
        raise OptionError(f"delivery.guarantee=exactly_once: {options.scrub(problem)}") from None


def _fit_column_topics(options: SinkOptions) -> SinkOptions:
    """Without a ``topic`` option the rows name their topics, which the driver cannot know: the default
    ``batch.size`` is fitted to the smallest ``max.message.bytes`` among the cluster's topics (a batch to a topic
    whose limit is below it fails whole as MSG_SIZE_TOO_LARGE, ordinary records and all). One DescribeConfigs
    request; topics this principal may not describe, or made after it, keep the default."""
    from dataclasses import replace

    from confluent_kafka.admin import ConfigResource, ResourceType

    conf = options.producer_config()
    if conf.get("batch.size", str(DEFAULT_BATCH_SIZE)) != str(DEFAULT_BATCH_SIZE):
        return options  # the user's own batch.size
    admin = _probe_admin(options)
    try:
        topics = [t for t in admin.list_topics(timeout=options.preflight_timeout_s).topics if not t.startswith("__")]
        resources = [ConfigResource(ResourceType.TOPIC, t) for t in topics]
        if not resources:
            return options
        limits: dict[str, int] = {}
        answers = admin.describe_configs(resources, request_timeout=options.preflight_timeout_s)
        for resource, future in answers.items():
            try:
                entry = future.result(timeout=_answer_wait_s(options)).get("max.message.bytes")
            except (KafkaException, TimeoutError):
                continue  # not described to this principal: the brokers still enforce its limit
            if entry is not None and entry.value is not None:
                limits[resource.name] = int(entry.value)
    except KafkaException as exc:
        log.info("could not read the topics' max.message.bytes (%s); batch.size stays %d", options.scrub(str(exc)),
                 DEFAULT_BATCH_SIZE)
        return options
    smallest = min(limits.items(), key=lambda item: item[1], default=None)
    if smallest is None or smallest[1] >= DEFAULT_BATCH_SIZE:
        return options
    # A warning: one small topic anywhere in the cluster makes every topic-column write send smaller batches.
    log.warning("the rows name their topics and topic %s has max.message.bytes=%d, the smallest in the cluster: the "
                "producer's batch.size is set to it (the sink's default is %d); set kafka.batch.size for the topics "
                "this write sends to if they allow more", smallest[0], smallest[1], DEFAULT_BATCH_SIZE)
    return replace(options, producer_items=tuple(sorted({**conf, "batch.size": str(smallest[1])}.items())))


def check_proof_topic(options: SinkOptions) -> SinkOptions:
    """The proof topic exists (created where it is missing, :mod:`recoverable_sink.proof.topic`) and its partition
    count is known to every task; ``proof.kafka=false`` skips it."""
    from dataclasses import replace

    from recoverable_sink.options import KafkaProof
    from recoverable_sink.proof.topic import ensure_topic

    proof = options.proof
    if not isinstance(proof, KafkaProof):
        return options
    admin = _probe_admin(options)
    try:
        count = within(lambda: ensure_topic(options, admin, proof), f"checking the proof topic {proof.topic}",
                       _answer_wait_s(options), f"preflight.timeoutMs={int(options.preflight_timeout_s * 1000)}",
                       "the brokers' metadata and admin answers")
    except KafkaException as exc:
        raise OptionError(f"the proof topic {proof.topic} could not be checked ({options.scrub(str(exc))}): check "
                          "the brokers, or set proof.kafka=false") from None
    return replace(options, proof=replace(proof, known_partitions=count))
