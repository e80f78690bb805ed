"""The sink on a real secured broker (testing/kafka_secure.py): SASL_SSL with SCRAM-SHA-512 and PLAIN users, a
CA made with openssl, ACLs under the StandardAuthorizer. The right credentials land every record; a wrong
password, an unknown CA, missing WRITE or transactional ACLs fail on the driver naming what is missing; a
refusal only the tasks can see loses nothing. No secret appears in an error."""

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
