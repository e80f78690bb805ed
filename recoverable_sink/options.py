"""Parse and validate the writer's options and build the librdkafka producer configuration (driver).

The option names are those of Spark's built-in Kafka sink (``kafka.*`` and ``topic``) plus the WAL's.
Java-client property names that librdkafka spells differently are translated; the ones it cannot honour
are rejected with what to use instead. Settings that would break the sink's guarantees are rejected too.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import Any

from recoverable_sink._faults import FAULT_PREFIX, FaultPlan, parse_faults
from recoverable_sink.errors import OptionError
from recoverable_sink.option_names import SINK_OPTIONS, suggest, suggest_kafka

KAFKA_PREFIX = "kafka."
DEFAULT_WAL_MAX_BYTES = 4 << 30  # payload Kafka has not acknowledged yet, for all tasks on a host
DEFAULT_PROOF_MAX_BYTES = 16 << 30  # finished attempts' proof of delivery on a host: ~1 billion records of history
DEFAULT_RETENTION_HOURS = 168.0
DEFAULT_PROOF_GRACE_SECONDS = 600.0  # past spark.network.timeout (120 s), which a lost executor is detected within
DEFAULT_PREFLIGHT_TIMEOUT_MS = 30_000
AT_LEAST_ONCE = "at_least_once"
EXACTLY_ONCE = "exactly_once"
DEFAULT_TRANSACTIONAL_ID_PREFIX = "recoverable-kafka-"
DEFAULT_PROOF_PARTITIONS = 9  # the directory's partition and 8 for the proof itself (proof.partitions)
DEFAULT_PROOF_RETENTION_HOURS = 168.0  # how long a wal.writeId write can be re-run exactly from any host
# A partition's transaction must commit within this; the brokers' transaction.max.timeout.ms (15 min by default)
# caps it, and preflight checks the two against each other.
DEFAULT_TRANSACTION_TIMEOUT_MS = 900_000

# Settings an admin client or a consumer of the same cluster needs (connection and security, not producing).
_CLIENT_PREFIXES = ("bootstrap.servers", "security.protocol", "sasl.", "ssl.", "ssl_", "enable.ssl.", "client.",
                    "socket.", "broker.", "api.version", "metadata.", "reconnect.", "connections.", "retry.backoff",
                    "debug", "log_level", "allow.auto.create.topics")

DEFAULT_BATCH_SIZE = 393_216  # bytes per partition batch (librdkafka: 1,000,000; the Java client: 16,384)

# What the sink sets unless the user says otherwise. acks/idempotence are also enforced (see below).
PRODUCER_DEFAULTS: dict[str, str] = {
    "acks": "all",
    "enable.idempotence": "true",
    # librdkafka's default (consistent_random, CRC32) differs from the Java client; murmur2_random is
    # the one that picks the same partition as the Java producer for the same key.
    "partitioner": "murmur2_random",
    # The Java client's default (librdkafka's is 100 ms). librdkafka also waits half of it before a new client
    # connects to the first broker it learns from bootstrap.servers (the short-lived ones do not wait at all).
    "reconnect.backoff.ms": "50",
    # librdkafka's 1 MB default makes each produce request a G1 "humongous" allocation (half a region or more)
    # on a broker with Kafka's default 1 GB heap (1 MB regions); each starts a concurrent marking cycle. 384 KiB
    # keeps a full batch, plus the one record librdkafka adds past the limit, well below 512 KiB
    # (docs/performance.md, "batch.size").
    "batch.size": str(DEFAULT_BATCH_SIZE),
}

# Java producer property -> librdkafka property of the same meaning and value format.
_RENAMED: dict[str, str] = {
    "max.request.size": "message.max.bytes",
    "send.buffer.bytes": "socket.send.buffer.bytes",
    "receive.buffer.bytes": "socket.receive.buffer.bytes",
}

# Java producer properties librdkafka cannot honour, with what to do instead.
_REJECTED: dict[str, str] = {
    "key.serializer": "the sink always writes the key column as bytes (as format('kafka') does); remove it",
    "value.serializer": "the sink always writes the value column as bytes (as format('kafka') does); remove it",
    "partitioner.class": "Java partitioners cannot run in librdkafka; set kafka.partitioner instead "
    "(default murmur2_random, the Java client's hashing)",
    "interceptor.classes": "Java interceptors cannot run in librdkafka; remove it",
    "max.block.ms": "librdkafka never blocks the caller; the sink itself waits for queue space, so remove it",
    "transactional.id": "the sink gives each partition its own transactional id: set delivery.guarantee=exactly_once "
    "(and transactional.id.prefix if your ACLs need one)",
    "ssl.truststore.location": "librdkafka reads PEM files: use kafka.ssl.ca.location",
    "ssl.truststore.password": "librdkafka reads PEM files: use kafka.ssl.ca.location",
    "ssl.truststore.type": "librdkafka reads PEM files: use kafka.ssl.ca.location",
    "ssl.keystore.type": "librdkafka reads a PKCS#12 kafka.ssl.keystore.location or PEM "
    "kafka.ssl.certificate.location/kafka.ssl.key.location",
}

_JAAS = re.compile(r'(\w+)\s*=\s*"((?:[^"\\]|\\.)*)"')
# The properties librdkafka itself flags _RK_SENSITIVE (src/rdkafka_conf.c, v2.15; no public API exposes the
# flag), and a net for names it does not know (Java-only settings, future secrets) that look like secrets.
_LIBRDKAFKA_SENSITIVE = frozenset({
    "ssl.key.location", "ssl.key.password", "ssl.key.pem", "ssl.ca.pem", "ssl.keystore.password",
    "sasl.username", "sasl.password", "sasl.oauthbearer.config", "sasl.oauthbearer.client.secret",
    "sasl.oauthbearer.assertion.private.key.file", "sasl.oauthbearer.assertion.private.key.passphrase",
    "sasl.oauthbearer.assertion.private.key.pem",
})
_SENSITIVE_LOOKING = re.compile(r"password|secret|jaas|token|credential|passphrase|\.pem$|ssl\.key\.|"
                                r"oauthbearer\.(config|extensions)|basic\.auth\.user\.info", re.IGNORECASE)

_SINK_OPTIONS = {name.lower() for name in SINK_OPTIONS}
# Schema Registry framing, per field: "<field>.<name>" for field in key, value.
_REGISTRY_OPTIONS = ("schema.registry.url", "subject", "subject.name.strategy", "avro.schema",
                     "schema.registry.basic.auth.user.info", "schema.type", "protobuf.schema", "protobuf.message",
                     "json.schema")
# Confluent's three wire formats, as the registry names them (its schemaType).
SCHEMA_TYPES = ("AVRO", "PROTOBUF", "JSON")
_REGISTRY_NAMES = tuple(f"{field}.{name}" for field in ("key", "value") for name in _REGISTRY_OPTIONS)
_SINK_OPTIONS |= {name.lower() for name in _REGISTRY_NAMES}
SUBJECT_STRATEGIES = ("TopicNameStrategy", "RecordNameStrategy", "TopicRecordNameStrategy")
# Options Spark itself may hand to a streaming sink; they mean nothing here.
_IGNORED = {"checkpointlocation", "queryname", "path"}


def is_sensitive(name: str) -> bool:
    """True for producer properties whose values are secrets (never logged or put in a message)."""
    return name.lower() in _LIBRDKAFKA_SENSITIVE or bool(_SENSITIVE_LOOKING.search(name))


@dataclass(frozen=True)
class FailOnRefusal:
    """``errors.tolerance=none`` (the default): a record Kafka would refuse fails its task, as Spark's sink does."""


@dataclass(frozen=True)
class DeadLetterTopic:
    """``errors.tolerance=all``: records Kafka would refuse for what they are go to ``topic`` instead, with headers
    saying why (Kafka Connect's dead-letter queue). ``max_message_bytes`` is the topic's own limit, read on the
    driver (None: not read)."""

    topic: str
    max_message_bytes: int | None = None


ErrorTolerance = FailOnRefusal | DeadLetterTopic

TOPIC_CREATION_PREFIX = "topic.creation.default."


@dataclass(frozen=True)
class TopicCreation:
    """How the sink creates a topic that does not exist, where it creates one (the brokers auto-create topics, and
    ``topic.mustExist`` is false): Kafka Connect's ``topic.creation.default.*`` options. -1 and no configs are the
    brokers' own defaults (``num.partitions``, ``default.replication.factor``), as their auto-creation gives."""

    partitions: int = -1
    replication_factor: int = -1
    configs: tuple[tuple[str, str], ...] = ()  # topic configs (cleanup.policy, retention.ms, ...), as given

    @property
    def brokers_defaults(self) -> bool:
        return self.partitions == -1 and self.replication_factor == -1 and not self.configs

    def describe(self) -> str:
        """How a topic is made, for log lines and errors.

        >>> TopicCreation().describe(), TopicCreation(6, -1, (("cleanup.policy", "compact"),)).describe()
        ("the brokers' defaults", "6 partitions, the brokers' default replication factor, cleanup.policy=compact")
        """
        if self.brokers_defaults:
            return "the brokers' defaults"
        parts = [f"{self.partitions} partitions" if self.partitions != -1 else "the brokers' default partitions",
                 f"replication factor {self.replication_factor}" if self.replication_factor != -1
                 else "the brokers' default replication factor"]
        return ", ".join(parts + [f"{k}={v}" for k, v in self.configs])


@dataclass(frozen=True)
class AvroWire:
    """Avro, the default: a struct column the sink encodes, or to_avro's binary (schema in ``avro_schema``)."""


@dataclass(frozen=True)
class ProtobufWire:
    """Protobuf: a binary column of serialised messages (Spark's ``to_protobuf``, or any serialiser) of ``message``
    (None: the file's first), whose ``.proto`` source ``schema`` is registered; each value gets the message's
    index list after the schema id."""

    schema: str
    message: str | None


@dataclass(frozen=True)
class JsonWire:
    """JSON Schema: a string or binary column of JSON documents (``to_json``), or a struct column the sink writes
    as JSON; ``schema`` (a JSON Schema) is registered."""

    schema: str


WireFormat = AvroWire | ProtobufWire | JsonWire


@dataclass(frozen=True)
class RegistryFraming:
    """Records of one field (key or value) framed for a Confluent-compatible Schema Registry: the field's schema is
    registered under a subject on the driver, and every value is prefixed with its id (Confluent's wire format)."""

    field: str  # "key" or "value"
    url: str  # the registry's base URL
    avro_schema: str | None  # Avro: the schema (JSON) of to_avro's bytes; None: derived from a struct column
    subject: str | None  # None: named by the strategy
    strategy: str  # one of SUBJECT_STRATEGIES
    user_info: str | None = dataclass_field(default=None, repr=False)  # "user:password" for basic auth: a secret
    wire: WireFormat = AvroWire()


@dataclass(frozen=True)
class KafkaProof:
    """Proof of delivery kept in the proof topic too (:mod:`recoverable_sink.proof`): ``topic``, created on the
    driver with ``partitions`` and ``replication`` (-1: the brokers' default) where it is missing, whose records live
    ``retention_hours``. ``known_partitions`` is the topic's partition count as the driver found it (0 before).
    ``fail_on_expired``: an exactly_once attempt that would send while the retention deleted part of its write's proof
    fails instead (Spark's Kafka source's failOnDataLoss, for repeats)."""

    topic: str
    partitions: int = DEFAULT_PROOF_PARTITIONS
    replication: int = -1
    retention_hours: float = DEFAULT_PROOF_RETENTION_HOURS
    known_partitions: int = 0
    fail_on_expired: bool = True


@dataclass(frozen=True)
class WalOnlyProof:
    """``proof.kafka=false``: proof of delivery only in the executors' WALs (a retry or re-run elsewhere cannot see
    it)."""


ProofPlace = KafkaProof | WalOnlyProof


@dataclass(frozen=True)
class SinkOptions:
    """Everything a task needs to know about one write; pickled from the driver to every task."""

    producer_items: tuple[tuple[str, str], ...]
    topic: str | None = None
    # A missing topic fails the write even where the brokers auto-create topics (default: created as they would).
    topic_must_exist: bool = False
    # How the sink makes a missing topic where it makes one: partitions, replication factor, topic configs.
    topic_creation: TopicCreation = TopicCreation()
    wal_path: str | None = None
    wal_max_bytes: int = DEFAULT_WAL_MAX_BYTES
    wal_enabled: bool = True
    retention_seconds: float = DEFAULT_RETENTION_HOURS * 3600
    # How long a committed generated-id write's proof of delivery stays on an executor host (never re-run: only
    # Spark's own re-run of a finished task, after its executor was lost, needs it).
    proof_grace_seconds: float = DEFAULT_PROOF_GRACE_SECONDS
    # Finished attempts' proof of delivery kept on a host past which the oldest goes (a long wal.writeId history).
    proof_max_bytes: int = DEFAULT_PROOF_MAX_BYTES
    # Per task: at most so many records, and bytes of keys, values and headers, handed over a second.
    rate_records_per_s: float | None = None
    rate_bytes_per_s: int | None = None
    registry: tuple[RegistryFraming, ...] = ()  # Schema Registry framing of key and/or value
    preflight_timeout_s: float = DEFAULT_PREFLIGHT_TIMEOUT_MS / 1000
    summary_path: str | None = None
    write_id: str | None = None
    guarantee: str = AT_LEAST_ONCE
    transactional_id_prefix: str = DEFAULT_TRANSACTIONAL_ID_PREFIX
    # Set on the driver by preflight.fit_topic_limit: the topic option's max.message.bytes, when readable.
    topic_max_message_bytes: int | None = None
    # The C produce loop (producer.native.NativeProducer) where the extension is built; false: confluent-kafka's
    # produce().
    native_producer: bool = True
    errors: ErrorTolerance = FailOnRefusal()  # what a record Kafka would refuse does
    proof: ProofPlace = WalOnlyProof()  # where proof of delivery is kept besides the WAL
    # Private fault injection for the test suite and the chaos campaign (``_test.*`` options); None for users.
    faults: FaultPlan | None = None

    def producer_config(self) -> dict[str, str]:
        return dict(self.producer_items)

    def redacted_producer_config(self) -> dict[str, str]:
        return {k: ("***" if is_sensitive(k) else v) for k, v in self.producer_items}

    def secrets(self) -> list[str]:
        return [v for k, v in self.producer_items if is_sensitive(k) and v] + \
            [r.user_info for r in self.registry if r.user_info]

    def scrub(self, text: str) -> str:
        """Remove every secret value from a text (an error from librdkafka, say) before it is shown."""
        for secret in self.secrets():
            text = text.replace(secret, "***")
        return text

    @property
    def exactly_once(self) -> bool:
        return self.guarantee == EXACTLY_ONCE

    @property
    def bootstrap_servers(self) -> str:
        return self.producer_config()["bootstrap.servers"]

    def resolved_wal_path(self) -> str:
        """The WAL directory on this host (see :func:`default_wal_path` when the option is not set)."""
        return self.wal_path or default_wal_path()

    def __repr__(self) -> str:  # the dataclass default would print secrets
        return (
            f"SinkOptions(topic={self.topic!r}, wal_path={self.wal_path!r}, wal_max_bytes={self.wal_max_bytes}, "
            f"wal_enabled={self.wal_enabled}, producer={self.redacted_producer_config()!r})"
        )


WAL_DIR_NAME = "recoverable_kafka_wal"


def default_wal_path(env: Mapping[str, str] | None = None) -> str:
    """``$RECOVERABLE_KAFKA_WAL_PATH``; else a directory of the sink's own in Spark's local directory, the one
    Spark gives the executor (``SPARK_LOCAL_DIRS`` in a Python worker names the executor's ``blockmgr-*``
    directories, which go with the executor: the WAL goes one level up, beside them, so a retry in another
    executor of the application on this host finds it); else one under the user's home.

    >>> default_wal_path({"SPARK_LOCAL_DIRS": "/data1/app-7/blockmgr-1f2e,/data2/app-7/blockmgr-3c4d"})
    '/data1/app-7/recoverable_kafka_wal'
    >>> default_wal_path({"SPARK_LOCAL_DIRS": "/mnt/spark"})
    '/mnt/spark/recoverable_kafka_wal'
    >>> default_wal_path({"RECOVERABLE_KAFKA_WAL_PATH": "/var/lib/wal", "SPARK_LOCAL_DIRS": "/mnt/spark"})
    '/var/lib/wal'
    """
    env = os.environ if env is None else env
    if env.get("RECOVERABLE_KAFKA_WAL_PATH"):
        return env["RECOVERABLE_KAFKA_WAL_PATH"]
    local = env.get("SPARK_LOCAL_DIRS", "").split(",")[0].strip().rstrip("/")
    if local:
        base = os.path.dirname(local) if os.path.basename(local).startswith("blockmgr-") else local
        return os.path.join(base, WAL_DIR_NAME)
    return os.path.join(os.path.expanduser("~"), ".recoverable_kafka", "wal")


def parse_size(name: str, value: str) -> int:
    """Parse a byte size such as ``1073741824``, ``512m`` or ``2g``."""
    m = re.fullmatch(r"\s*(\d+)\s*([kmgt]?)b?\s*", value.lower())
    if not m:
        raise OptionError(f"option {name}={value!r} is not a size; give bytes, or a number with k, m, g or t")
    size: int = int(m.group(1)) * 1024 ** " kmgt".index(m.group(2) or " ")
    if size <= 0:
        raise OptionError(f"option {name}={value!r} must be positive")
    return size


def _parse_bool(name: str, value: str) -> bool:
    v = value.strip().lower()
    if v in ("true", "1", "yes"):
        return True
    if v in ("false", "0", "no"):
        return False
    raise OptionError(f"option {name}={value!r} must be true or false")


def parse_number(name: str, value: str, kind: Callable[[str], float] = float) -> float:
    try:
        number = kind(value)
    except ValueError:
        raise OptionError(f"option {name}={value!r} must be a number") from None
    if number < 0:
        raise OptionError(f"option {name}={value!r} must not be negative")
    return number


def _translate_jaas(value: str) -> dict[str, str]:
    """Turn a Java ``sasl.jaas.config`` for PLAIN or SCRAM into librdkafka's username/password."""
    if "PlainLoginModule" not in value and "ScramLoginModule" not in value:
        raise OptionError(
            "option kafka.sasl.jaas.config: only PlainLoginModule and ScramLoginModule can be translated for "
            "librdkafka; set kafka.sasl.username/kafka.sasl.password (or kafka.sasl.oauthbearer.*) instead"
        )
    fields = dict(_JAAS.findall(value))
    if "username" not in fields or "password" not in fields:
        raise OptionError("option kafka.sasl.jaas.config must give username=\"...\" and password=\"...\"")
    return {"sasl.username": fields["username"], "sasl.password": fields["password"]}


def _producer_config(kafka_options: Mapping[str, str]) -> dict[str, str]:
    conf = dict(PRODUCER_DEFAULTS)
    for name, value in kafka_options.items():
        if name in _REJECTED:
            raise OptionError(f"option kafka.{name} is not supported: {_REJECTED[name]}")
        if name == "sasl.jaas.config":
            conf.update(_translate_jaas(value))
        elif name == "buffer.memory":
            conf["queue.buffering.max.kbytes"] = str(max(1, int(parse_number("kafka.buffer.memory", value, int))
                                                         // 1024))
        elif name == "ssl.endpoint.identification.algorithm" and value == "":
            conf[name] = "none"  # Java's empty string means "no hostname check"
        else:
            conf[_RENAMED.get(name, name)] = value

    acks = conf.get("acks", "all").strip().lower()
    if acks not in ("all", "-1"):
        raise OptionError(
            f"option kafka.acks={acks} would let Kafka acknowledge a record before it is replicated, so the "
            "sink could purge from its WAL a record the broker then loses; use acks=all (the default)"
        )
    conf["acks"] = "all"
    if conf.get("enable.idempotence", "true").strip().lower() not in ("true", "1"):
        raise OptionError(
            "option kafka.enable.idempotence=false would let librdkafka's own retries write a record twice; "
            "the sink promises no duplicates, so leave it true (the default)"
        )
    if not conf.get("bootstrap.servers", "").strip():
        misspelt = [f"kafka.{name}" for name in kafka_options if suggest_kafka(name) == "kafka.bootstrap.servers"
                    and name != "bootstrap.servers"]
        raise OptionError(
            (f"option {misspelt[0]} is not a producer setting: did you mean kafka.bootstrap.servers? It is required: "
             if misspelt else "option kafka.bootstrap.servers is required: ")
            + "give the brokers as host:port[,host:port...]"
        )
    # librdkafka's metadata requests would let a broker create a topic the sink only asked about; the sink creates
    # a missing topic itself, where topic.mustExist allows it (producer/topics.py).
    conf.setdefault("allow.auto.create.topics", "false")
    return conf


def short_lived(conf: dict[str, Any]) -> dict[str, Any]:
    """``conf`` for a client made for a few requests and then closed (the driver's probe producers and admin
    clients, one partition's transactional producer): it connects to every broker it learns of at once. With
    librdkafka's sparse connections, a new client drops its bootstrap connection once it learns the brokers'
    ids and connects to one of them no sooner than ``reconnect.backoff.ms`` / 2 later, a fixed cost per
    client (docs/performance.md, "Short-lived clients connect at once"). A ``kafka.enable.sparse.connections``
    of the user's wins.

    >>> short_lived({"bootstrap.servers": "b:9092"})["enable.sparse.connections"]
    'false'
    """
    return {"enable.sparse.connections": "false", **conf}


def client_config(options: SinkOptions) -> dict[str, str]:
    """The connection and security part of the producer configuration, for an admin client or a consumer."""
    return {k: v for k, v in options.producer_items if k.startswith(_CLIENT_PREFIXES)}


def _registry(lowered: Mapping[str, str], field: str) -> RegistryFraming | None:
    """The Schema Registry framing of ``field``, if its options ask for one."""
    given = {name: lowered.get(f"{field}.{name.lower()}") for name in _REGISTRY_OPTIONS}
    url = given["schema.registry.url"]
    if not url:
        stray = [f"{field}.{n}" for n, v in given.items() if v]
        if stray:
            raise OptionError(f"option(s) {', '.join(stray)} apply only with {field}.schema.registry.url; set it, "
                              "or remove them")
        return None
    if not re.fullmatch(r"https?://[^\s/@]+(/\S*)?", url):
        if re.match(r"https?://[^\s/]*@", url):  # said without the URL: it holds credentials
            raise OptionError(f"option {field}.schema.registry.url holds credentials (user:password@); give them "
                              f"as {field}.schema.registry.basic.auth.user.info, which is kept secret")
        raise OptionError(f"option {field}.schema.registry.url={url!r} is not an http(s) URL of a Schema Registry "
                          "(e.g. http://registry:8081)")
    schema = given["avro.schema"]
    try:
        if schema is not None:
            json.loads(schema)
    except ValueError as exc:
        raise OptionError(f"option {field}.avro.schema is not JSON ({exc}); give the Avro schema as to_avro() "
                          "takes it") from None
    strategy = given["subject.name.strategy"] or "TopicNameStrategy"
    matched = [s for s in SUBJECT_STRATEGIES if s.lower() == strategy.rsplit(".", 1)[-1].lower()]
    if not matched:
        raise OptionError(f"option {field}.subject.name.strategy={strategy!r} must be one of "
                          f"{', '.join(SUBJECT_STRATEGIES)}")
    # The subject naming rules are the driver's (driver/registry.py), applied before any task runs.
    return RegistryFraming(field=field, url=url.rstrip("/"), avro_schema=schema, subject=given["subject"],
                           strategy=matched[0], user_info=given["schema.registry.basic.auth.user.info"],
                           wire=_wire(field, given))


def _wire(field: str, given: Mapping[str, str | None]) -> WireFormat:
    """The field's wire format: <field>.schema.type (avro, protobuf or json) and the schema option it needs."""
    kind = (given["schema.type"] or "avro").strip().upper()
    if kind == "JSON_SCHEMA" or kind == "JSONSCHEMA":
        kind = "JSON"
    if kind not in SCHEMA_TYPES:
        raise OptionError(f"option {field}.schema.type={given['schema.type']!r} must be avro (the default), protobuf "
                          "or json")
    own = {"AVRO": "avro.schema", "PROTOBUF": "protobuf.schema", "JSON": "json.schema"}[kind]
    stray = [f"{field}.{n}" for n in ("avro.schema", "protobuf.schema", "protobuf.message", "json.schema")
             if given[n] and n != own and not (kind == "PROTOBUF" and n == "protobuf.message")]
    if stray:
        raise OptionError(f"option(s) {', '.join(stray)} do not apply with {field}.schema.type={kind.lower()}; "
                          f"give the schema as {field}.{own}")
    if kind == "AVRO":
        return AvroWire()
    text = given[own]
    if not text or not text.strip():
        raise OptionError(f"option {field}.schema.type={kind.lower()} needs {field}.{own}: the "
                          + ("schema's .proto source" if kind == "PROTOBUF" else "JSON Schema")
                          + " to register")
    if kind == "PROTOBUF":
        return ProtobufWire(text, (given["protobuf.message"] or "").strip() or None)
    try:
        json.loads(text)
    except ValueError as exc:
        raise OptionError(f"option {field}.json.schema is not JSON ({exc}); give the JSON Schema itself") from None
    return JsonWire(text)


def _positive(name: str, value: str | None) -> float | None:
    """An optional limit: None when unset, else a number above 0 (an OptionError naming the option otherwise)."""
    if value is None:
        return None
    number = parse_number(name, value)
    if not number > 0 or number == float("inf"):
        raise OptionError(f"option {name}={value!r} must be above 0; leave it unset for no limit")
    return number


def _at_least(low: float, name: str, value: float) -> float:
    """``value`` where it is at least ``low``; an OptionError naming the option otherwise."""
    if value < low:
        raise OptionError(f"option {name}={value:g} must be at least {low:g}")
    return value


def _guarantee(value: str, conf: dict[str, str]) -> str:
    guarantee = value.strip().lower()
    if guarantee not in (AT_LEAST_ONCE, EXACTLY_ONCE):
        raise OptionError(f"option delivery.guarantee={value!r} must be {AT_LEAST_ONCE} (the default: the WAL "
                          f"protocol) or {EXACTLY_ONCE} (Kafka transactions; consumers read with "
                          "isolation.level=read_committed)")
    if guarantee == EXACTLY_ONCE:
        conf.setdefault("transaction.timeout.ms", str(DEFAULT_TRANSACTION_TIMEOUT_MS))
        txn_ms = int(parse_number("kafka.transaction.timeout.ms", conf["transaction.timeout.ms"]))
        given = conf.get("delivery.timeout.ms", conf.get("message.timeout.ms"))
        if given is None:
            # librdkafka would raise an unset delivery timeout to the transaction timeout, and refuses one above it:
            # its usual 5 min, or the transaction timeout where that is shorter.
            conf["delivery.timeout.ms"] = str(min(300_000, txn_ms))
        elif int(parse_number("kafka.delivery.timeout.ms", given)) > txn_ms:
            raise OptionError(
                f"option kafka.delivery.timeout.ms={given} exceeds kafka.transaction.timeout.ms={txn_ms}: under "
                "exactly_once a record must be delivered within its transaction (librdkafka refuses the pair); "
                f"lower kafka.delivery.timeout.ms to at most {txn_ms}, or raise kafka.transaction.timeout.ms")
    elif "transaction.timeout.ms" in conf:
        raise OptionError("option kafka.transaction.timeout.ms applies only with delivery.guarantee=exactly_once; "
                          "set that too, or remove it")
    return guarantee


def _id_part(name: str, value: str, lengths: str) -> str:
    """A value that becomes part of a Kafka or WAL identifier (``lengths``: a regex count such as ``1,200``)."""
    if not re.fullmatch(rf"[A-Za-z0-9._-]{{{lengths}}}", value):
        raise OptionError(f"option {name}={value!r} may hold only letters, digits, '.', '_' and '-' "
                          f"({lengths.replace(',', ' to ')} of them)")
    return value


def unknown_options(names: list[str]) -> str:
    """The refusal of options the sink does not know: each as given, with the known option nearest to it.

    >>> print(unknown_options(["delivery.guarentee"]))  # doctest: +ELLIPSIS
    unknown option delivery.guarentee: did you mean delivery.guarantee? (names are case-insensitive; ...
    """
    parts = []
    for name in names:
        near = suggest(name, _REGISTRY_NAMES)
        parts.append(f"{name}: did you mean {near}?" if near else f"{name}: no option of the sink is near it")
    return (f"unknown option{'s' if len(parts) > 1 else ''} {'; '.join(parts)} (names are case-insensitive; producer "
            "settings take the 'kafka.' prefix; docs/operations.md, Options in detail, lists the sink's own)")


def parse_options(options: Mapping[str, str]) -> SinkOptions:
    """Validate the options of one write and return what the tasks need.

    >>> o = parse_options({"kafka.bootstrap.servers": "127.0.0.1:9092", "topic": "events"})
    >>> o.producer_config()["acks"], o.producer_config()["partitioner"], o.topic
    ('all', 'murmur2_random', 'events')
    >>> parse_options({"kafka.bootstrap.servers": "b:9092", "kafka.acks": "1"})
    Traceback (most recent call last):
    ...
    recoverable_sink.errors.OptionError: option kafka.acks=1 would let Kafka acknowledge ...
    """
    lowered = {str(k).lower(): str(v) for k, v in options.items()}
    kafka = {k[len(KAFKA_PREFIX):]: v for k, v in lowered.items() if k.startswith(KAFKA_PREFIX)}
    unknown = sorted(str(k) for k in options
                     if not str(k).lower().startswith((KAFKA_PREFIX, FAULT_PREFIX, TOPIC_CREATION_PREFIX))
                     and str(k).lower() not in _SINK_OPTIONS | _IGNORED)
    if unknown:
        raise OptionError(unknown_options(unknown))
    topic = lowered.get("topic")
    if topic is not None and not topic.strip():
        raise OptionError("option topic is empty: give a topic name, or drop the option and use a topic column")
    conf = _producer_config(kafka)
    guarantee = _guarantee(lowered.get("delivery.guarantee", AT_LEAST_ONCE), conf)
    must_exist = _parse_bool("topic.mustExist", lowered.get("topic.mustexist", "false"))
    creation = _topic_creation(lowered, must_exist)
    return SinkOptions(
        producer_items=tuple(sorted(conf.items())),
        topic=topic,
        topic_must_exist=must_exist,
        topic_creation=creation,
        wal_path=lowered.get("wal.path") or None,
        wal_max_bytes=parse_size("wal.maxBytes", lowered.get("wal.maxbytes", str(DEFAULT_WAL_MAX_BYTES))),
        wal_enabled=_parse_bool("wal.enabled", lowered.get("wal.enabled", "true")),
        retention_seconds=parse_number(
            "wal.retentionHours", lowered.get("wal.retentionhours", str(DEFAULT_RETENTION_HOURS))
        ) * 3600,
        proof_grace_seconds=_at_least(1, "wal.proofGraceSeconds", parse_number(
            "wal.proofGraceSeconds", lowered.get("wal.proofgraceseconds", str(DEFAULT_PROOF_GRACE_SECONDS)))),
        proof_max_bytes=parse_size("wal.proofMaxBytes", lowered.get("wal.proofmaxbytes", str(DEFAULT_PROOF_MAX_BYTES))),
        rate_records_per_s=_positive("rate.recordsPerSecond", lowered.get("rate.recordspersecond")),
        rate_bytes_per_s=parse_size("rate.bytesPerSecond", lowered["rate.bytespersecond"])
        if "rate.bytespersecond" in lowered else None,
        registry=tuple(r for r in (_registry(lowered, f) for f in ("key", "value")) if r is not None),
        preflight_timeout_s=parse_number(
            "preflight.timeoutMs", lowered.get("preflight.timeoutms", str(DEFAULT_PREFLIGHT_TIMEOUT_MS))
        ) / 1000,
        summary_path=lowered.get("summary.path") or None,
        write_id=None if "wal.writeid" not in lowered else _id_part("wal.writeId", lowered["wal.writeid"], "1,200"),
        guarantee=guarantee,
        transactional_id_prefix=_id_part("transactional.id.prefix", lowered.get(
            "transactional.id.prefix", DEFAULT_TRANSACTIONAL_ID_PREFIX), "0,100"),
        native_producer=_parse_bool("producer.native", lowered.get("producer.native", "true")),
        errors=_error_tolerance(lowered, topic),
        proof=_proof(lowered),
        faults=parse_faults(lowered),
    )


def _proof(lowered: Mapping[str, str]) -> ProofPlace:
    """The proof.* options: the proof topic (on by default), or proof only in the WAL."""
    if not _parse_bool("proof.kafka", lowered.get("proof.kafka", "true")):
        extra = sorted(k for k in lowered if k.startswith("proof.") and k != "proof.kafka")
        if extra:
            raise OptionError(f"option(s) {', '.join(extra)} apply only to the proof topic, which proof.kafka=false "
                              "turns off; remove them, or drop proof.kafka=false")
        return WalOnlyProof()
    prefix = lowered.get("transactional.id.prefix", DEFAULT_TRANSACTIONAL_ID_PREFIX)
    topic = lowered.get("proof.topic", f"{prefix}proof")
    if not re.fullmatch(r"[A-Za-z0-9._-]{1,249}", topic) or topic in (".", ".."):
        raise OptionError(f"option proof.topic={topic!r} is not a valid Kafka topic name (letters, digits, '.', '_' "
                          "and '-', 1 to 249 of them)")
    partitions = int(parse_number("proof.partitions", lowered.get("proof.partitions",
                                                                   str(DEFAULT_PROOF_PARTITIONS)), int))
    if partitions < 1:
        raise OptionError(f"option proof.partitions={partitions} must be at least 1 (2 or more keep the directory "
                          "apart from the proof)")
    raw = lowered.get("proof.replicationfactor", "-1").strip()
    replication = int(raw) if re.fullmatch(r"-?\d+", raw) else 0
    if replication == 0 or replication < -1:
        raise OptionError(f"option proof.replicationFactor={replication} must be -1 (the brokers' "
                          "default.replication.factor) or at least 1")
    hours = parse_number("proof.retentionHours", lowered.get("proof.retentionhours",
                                                              str(DEFAULT_PROOF_RETENTION_HOURS)))
    if hours <= 0:
        raise OptionError(f"option proof.retentionHours={hours:g} must be more than 0: it is how long a write can "
                          "be re-run exactly from any host")
    fail = _parse_bool("proof.failOnExpired", lowered.get("proof.failonexpired", "true"))
    return KafkaProof(topic=topic, partitions=partitions, replication=replication, retention_hours=hours,
                      fail_on_expired=fail)


def _topic_creation(lowered: Mapping[str, str], must_exist: bool) -> TopicCreation:
    """topic.creation.default.partitions, .replication.factor and any other topic config under that prefix.

    >>> _topic_creation({"topic.creation.default.partitions": "6", "topic.creation.default.retention.ms": "60000"},
    ...                 False)
    TopicCreation(partitions=6, replication_factor=-1, configs=(('retention.ms', '60000'),))
    """
    given = {k[len(TOPIC_CREATION_PREFIX):]: v.strip() for k, v in lowered.items()
             if k.startswith(TOPIC_CREATION_PREFIX)}
    if not given:
        return TopicCreation()
    if must_exist:
        raise OptionError(f"option(s) {', '.join(TOPIC_CREATION_PREFIX + k for k in sorted(given))} say how the "
                          "sink creates a missing topic, and topic.mustExist=true says it never creates one: drop one "
                          "of them")

    def count(name: str, upper: int) -> int:
        value = given.pop(name, "-1")
        try:
            number = int(value)
        except ValueError:
            number = 0
        if number != -1 and not 1 <= number <= upper:
            raise OptionError(f"option {TOPIC_CREATION_PREFIX}{name}={value!r} must be a whole number from 1 to "
                              f"{upper}, or -1 for the brokers' default")
        return number

    partitions = count("partitions", 2**31 - 1)
    replication = count("replication.factor", 2**15 - 1)
    empty = [k for k, v in given.items() if not k or not v]
    if empty:
        raise OptionError(f"option {TOPIC_CREATION_PREFIX}{empty[0]} needs a topic config name and a value (e.g. "
                          f"{TOPIC_CREATION_PREFIX}cleanup.policy=compact)")
    return TopicCreation(partitions, replication, tuple(sorted(given.items())))


def _error_tolerance(lowered: Mapping[str, str], topic: str | None) -> ErrorTolerance:
    """errors.tolerance and errors.deadletterqueue.topic.name, Kafka Connect's names for the same choice."""
    tolerance = lowered.get("errors.tolerance", "none").strip().lower()
    dead = (lowered.get("errors.deadletterqueue.topic.name") or "").strip()
    if tolerance not in ("none", "all"):
        raise OptionError(f"option errors.tolerance={tolerance!r} must be none (the default: a record Kafka would "
                          "refuse fails the write) or all (such records go to errors.deadletterqueue.topic.name)")
    if tolerance == "none":
        if dead:
            raise OptionError("option errors.deadletterqueue.topic.name is set but errors.tolerance is none, so no "
                              "record would go there: set errors.tolerance=all, or drop the dead-letter topic")
        return FailOnRefusal()
    if not dead:
        raise OptionError("option errors.tolerance=all needs errors.deadletterqueue.topic.name: the sink never drops "
                          "a record, it sends each refused one there; name the dead-letter topic")
    if dead == topic:
        raise OptionError(f"option errors.deadletterqueue.topic.name={dead!r} is the topic the records go to: name "
                          "another topic for the records Kafka refuses")
    return DeadLetterTopic(dead)
