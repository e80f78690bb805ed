"""The option names the sink knows, and the nearest of them to a name it does not know (the driver's "did you mean").

A misspelt option is refused on the driver; the refusal names the option as given and the known name nearest to it,
so that the user reads one line instead of the whole list. The librdkafka names below are only a vocabulary for that
suggestion: librdkafka itself decides which ``kafka.*`` settings are valid.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

# The sink's own options, spelt as the README spells them (names are case-insensitive).
SINK_OPTIONS = (
    "topic", "topic.mustExist", "wal.path", "wal.maxBytes", "wal.enabled", "wal.retentionHours",
    "wal.proofGraceSeconds", "wal.proofMaxBytes", "wal.writeId", "rate.recordsPerSecond", "rate.bytesPerSecond",
    "producer.native", "delivery.guarantee", "transactional.id.prefix", "preflight.timeoutMs", "summary.path",
    "errors.tolerance", "errors.deadletterqueue.topic.name", "topic.creation.default.partitions",
    "topic.creation.default.replication.factor", "proof.kafka", "proof.topic", "proof.partitions",
    "proof.replicationFactor", "proof.retentionHours", "proof.failOnExpired",
)

# librdkafka's configuration properties that concern a producer or any client (librdkafka 2.x, the one in
# confluent-kafka's wheel), and the Java client's names the sink translates (options.py): what a ``kafka.*`` option
# most likely meant.
KAFKA_PROPERTIES = (
    "acks", "allow.auto.create.topics", "api.version.fallback.ms", "api.version.request",
    "api.version.request.timeout.ms", "batch.num.messages", "batch.size", "bootstrap.servers",
    "broker.address.family", "broker.address.ttl", "broker.version.fallback", "buffer.memory", "client.dns.lookup",
    "client.id", "client.rack", "compression.codec", "compression.level", "compression.type",
    "connections.max.idle.ms", "debug", "delivery.timeout.ms", "enable.idempotence", "enable.metrics.push",
    "enable.sparse.connections", "enable.ssl.certificate.verification", "linger.ms", "log.connection.close",
    "log_level", "max.in.flight", "max.in.flight.requests.per.connection", "max.request.size", "message.max.bytes",
    "message.send.max.retries", "message.timeout.ms", "metadata.max.age.ms", "metadata.recovery.strategy",
    "partitioner", "queue.buffering.backpressure.threshold", "queue.buffering.max.kbytes",
    "queue.buffering.max.messages", "queue.buffering.max.ms", "receive.buffer.bytes", "receive.message.max.bytes",
    "reconnect.backoff.jitter.ms", "reconnect.backoff.max.ms", "reconnect.backoff.ms", "request.required.acks",
    "request.timeout.ms", "retries", "retry.backoff.max.ms", "retry.backoff.ms", "sasl.jaas.config",
    "sasl.kerberos.keytab", "sasl.kerberos.kinit.cmd", "sasl.kerberos.min.time.before.relogin",
    "sasl.kerberos.principal", "sasl.kerberos.service.name", "sasl.mechanism", "sasl.mechanisms",
    "sasl.oauthbearer.client.id", "sasl.oauthbearer.client.secret", "sasl.oauthbearer.config",
    "sasl.oauthbearer.extensions", "sasl.oauthbearer.method", "sasl.oauthbearer.scope",
    "sasl.oauthbearer.token.endpoint.url", "sasl.password", "sasl.username", "security.protocol",
    "send.buffer.bytes", "socket.connection.setup.timeout.ms", "socket.keepalive.enable", "socket.max.fails",
    "socket.nagle.disable", "socket.receive.buffer.bytes", "socket.send.buffer.bytes", "socket.timeout.ms",
    "ssl.ca.certificate.stores", "ssl.ca.location", "ssl.ca.pem", "ssl.certificate.location", "ssl.certificate.pem",
    "ssl.cipher.suites", "ssl.crl.location", "ssl.curves.list", "ssl.endpoint.identification.algorithm",
    "ssl.engine.id", "ssl.engine.location", "ssl.key.location", "ssl.key.password", "ssl.key.pem",
    "ssl.keystore.location", "ssl.keystore.password", "ssl.providers", "ssl.sigalgs.list", "statistics.interval.ms",
    "sticky.partitioning.linger.ms", "topic.metadata.propagation.max.ms", "topic.metadata.refresh.fast.interval.ms",
    "topic.metadata.refresh.interval.ms", "topic.metadata.refresh.sparse", "transaction.timeout.ms",
)

_CUTOFF = 0.75  # difflib's similarity ratio; below it a "nearest" name is more confusing than none


def nearest(name: str, known: Iterable[str]) -> str | None:
    """The known name most like ``name`` (compared case-insensitively), or None if none is close.

    >>> nearest("delivery.guarentee", SINK_OPTIONS)
    'delivery.guarantee'
    >>> nearest("wal.maxbyte", SINK_OPTIONS)
    'wal.maxBytes'
    >>> nearest("colour", SINK_OPTIONS) is None
    True
    """
    by_lower = {k.lower(): k for k in known}
    found = difflib.get_close_matches(name.lower(), list(by_lower), n=1, cutoff=_CUTOFF)
    return by_lower[found[0]] if found else None


def suggest_kafka(name: str) -> str | None:
    """The ``kafka.*`` option most like ``kafka.<name>``, a producer setting that librdkafka does not know.

    >>> suggest_kafka("bootstrap.server"), suggest_kafka("linger.msec"), suggest_kafka("zzz")
    ('kafka.bootstrap.servers', 'kafka.linger.ms', None)
    """
    found = nearest(name, KAFKA_PROPERTIES)
    return f"kafka.{found}" if found is not None else None


def suggest(name: str, extra: Iterable[str] = ()) -> str | None:
    """The known option most like ``name``, an option that is neither the sink's nor ``kafka.*``: one of the sink's
    own (or ``extra``), else a producer setting given without its ``kafka.`` prefix.

    >>> suggest("delivery.guarentee"), suggest("bootstrap.servers"), suggest("topic.mustexists")
    ('delivery.guarantee', 'kafka.bootstrap.servers', 'topic.mustExist')
    """
    own = nearest(name, (*SINK_OPTIONS, *extra))
    if own is not None:
        return own
    if name.lower() in KAFKA_PROPERTIES:
        return f"kafka.{name.lower()}"
    return suggest_kafka(name)
