"""The sink on a real secured broker (testing/kafka_secure.py): SASL_SSL with SCRAM-SHA-512 and PLAIN users, a
CA made with openssl, ACLs under the StandardAuthorizer. The right credentials land every record; a wrong
password, an unknown CA, missing WRITE, transactional or proof topic ACLs fail on the driver naming what is missing;
a refusal only the tasks can see loses nothing. No secret appears in an error.

The proof topic's ACLs: READ and WRITE on it (DESCRIBE follows), CREATE where the sink is to make it; the readers'
group (``<transactional.id.prefix>proof-reader``) needs none, since they never use it."""

import os
import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka.admin import AclOperation, NewTopic, ResourceType

from recoverable_sink import RecoverableKafkaDataSource
from testing.kafka_check import read_topic
from testing.kafka_secure import USERS, SecuredKafka
from testing.spark import sink_writer

WRONG_PASSWORD = "wrong-Password-9f3"
PROOF = "recoverable-kafka-proof"  # the default proof topic
PROOF_CONFIG = {"cleanup.policy": "compact,delete", "retention.ms": "604800000"}


@pytest.fixture(scope="module")
def secured(tmp_path_factory, spark) -> Iterator[SecuredKafka]:
    spark.dataSource.register(RecoverableKafkaDataSource)
    with SecuredKafka(tmp_path_factory.mktemp("secured")) as broker:
        topic = (AclOperation.WRITE, AclOperation.DESCRIBE)
        broker.allow("alice", ResourceType.TOPIC, "sec-", *topic, AclOperation.READ, AclOperation.DESCRIBE_CONFIGS)
        broker.allow("alice", ResourceType.TRANSACTIONAL_ID, "recoverable-kafka-", AclOperation.WRITE,
                     AclOperation.DESCRIBE)
        broker.allow("alice", ResourceType.GROUP, "recoverable-kafka-", AclOperation.READ, AclOperation.DESCRIBE)
        broker.allow("bob", ResourceType.TOPIC, "sec-", *topic)
        broker.allow("carol", ResourceType.TOPIC, "sec-", AclOperation.DESCRIBE)
        broker.allow("dave", ResourceType.TOPIC, "sec-", *topic)
        broker.allow("dave", ResourceType.TOPIC, "locked-", AclOperation.DESCRIBE)
        broker.allow("erin", ResourceType.TOPIC, "sec-", *topic)
        broker.allow("frank", ResourceType.TOPIC, "sec-", *topic)
        # The proof topic: alice may create her own (a prefix of its name); the default one is made here, as an
        # administrator would, and the others may read and write it (erin only see it; frank nothing).
        broker.allow("alice", ResourceType.TOPIC, PROOF, AclOperation.CREATE, AclOperation.READ, AclOperation.WRITE,
                     AclOperation.DESCRIBE_CONFIGS)
        for user in ("bob", "dave"):
            broker.allow(user, ResourceType.TOPIC, PROOF, AclOperation.READ, AclOperation.WRITE)
        broker.allow("erin", ResourceType.TOPIC, PROOF, AclOperation.DESCRIBE)
        for future in broker.admin().create_topics([NewTopic(PROOF, 9, 1, config=PROOF_CONFIG)]).values():
            future.result()
        yield broker


def new_secured_topic(broker: SecuredKafka, prefix: str = "sec-", partitions: int = 2) -> str:
    name = f"{prefix}{uuid.uuid4().hex[:10]}"
    for future in broker.admin().create_topics([NewTopic(name, partitions, 1)]).values():
        future.result()
    return name


def write(spark, broker, topic, wal, options, rows=2000, **extra):
    df = spark.range(rows, numPartitions=2).selectExpr("CAST(id AS STRING) AS key", "CAST(id AS STRING) AS value")
    sink_writer(df, broker.bootstrap_servers, topic, wal, **{**options, **extra}).save()


def values(broker, topic, expected):
    return sorted(r["value"] for r in read_topic(broker.internal_bootstrap, topic, 60, expected=expected))


def everything(rows=2000):
    return sorted(str(i).encode() for i in range(rows))


def test_a_scram_user_with_write_acls_lands_every_record(spark, secured, tmp_path):
    topic = new_secured_topic(secured)
    write(spark, secured, topic, tmp_path / "wal", secured.client_options("alice"))
    assert values(secured, topic, 2000) == everything()


def test_a_plain_user_given_as_the_java_clients_jaas_config_lands_every_record(spark, secured, tmp_path):
    topic = new_secured_topic(secured)
    write(spark, secured, topic, tmp_path / "wal", secured.client_options("bob", jaas=True))
    assert values(secured, topic, 2000) == everything()


def test_exactly_once_with_transactional_acls_lands_every_record_once(spark, secured, tmp_path):
    topic = new_secured_topic(secured)
    write(spark, secured, topic, tmp_path / "wal", secured.client_options("alice"),
          **{"delivery.guarantee": "exactly_once"})
    assert values(secured, topic, 2000) == everything()


def refused_on_the_driver(spark, secured, tmp_path, options, match, **extra) -> str:
    with pytest.raises(Exception, match=match) as caught:
        write(spark, secured, new_secured_topic(secured), tmp_path / "wal", options, **extra)
    assert not os.path.exists(tmp_path / "wal"), "a task ran: the refusal should come from the driver"
    text = str(caught.value)
    for _, password in USERS.values():
        assert password not in text
    return text


def test_a_wrong_password_fails_on_the_driver_naming_authentication(spark, secured, tmp_path):
    text = refused_on_the_driver(spark, secured, tmp_path, secured.client_options("alice", password=WRONG_PASSWORD),
                                 r"authentication with kafka\.bootstrap\.servers=.* failed.*kafka\.sasl\.password")
    assert WRONG_PASSWORD not in text


def test_an_unknown_ca_fails_on_the_driver_naming_the_ca_option(spark, secured, tmp_path):
    refused_on_the_driver(spark, secured, tmp_path, secured.client_options("alice", ca=secured.other_ca),
                          r"TLS with kafka\.bootstrap\.servers=.* failed.*kafka\.ssl\.ca\.location")


def test_a_user_without_write_on_the_topic_fails_on_the_driver_naming_the_acl(spark, secured, tmp_path):
    refused_on_the_driver(spark, secured, tmp_path, secured.client_options("carol"),
                          r"do not allow this principal to WRITE to the topic.*grant it WRITE")


def test_exactly_once_without_transactional_id_acls_fails_on_the_driver(spark, secured, tmp_path):
    refused_on_the_driver(spark, secured, tmp_path, secured.client_options("bob"),
                          r"exactly_once.*TRANSACTIONAL_ID_AUTHORIZATION_FAILED.*grant WRITE on TransactionalId",
                          **{"delivery.guarantee": "exactly_once"})


def test_a_refusal_only_tasks_see_loses_nothing_and_a_rerun_after_the_grant_delivers_every_record_once(
        spark, secured, tmp_path):
    """A topic column (the driver cannot know the topics) naming a topic the user may see but not write: the tasks
    fail with every record kept in the WAL; after the grant, the re-run under the same wal.writeId sends them."""
    topic = new_secured_topic(secured, "locked-")
    df = spark.range(2000, numPartitions=2).selectExpr("CAST(id AS STRING) AS value", f"'{topic}' AS topic")
    options = {**secured.client_options("dave"), "wal.writeId": f"locked-{uuid.uuid4().hex[:8]}",
               "kafka.delivery.timeout.ms": "10000"}
    with pytest.raises(Exception, match="TOPIC_AUTHORIZATION_FAILED"):
        sink_writer(df, secured.bootstrap_servers, None, tmp_path / "wal", **options).save()
    assert read_topic(secured.internal_bootstrap, topic, 5) == []
    secured.allow("dave", ResourceType.TOPIC, topic, AclOperation.WRITE, prefixed=False)
    sink_writer(df, secured.bootstrap_servers, None, tmp_path / "wal", **options).save()
    assert values(secured, topic, 2000) == everything()


def test_a_principal_with_create_on_the_proof_topic_has_the_sink_make_it_and_a_rerun_reads_it(
        spark, secured, tmp_path):
    """alice may CREATE topics named from the default proof topic's name: the sink makes hers (proof.topic) on the
    driver, and a wal.writeId write reads it (the directory) without any ACL on the readers' group."""
    topic, proof = new_secured_topic(secured), f"{PROOF}-{uuid.uuid4().hex[:6]}"
    options = {**secured.client_options("alice"), "proof.topic": proof, "wal.writeId": f"w-{uuid.uuid4().hex[:8]}"}
    write(spark, secured, topic, tmp_path / "wal", options)
    write(spark, secured, topic, tmp_path / "wal-elsewhere", options)  # a re-run that reads the proof, sends nothing
    assert values(secured, topic, 2000) == everything()
    assert proof in secured.admin().list_topics(timeout=30).topics


def test_read_and_write_on_the_proof_topic_without_a_group_acl_land_every_record_of_a_rerun_once(
        spark, secured, tmp_path):
    """bob has READ and WRITE on the proof topic and no group ACL at all: a wal.writeId write re-run where its WAL is
    not reads what the first run proved and sends nothing again."""
    topic = new_secured_topic(secured)
    options = {**secured.client_options("bob"), "wal.writeId": f"w-{uuid.uuid4().hex[:8]}"}
    write(spark, secured, topic, tmp_path / "wal", options)
    write(spark, secured, topic, tmp_path / "wal-elsewhere", options)
    assert values(secured, topic, 2000) == everything()


def test_a_principal_who_may_only_see_the_proof_topic_is_refused_on_the_driver_naming_read_and_write(
        spark, secured, tmp_path):
    text = refused_on_the_driver(spark, secured, tmp_path, secured.client_options("erin"),
                                 r"do not allow this principal to READ and WRITE the proof topic "
                                 r"recoverable-kafka-proof")
    assert "--operation Read --operation Write" in text and "proof.kafka=false" in text


def test_a_principal_without_any_proof_topic_acl_is_refused_on_the_driver_naming_the_topic(
        spark, secured, tmp_path):
    """frank cannot see the proof topic, nor create it: the driver names the ACLs to grant, or proof.kafka=false;
    with that option his write lands."""
    text = refused_on_the_driver(spark, secured, tmp_path, secured.client_options("frank"),
                                 r"proof topic recoverable-kafka-proof")
    assert "proof.kafka=false" in text
    topic = new_secured_topic(secured)
    write(spark, secured, topic, tmp_path / "wal-2", secured.client_options("frank"), **{"proof.kafka": "false"})
    assert values(secured, topic, 2000) == everything()
