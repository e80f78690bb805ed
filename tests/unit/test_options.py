"""Option parsing: Java-client names are translated, guarantee-breaking settings refused, secrets hidden."""

from dataclasses import replace

import pytest

from recoverable_sink.driver.registry import subject_for
from recoverable_sink.errors import OptionError
from recoverable_sink.options import KafkaProof, WalOnlyProof, parse_options, parse_size

BASE = {"kafka.bootstrap.servers": "127.0.0.1:9092", "topic": "t"}


def test_safe_producer_defaults_are_set():
    conf = parse_options(BASE).producer_config()
    assert conf["acks"] == "all"
    assert conf["enable.idempotence"] == "true"
    assert conf["partitioner"] == "murmur2_random"


def test_default_batches_stay_below_half_a_brokers_g1_region_and_a_users_batch_size_wins():
    """A request of half a G1 region or more (1 MB regions under Kafka's default 1 GB heap) is a humongous
    allocation on the broker: a full default batch plus one 100 KB record must stay below 512 KiB."""
    assert int(parse_options(BASE).producer_config()["batch.size"]) + 100_000 < 512 * 1024
    assert parse_options({**BASE, "kafka.batch.size": "16384"}).producer_config()["batch.size"] == "16384"


def test_user_kafka_setting_wins_when_it_keeps_the_guarantees():
    conf = parse_options({**BASE, "kafka.linger.ms": "20", "kafka.compression.type": "lz4",
                          "kafka.partitioner": "consistent_random"}).producer_config()
    assert (conf["linger.ms"], conf["compression.type"], conf["partitioner"]) == ("20", "lz4", "consistent_random")


def test_java_client_names_are_translated_to_librdkafka():
    conf = parse_options({**BASE, "kafka.max.request.size": "2000000", "kafka.buffer.memory": "33554432",
                          "kafka.send.buffer.bytes": "131072"}).producer_config()
    assert conf["message.max.bytes"] == "2000000"
    assert conf["queue.buffering.max.kbytes"] == "32768"
    assert conf["socket.send.buffer.bytes"] == "131072"
    assert "max.request.size" not in conf


def test_jaas_config_becomes_username_and_password():
    jaas = 'org.apache.kafka.common.security.plain.PlainLoginModule required username="alice" password="s3cr3t!";'
    conf = parse_options({**BASE, "kafka.sasl.jaas.config": jaas}).producer_config()
    assert (conf["sasl.username"], conf["sasl.password"]) == ("alice", "s3cr3t!")


@pytest.mark.parametrize(
    ("option", "value", "named"),
    [
        ("kafka.acks", "1", "kafka.acks=1"),
        ("kafka.acks", "0", "kafka.acks=0"),
        ("kafka.enable.idempotence", "false", "kafka.enable.idempotence=false"),
        ("kafka.key.serializer", "org.apache.kafka.common.serialization.StringSerializer", "kafka.key.serializer"),
        ("kafka.value.serializer", "x", "kafka.value.serializer"),
        ("kafka.partitioner.class", "com.example.P", "kafka.partitioner.class"),
        ("kafka.transactional.id", "t1", "kafka.transactional.id"),
        ("kafka.ssl.truststore.location", "/x.jks", "kafka.ssl.ca.location"),
        ("wal.maxBytes", "lots", "wal.maxBytes"),
        ("wal.enabled", "maybe", "wal.enabled"),
        ("walpath", "/x", "walpath"),
        ("topic", " ", "option topic is empty"),
    ],
)
def test_bad_options_are_refused_with_the_option_named(option, value, named):
    with pytest.raises(OptionError, match=named.replace(".", r"\.").replace("=", "=")):
        parse_options({**BASE, option: value})


def test_missing_bootstrap_servers_is_named():
    with pytest.raises(OptionError, match=r"kafka\.bootstrap\.servers is required"):
        parse_options({"topic": "t"})


def test_options_are_case_insensitive_like_spark():
    opts = parse_options({**BASE, "WAL.MAXBYTES": "2m", "wal.Path": "/data/wal"})
    assert opts.wal_max_bytes == 2 * 1024 * 1024
    assert opts.wal_path == "/data/wal"


def test_wal_proof_max_bytes_defaults_to_16_gib_and_takes_a_size():
    assert parse_options(BASE).proof_max_bytes == 16 << 30
    assert parse_options({**BASE, "wal.proofMaxBytes": "512m"}).proof_max_bytes == 512 << 20
    with pytest.raises(OptionError, match=r"wal\.proofMaxBytes='lots' is not a size"):
        parse_options({**BASE, "wal.proofMaxBytes": "lots"})


def test_sizes_accept_units():
    assert parse_size("wal.maxBytes", "512") == 512
    assert parse_size("wal.maxBytes", "3k") == 3072
    assert parse_size("wal.maxBytes", "1g") == 1 << 30


def test_secrets_never_appear_in_repr_or_scrubbed_text():
    opts = parse_options({**BASE, "kafka.sasl.password": "hunter2-secret", "kafka.ssl.key.password": "kp-99"})
    assert "hunter2-secret" not in repr(opts)
    assert "kp-99" not in repr(opts)
    assert opts.redacted_producer_config()["sasl.password"] == "***"
    assert opts.scrub("auth failed for hunter2-secret") == "auth failed for ***"


@pytest.mark.parametrize("name", ["sasl.oauthbearer.config", "sasl.oauthbearer.extensions", "ssl.ca.pem",
                                  "sasl.oauthbearer.assertion.private.key.passphrase"])
def test_every_property_librdkafka_calls_sensitive_is_redacted(name):
    opts = parse_options({**BASE, f"kafka.{name}": "principal=Zx81-hidden"})
    assert "Zx81-hidden" not in repr(opts)
    assert opts.redacted_producer_config()[name] == "***"
    assert opts.scrub("cannot parse principal=Zx81-hidden") == "cannot parse ***"


def test_at_least_once_is_the_default_guarantee():
    options = parse_options(BASE)
    assert options.guarantee == "at_least_once" and not options.exactly_once
    assert "transaction.timeout.ms" not in options.producer_config()


def test_exactly_once_gets_a_transaction_timeout_and_a_prefix():
    options = parse_options({**BASE, "delivery.guarantee": "EXACTLY_ONCE", "transactional.id.prefix": "team-a."})
    assert options.exactly_once
    assert options.producer_config()["transaction.timeout.ms"] == "900000"
    from recoverable_sink.producer.transactions import transactional_id
    assert transactional_id(options, "w", 7) == "team-a.w-7"


@pytest.mark.parametrize(("extra", "named"), [
    ({"delivery.guarantee": "at_most_once"}, "delivery.guarantee"),
    ({"transactional.id.prefix": "a b"}, "transactional.id.prefix"),
    ({"kafka.transaction.timeout.ms": "60000"}, "exactly_once"),
    ({"kafka.transactional.id": "mine"}, "delivery.guarantee=exactly_once"),
])
def test_transaction_options_are_checked_with_the_option_named(extra, named):
    with pytest.raises(OptionError, match=named):
        parse_options({**BASE, **extra})


def test_admin_and_consumer_clients_get_connection_settings_only():
    from recoverable_sink.options import client_config
    options = parse_options({**BASE, "kafka.security.protocol": "SASL_SSL", "kafka.sasl.username": "u",
                             "kafka.linger.ms": "5"})
    conf = client_config(options)
    assert conf["security.protocol"] == "SASL_SSL" and conf["sasl.username"] == "u"
    assert "linger.ms" not in conf and "acks" not in conf and "partitioner" not in conf


def test_exactly_once_fits_the_delivery_timeout_to_a_shorter_transaction_timeout_or_refuses_the_pair():
    base = {"kafka.bootstrap.servers": "b:9092", "delivery.guarantee": "exactly_once"}
    fitted = parse_options({**base, "kafka.transaction.timeout.ms": "60000"}).producer_config()
    assert (fitted["transaction.timeout.ms"], fitted["delivery.timeout.ms"]) == ("60000", "60000")
    assert parse_options(base).producer_config()["delivery.timeout.ms"] == "300000"
    with pytest.raises(OptionError, match=r"kafka\.delivery\.timeout\.ms=120000 exceeds "
                                          r"kafka\.transaction\.timeout\.ms=60000.*at most 60000"):
        parse_options({**base, "kafka.transaction.timeout.ms": "60000", "kafka.delivery.timeout.ms": "120000"})


REGISTRY_SCHEMA = '{"type": "record", "name": "Order", "namespace": "shop", "fields": []}'


def test_schema_registry_options_are_checked_on_the_driver_and_the_credentials_kept_secret():
    base = {**BASE, "value.schema.registry.url": "http://r:8081"}
    with pytest.raises(OptionError, match="not an http"):
        parse_options({**base, "value.schema.registry.url": "registry:8081"})
    with pytest.raises(OptionError, match="value.avro.schema is not JSON"):
        parse_options({**base, "value.avro.schema": "{record"})
    with pytest.raises(OptionError, match="one of TopicNameStrategy"):
        parse_options({**base, "value.avro.schema": REGISTRY_SCHEMA, "value.subject.name.strategy": "Nope"})
    with pytest.raises(OptionError, match="apply only with key.schema.registry.url"):
        parse_options({**base, "value.avro.schema": REGISTRY_SCHEMA, "key.subject": "k"})
    options = parse_options({**base, "value.avro.schema": REGISTRY_SCHEMA, "value.subject.name.strategy":
                             "io.confluent.kafka.serializers.subject.TopicRecordNameStrategy",
                             "value.schema.registry.basic.auth.user.info": "me:s3cret"})
    assert subject_for(options.registry[0], "t", REGISTRY_SCHEMA) == "t-shop.Order"
    assert "s3cret" not in repr(options) and options.scrub("auth me:s3cret") == "auth ***"
    with pytest.raises(OptionError, match="has no topic"):
        subject_for(replace(options.registry[0], strategy="TopicNameStrategy"), None, REGISTRY_SCHEMA)


def test_the_proof_options_name_the_topic_its_settings_and_what_happens_when_the_retention_deleted_proof():
    proof = parse_options(BASE).proof
    assert isinstance(proof, KafkaProof)
    assert (proof.topic, proof.partitions, proof.replication, proof.retention_hours, proof.fail_on_expired) == (
        "recoverable-kafka-proof", 9, -1, 168.0, True)
    proof = parse_options({**BASE, "transactional.id.prefix": "app-", "proof.retentionHours": "720",
                           "proof.failOnExpired": "false"}).proof
    assert isinstance(proof, KafkaProof)
    assert (proof.topic, proof.retention_hours, proof.fail_on_expired) == ("app-proof", 720.0, False)
    assert isinstance(parse_options({**BASE, "proof.kafka": "false"}).proof, WalOnlyProof)
    with pytest.raises(OptionError, match="proof.failOnExpired='sometimes' must be true or false"):
        parse_options({**BASE, "proof.failOnExpired": "sometimes"})
    with pytest.raises(OptionError, match="apply only to the proof topic"):
        parse_options({**BASE, "proof.kafka": "false", "proof.topic": "x"})


@pytest.mark.parametrize(("given", "near"), [
    ("delivery.guarentee", "delivery.guarantee"),
    ("Topic.MustExists", "topic.mustExist"),
    ("wal.maxbyte", "wal.maxBytes"),
    ("bootstrap.servers", "kafka.bootstrap.servers"),  # a producer setting without its prefix
    ("value.schema.registry.uri", "value.schema.registry.url"),
])
def test_an_unknown_option_is_named_as_given_with_the_nearest_known_one(given, near):
    with pytest.raises(OptionError) as refused:
        parse_options({**BASE, given: "x"})
    message = str(refused.value)
    assert message.startswith(f"unknown option {given}: did you mean {near}?"), message
    assert "wal.proofGraceSeconds" not in message  # not the whole list of options


def test_an_unknown_option_near_nothing_says_so():
    with pytest.raises(OptionError, match="unknown option colour: no option of the sink is near it"):
        parse_options({**BASE, "colour": "blue"})


def test_a_misspelt_bootstrap_servers_is_named_with_the_right_name():
    with pytest.raises(OptionError, match=r"option kafka\.bootstrap\.server is not a producer setting: did you mean "
                                          r"kafka\.bootstrap\.servers\? It is required"):
        parse_options({"kafka.bootstrap.server": "127.0.0.1:9092", "topic": "t"})


def test_topic_creation_options_default_to_the_brokers_and_take_any_topic_config():
    assert parse_options(BASE).topic_creation.brokers_defaults
    how = parse_options({**BASE, "topic.creation.default.partitions": "6",
                         "Topic.Creation.Default.Replication.Factor": "-1",
                         "topic.creation.default.cleanup.policy": "compact"}).topic_creation
    assert (how.partitions, how.replication_factor, how.configs) == (6, -1, (("cleanup.policy", "compact"),))


@pytest.mark.parametrize(("option", "value"), [("topic.creation.default.partitions", "0"),
                                               ("topic.creation.default.partitions", "six"),
                                               ("topic.creation.default.replication.factor", "40000")])
def test_topic_creation_counts_must_be_whole_and_in_range(option, value):
    with pytest.raises(OptionError, match=f"option {option}={value!r} must be a whole number from 1 to"):
        parse_options({**BASE, option: value})


def test_topic_creation_options_contradict_topic_must_exist():
    with pytest.raises(OptionError, match=r"topic\.creation\.default\.partitions say how the sink creates a missing "
                                          r"topic, and topic\.mustExist=true says it never creates one"):
        parse_options({**BASE, "topic.creation.default.partitions": "3", "topic.mustExist": "true"})


def test_a_misspelt_topic_creation_option_is_named_with_the_right_one():
    with pytest.raises(OptionError, match=r"unknown option topic\.creation\.defaults\.partitions: did you mean "
                                          r"topic\.creation\.default\.partitions\?"):
        parse_options({**BASE, "topic.creation.defaults.partitions": "3"})
