"""Schema Registry framing decided on the driver, without a registry: the wire format an option set asks for, the
Protobuf message's index list, and the subject each strategy names."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from recoverable_sink.driver.registry import encode_indexes, protobuf_message, subject_for
from recoverable_sink.errors import OptionError
from recoverable_sink.executor.normalise import json_column
from recoverable_sink.options import AvroWire, JsonWire, ProtobufWire, parse_options

URL = {"kafka.bootstrap.servers": "b:9092", "topic": "orders", "value.schema.registry.url": "http://r:8081"}
PROTO = """syntax = "proto3"; package shop;
/* a comment with message Fake { } inside */
message Order { message Line { string sku = 1; } repeated Line lines = 1; map<string, string> tags = 2;
  oneof pay { string card = 3; string cash = 4; } enum Kind { A = 0; } }
message Invoice { string id = 1; }"""


def _framing(**given: str):
    [framing] = parse_options({**URL, **given}).registry
    return framing


def test_avro_is_the_default_and_each_other_format_takes_its_own_schema_option():
    assert _framing().wire == AvroWire()
    assert _framing(**{"value.schema.type": "protobuf", "value.protobuf.schema": PROTO}).wire == \
        ProtobufWire(PROTO, None)
    assert _framing(**{"value.schema.type": "JSON", "value.json.schema": "{}"}).wire == JsonWire("{}")


@pytest.mark.parametrize(("given", "refused"), [
    ({"value.schema.type": "thrift"}, "must be avro"),
    ({"value.schema.type": "protobuf"}, "needs value.protobuf.schema"),
    ({"value.schema.type": "json", "value.json.schema": "{not json"}, "value.json.schema is not JSON"),
    ({"value.schema.type": "json", "value.json.schema": "{}", "value.avro.schema": "{}"},
     "value.avro.schema do not apply with value.schema.type=json"),
])
def test_a_format_without_its_schema_or_with_anothers_is_refused_naming_the_option(given, refused):
    with pytest.raises(OptionError, match=refused):
        parse_options({**URL, **given})


def test_a_protobuf_messages_index_list_counts_nested_messages_and_skips_comments_enums_and_oneofs():
    assert protobuf_message(PROTO, None) == ("shop.Order", [0])
    assert protobuf_message(PROTO, "Order.Line") == ("shop.Order.Line", [0, 0])
    assert protobuf_message(PROTO, "shop.Invoice") == ("shop.Invoice", [1])
    field_named_message = 'message A { string message = 1 [(v.field) = {min_len: 1}]; message B {} }'
    assert protobuf_message(field_named_message, "A.B") == ("A.B", [0, 0])
    assert encode_indexes([1]) == b"\x02\x02" and encode_indexes([0]) == b"\x00"
    assert encode_indexes([0, 70]) == b"\x04\x00\x8c\x01"  # zigzag 140 as a two-byte varint


def test_record_name_strategies_name_protobuf_and_json_subjects_by_message_and_title():
    proto = _framing(**{"value.schema.type": "protobuf", "value.protobuf.schema": PROTO,
                        "value.protobuf.message": "Invoice", "value.subject.name.strategy": "RecordNameStrategy"})
    assert subject_for(proto, "orders", PROTO) == "shop.Invoice"
    schema = json.dumps({"title": "Order", "type": "object"})
    as_json = _framing(**{"value.schema.type": "json", "value.json.schema": schema,
                          "value.subject.name.strategy": "TopicRecordNameStrategy"})
    assert subject_for(as_json, "orders", schema) == "orders-Order"


def test_a_struct_column_is_written_as_json_documents_and_a_null_struct_stays_a_tombstone():
    import datetime
    import decimal

    column = pa.array([{"id": 1, "at": datetime.datetime(2026, 1, 2, 3, 4, 5), "raw": b"\x01"}, None])
    assert json_column(column).to_pylist() == [b'{"id":1,"at":"2026-01-02T03:04:05","raw":"AQ=="}', None]
    kinds = pa.struct([("price", pa.decimal128(30, 9)), ("tags", pa.map_(pa.string(), pa.float64())),
                       ("ratio", pa.float64())])
    row = {"price": decimal.Decimal("12345678901234567890.123456789"), "tags": [("a", 1.5)], "ratio": float("nan")}
    assert json_column(pa.array([row], kinds)).to_pylist() == \
        [b'{"price":12345678901234567890.123456789,"tags":{"a":1.5},"ratio":null}']
