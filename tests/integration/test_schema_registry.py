"""Schema Registry framing on real Spark, a real broker and a real registry (Apicurio Registry's
Confluent-compatible API, testing.schema_registry): Avro binary from Spark's to_avro, registered once on the
driver and framed in every record, read back by confluent-kafka's AvroDeserializer, an independent reader; a
schema the registry refuses, and a registry that is down, fail on the driver before any task runs."""

import json
import uuid

import pytest
from confluent_kafka import Consumer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext
from pyspark.sql import functions as F
from pyspark.sql.avro.functions import to_avro

from recoverable_sink import RecoverableKafkaDataSource
from testing.kafka_check import count_records
from testing.kafka_local import free_port
from testing.spark import sink_writer

SCHEMA = json.dumps({"type": "record", "name": "Order", "namespace": "shop",
                     "fields": [{"name": "id", "type": "long"}, {"name": "item", "type": "string"}]})


@pytest.fixture(scope="module", autouse=True)
def registered(spark):
    spark.dataSource.register(RecoverableKafkaDataSource)


def orders(spark, rows, schema=SCHEMA):
    return spark.range(rows, numPartitions=2).select(
        F.col("id").cast("string").alias("key"),
        to_avro(F.struct(F.col("id"), F.concat(F.lit("item-"), F.col("id")).alias("item")), schema).alias("value"))


def read_back(bootstrap, topic, registry, expected):
    """Every record of ``topic`` (read_committed), its value decoded by confluent-kafka's AvroDeserializer."""
    deserialize = AvroDeserializer(SchemaRegistryClient({"url": registry.url}))
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"read-{uuid.uuid4().hex}",
                         "auto.offset.reset": "earliest", "isolation.level": "read_committed",
                         "enable.auto.commit": False})
    consumer.subscribe([topic])
    out = []
    try:
        idle = 0
        while len(out) < expected and idle < 30:
            msg = consumer.poll(1.0)
            if msg is None:
                idle += 1
                continue
            assert msg.error() is None, msg.error()
            out.append((msg.key(), msg.value()[:5],
                        deserialize(msg.value(), SerializationContext(topic, MessageField.VALUE))))
    finally:
        consumer.close()
    return out


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
def test_avro_values_are_framed_with_the_registered_schema_id_and_read_back_by_an_independent_reader(
        spark, kafka, new_topic, tmp_path, registry, guarantee):
    topic, rows = new_topic(partitions=2), 2000
    sink_writer(orders(spark, rows), kafka.bootstrap_servers, topic, tmp_path / "wal", **{
        "delivery.guarantee": guarantee, "value.schema.registry.url": registry.url, "value.avro.schema": SCHEMA,
    }).save()
    versions = registry.request("GET", f"/subjects/{topic}-value/versions/latest")
    assert json.loads(versions["schema"]) == json.loads(SCHEMA)  # registered under TopicNameStrategy's subject
    got = read_back(kafka.bootstrap_servers, topic, registry, rows)
    assert {frame for _, frame, _ in got} == {b"\x00" + versions["id"].to_bytes(4, "big")}
    assert sorted((int(k), v["id"], v["item"]) for k, v in ((k, v) for k, _, v in got)) == [
        (i, i, f"item-{i}") for i in range(rows)]


def test_a_struct_value_is_encoded_by_the_sink_under_the_schema_it_derives_and_registers(spark, kafka, new_topic,
                                                                                        tmp_path, registry):
    topic, rows = new_topic(partitions=2), 2000
    df = spark.range(rows, numPartitions=2).select(
        F.col("id").cast("string").alias("key"),
        F.struct(F.col("id"), F.concat(F.lit("item-"), F.col("id")).alias("item"),
                 F.when(F.col("id") % 3 == 0, F.lit(None)).otherwise(F.col("id") / 2).alias("half")).alias("value"))
    sink_writer(df, kafka.bootstrap_servers, topic, tmp_path / "wal", **{
        "delivery.guarantee": "exactly_once", "value.schema.registry.url": registry.url}).save()
    registered = json.loads(registry.request("GET", f"/subjects/{topic}-value/versions/latest")["schema"])
    assert registered["name"] == "topLevelRecord"
    assert [(f["name"], f["type"]) for f in registered["fields"]] == [
        ("id", "long"), ("item", "string"), ("half", ["double", "null"])]
    got = read_back(kafka.bootstrap_servers, topic, registry, rows)
    assert sorted((int(k), v["id"], v["item"], v["half"]) for k, _, v in got) == [
        (i, i, f"item-{i}", None if i % 3 == 0 else i / 2) for i in range(rows)]


def test_a_schema_the_registry_refuses_fails_on_the_driver_naming_the_subject(spark, kafka, new_topic, tmp_path,
                                                                              registry):
    topic = new_topic()
    subject = f"{topic}-value"
    registry.request("POST", f"/subjects/{subject}/versions", {"schema": SCHEMA})
    registry.request("PUT", f"/config/{subject}", {"compatibility": "BACKWARD"})
    # A new required field without a default: a reader of the new schema cannot read the old records.
    changed = json.loads(SCHEMA)
    changed["fields"].append({"name": "price", "type": "long"})
    with pytest.raises(Exception, match=f"refused value.avro.schema for subject {subject} as incompatible"):
        sink_writer(orders(spark, 10, json.dumps(changed)), kafka.bootstrap_servers, topic, tmp_path / "wal", **{
            "value.schema.registry.url": registry.url, "value.avro.schema": json.dumps(changed)}).save()
    assert count_records(kafka.bootstrap_servers, topic, timeout_s=10) == 0


def test_a_registry_that_does_not_answer_fails_on_the_driver(spark, kafka, new_topic, tmp_path):
    topic, down = new_topic(), f"http://127.0.0.1:{free_port()}"
    with pytest.raises(Exception, match=f"the Schema Registry at {down} .* could not be reached"):
        sink_writer(orders(spark, 10), kafka.bootstrap_servers, topic, tmp_path / "wal", **{
            "value.schema.registry.url": down, "value.avro.schema": SCHEMA, "preflight.timeoutMs": "3000"}).save()
    assert count_records(kafka.bootstrap_servers, topic, timeout_s=10) == 0
