"""Protobuf and JSON Schema framing on real Spark, a real broker and a real registry (Apicurio Registry's
Confluent-compatible API): each schema registered once on the driver with its schemaType, every value framed in
Confluent's wire format (the Protobuf message's index list after the id), read back by confluent-kafka's own
ProtobufDeserializer and JSONDeserializer, which fetch the writer's schema from the registry by that id."""

from __future__ import annotations

import json
import uuid

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.json_schema import JSONDeserializer
from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from pyspark.sql import functions as F

from recoverable_sink import RecoverableKafkaDataSource
from testing.kafka_check import read_topic
from testing.spark import sink_writer

ROWS = 2000
PROTO = """syntax = "proto3";
package shop;
// Two messages: the second is the one written, so its index list is not the one-byte [0].
message Header { string source = 1; }
message Order { int64 id = 1; string item = 2; }
"""
JSON_SCHEMA = json.dumps({"$schema": "http://json-schema.org/draft-07/schema#", "title": "Order", "type": "object",
                          "properties": {"id": {"type": "integer"}, "item": {"type": "string"}},
                          "required": ["id", "item"]})


@pytest.fixture(scope="module", autouse=True)
def registered(spark):
    spark.dataSource.register(RecoverableKafkaDataSource)


def _order_class():
    """shop.Order as a generated message class, built from its descriptor (no protoc here)."""
    fd = descriptor_pb2.FileDescriptorProto(name=f"shop-{uuid.uuid4().hex}.proto", package="shop", syntax="proto3")
    fd.message_type.add(name="Header").field.add(name="source", number=1, type=9, label=1)
    order = fd.message_type.add(name="Order")
    order.field.add(name="id", number=1, type=3, label=1)
    order.field.add(name="item", number=2, type=9, label=1)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("shop.Order"))


def _read(bootstrap: str, topic: str, deserialize, expected: int) -> list:
    """Every value of ``topic`` (read_committed), decoded by ``deserialize``."""
    context = SerializationContext(topic, MessageField.VALUE)
    return [deserialize(r["value"], context) for r in read_topic(bootstrap, topic, 120, expected=expected)]


@pytest.mark.parametrize("mode", ["at_least_once", "exactly_once"])
def test_protobuf_values_are_framed_with_their_message_index_and_read_back_by_the_registrys_deserializer(
        spark, kafka, new_topic, registry, tmp_path, mode):
    order = _order_class()
    values = [(str(i), order(id=i, item=f"item-{i}").SerializeToString()) for i in range(ROWS)]
    df = spark.createDataFrame(values, "key string, value binary").repartition(2)
    topic = new_topic(partitions=2)
    sink_writer(df, kafka.bootstrap_servers, topic, tmp_path / "wal",
                **{"delivery.guarantee": mode, "value.schema.registry.url": registry.url,
                   "value.schema.type": "protobuf", "value.protobuf.schema": PROTO,
                   "value.protobuf.message": "shop.Order",
                   "transactional.id.prefix": f"pb-{uuid.uuid4().hex[:8]}-"}).save()
    deserialize = ProtobufDeserializer(order, {"use.deprecated.format": False})
    got = _read(kafka.bootstrap_servers, topic, deserialize, ROWS)
    assert sorted((m.id, m.item) for m in got) == [(i, f"item-{i}") for i in range(ROWS)]
    subject = SchemaRegistryClient({"url": registry.url}).get_latest_version(f"{topic}-value")
    assert subject.schema.schema_type == "PROTOBUF"


@pytest.mark.parametrize("shape", ["struct", "to_json"])
def test_json_schema_values_from_a_struct_or_to_json_are_read_back_by_the_registrys_deserializer(
        spark, kafka, new_topic, registry, tmp_path, shape):
    order = F.struct(F.col("id"), F.concat(F.lit("item-"), F.col("id")).alias("item"))
    value = order if shape == "struct" else F.to_json(order)
    df = spark.range(ROWS, numPartitions=2).select(F.col("id").cast("string").alias("key"), value.alias("value"))
    topic = new_topic(partitions=2)
    sink_writer(df, kafka.bootstrap_servers, topic, tmp_path / "wal",
                **{"value.schema.registry.url": registry.url, "value.schema.type": "json",
                   "value.json.schema": JSON_SCHEMA}).save()
    deserialize = JSONDeserializer(JSON_SCHEMA, schema_registry_client=SchemaRegistryClient({"url": registry.url}))
    got = _read(kafka.bootstrap_servers, topic, deserialize, ROWS)
    assert sorted((d["id"], d["item"]) for d in got) == [(i, f"item-{i}") for i in range(ROWS)]


def test_a_protobuf_message_the_schema_lacks_is_refused_on_the_driver_naming_the_messages(spark, kafka, new_topic,
                                                                                          registry, tmp_path):
    df = spark.createDataFrame([("k", b"\x08\x01")], "key string, value binary")
    with pytest.raises(Exception, match=r"value.protobuf.message='shop.Invoice' is not a message of "
                                        r"value.protobuf.schema \(it declares Header, Order\)"):
        sink_writer(df, kafka.bootstrap_servers, new_topic(), tmp_path / "wal",
                    **{"value.schema.registry.url": registry.url, "value.schema.type": "protobuf",
                       "value.protobuf.schema": PROTO, "value.protobuf.message": "shop.Invoice"}).save()
