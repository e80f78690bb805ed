"""The sink's own Avro encoding of a struct column (executor/avro_encode.py) under the schema the driver derives
from its Spark type (driver/avro_schema.py), read back by fastavro, an independent Avro implementation."""

from __future__ import annotations

import datetime as dt
import io
from decimal import Decimal

import pyarrow as pa
import pytest
from fastavro import parse_schema, schemaless_reader
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from recoverable_sink.driver.avro_schema import avro_schema_for
from recoverable_sink.errors import SchemaError
from recoverable_sink.executor.avro_encode import encode_column

INNER = StructType([StructField("x", LongType(), False), StructField("note", StringType())])
SPARK = StructType([
    StructField("id", LongType(), False), StructField("n", IntegerType()), StructField("name", StringType()),
    StructField("score", DoubleType()), StructField("ratio", FloatType(), False), StructField("ok", BooleanType()),
    StructField("day", DateType()), StructField("at", TimestampType()), StructField("raw", BinaryType()),
    StructField("inner", INNER), StructField("tags", ArrayType(LongType())),
    StructField("attrs", MapType(StringType(), StringType())), StructField("price", DecimalType(10, 2)),
])
ARROW = pa.struct([
    pa.field("id", pa.int64(), False), ("n", pa.int32()), ("name", pa.string()), ("score", pa.float64()),
    pa.field("ratio", pa.float32(), False), ("ok", pa.bool_()), ("day", pa.date32()),
    ("at", pa.timestamp("us", tz="UTC")), ("raw", pa.binary()),
    ("inner", pa.struct([pa.field("x", pa.int64(), False), ("note", pa.string())])), ("tags", pa.list_(pa.int64())),
    ("attrs", pa.map_(pa.string(), pa.string())), ("price", pa.decimal128(10, 2)),
])
AT = dt.datetime(2026, 11, 27, 13, 5, 7, 123456, tzinfo=dt.UTC)
ROWS = [
    {"id": 0, "n": 7, "name": "zero", "score": 1.5, "ratio": 0.25, "ok": True, "day": dt.date(2026, 11, 27), "at": AT,
     "raw": b"\x00\xff", "inner": {"x": -1, "note": "n"}, "tags": [1, -2, 3_000_000_000], "attrs": [("a", "1")],
     "price": Decimal("12.34")},
    {"id": -(2**63), "n": None, "name": None, "score": None, "ratio": -0.0, "ok": None, "day": None, "at": None,
     "raw": None, "inner": None, "tags": None, "attrs": None, "price": None},
    {"id": 2**63 - 1, "n": -(2**31), "name": "é" * 300, "score": -1e300, "ratio": 3.5, "ok": False,
     "day": dt.date(1960, 1, 1), "at": dt.datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=dt.UTC), "raw": b"",
     "inner": {"x": 2**40, "note": None}, "tags": [], "attrs": [], "price": Decimal("-99999999.99")},
]


def decoded(values: pa.Array, schema: dict) -> list:
    parsed = parse_schema(schema)
    return [None if v is None else schemaless_reader(io.BytesIO(v), parsed) for v in values.to_pylist()]


@pytest.mark.parametrize("first", [0, 1])
def test_every_row_reads_back_with_an_independent_avro_reader(first):
    schema = avro_schema_for("value", SPARK)
    column = pa.array(ROWS, ARROW).slice(first)  # a batch Spark sliced
    got = decoded(encode_column(column, schema), schema)
    for row, back in zip(ROWS[first:], got, strict=True):
        expected = {**row, "attrs": dict(row["attrs"]) if row["attrs"] is not None else None}
        if row["ratio"] is not None:
            assert back.pop("ratio") == pytest.approx(row["ratio"])
            expected.pop("ratio")
        assert back == expected


def test_a_null_struct_stays_null_a_tombstone_and_names_follow_spark():
    schema = avro_schema_for("value", SPARK)
    assert schema["name"] == "topLevelRecord" and "namespace" not in schema
    inner = next(f for f in schema["fields"] if f["name"] == "inner")["type"]
    assert inner[1] == "null" and inner[0]["name"] == "inner" and inner[0]["namespace"] == "topLevelRecord"
    column = pa.array([ROWS[0], None], ARROW)
    assert encode_column(column, schema).to_pylist()[1] is None


def test_a_type_without_an_avro_encoding_is_named_on_the_driver():
    with pytest.raises(SchemaError, match=r"column value\.m has type map<int,string>.*string keys"):
        avro_schema_for("value", StructType([StructField("m", MapType(IntegerType(), StringType()))]))


def test_decimals_keep_all_38_digits_and_timestamps_count_from_the_utc_epoch_in_any_zone():
    from zoneinfo import ZoneInfo

    spark = StructType([StructField("big", DecimalType(38, 10), False),
                        StructField("times", ArrayType(TimestampType(), False), False)])
    arrow = pa.struct([pa.field("big", pa.decimal128(38, 10), False),
                       pa.field("times", pa.list_(pa.field("item", pa.timestamp("us", tz="America/Los_Angeles"),
                                                           False)), False)])
    big = Decimal("1234567890123456789012345678.1234567890")
    at = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
    schema = avro_schema_for("value", spark)
    [back] = decoded(encode_column(pa.array([{"big": big, "times": [at]}], arrow), schema), schema)
    assert back["big"] == big
    assert back["times"] == [at] and back["times"][0].astimezone(ZoneInfo("America/Los_Angeles")).hour == 16


def test_a_given_schema_must_fit_the_struct_field_by_field():
    from recoverable_sink.driver.avro_schema import check_given

    spark = StructType([StructField("first", StringType(), False), StructField("last", StringType())])
    derived = avro_schema_for("value", spark)
    check_given("value", {"type": "record", "name": "Person", "namespace": "my", "fields": [
        {"name": "first", "type": "string"}, {"name": "last", "type": ["null", "string"], "default": None}]}, derived)
    with pytest.raises(SchemaError, match=r"value has the fields \['first', 'last'\] in this order"):
        check_given("value", {"type": "record", "name": "P", "fields": [
            {"name": "last", "type": ["string", "null"]}, {"name": "first", "type": "string"}]}, derived)
    with pytest.raises(SchemaError, match="value.last may be null, so its type must be a union with null"):
        check_given("value", {"type": "record", "name": "P", "fields": [
            {"name": "first", "type": "string"}, {"name": "last", "type": "string"}]}, derived)
    with pytest.raises(SchemaError, match="value.first is \"string\" by the column's type, \"long\" in the schema"):
        check_given("value", {"type": "record", "name": "P", "fields": [
            {"name": "first", "type": "long"}, {"name": "last", "type": ["string", "null"]}]}, derived)
