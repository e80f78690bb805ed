"""The Avro schema of a struct column (driver), for Schema Registry framing of a ``value`` (or ``key``) column that
is a struct rather than ``to_avro`` binary: Spark's own mapping (``SchemaConverters.toAvroType``: a nullable field
is a union of its type and null, dates and timestamps as logical types, decimals as fixed), with the top-level
record not nullable since a null value is a tombstone, not an Avro null."""

from __future__ import annotations

from typing import Any

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from recoverable_sink.errors import SchemaError

TOP_LEVEL = "topLevelRecord"  # Spark's name for the record it derives


def avro_schema_for(column: str, dtype: StructType) -> dict[str, Any]:
    """The record schema for rows of struct type ``dtype`` in ``column`` (named in errors)."""
    return _record(column, dtype, TOP_LEVEL, "")


def _record(path: str, dtype: StructType, name: str, namespace: str) -> dict[str, Any]:
    child_namespace = f"{namespace}.{name}" if namespace else name
    fields = [{"name": f.name, "type": _type(f"{path}.{f.name}", f.dataType, f.nullable, f.name, child_namespace)}
              for f in dtype.fields]
    record: dict[str, Any] = {"type": "record", "name": name, "fields": fields}
    if namespace:
        record["namespace"] = namespace
    return record


def _type(path: str, dtype: DataType, nullable: bool, name: str, namespace: str) -> Any:
    avro = _non_null(path, dtype, name, namespace)
    return [avro, "null"] if nullable else avro


def _non_null(path: str, dtype: DataType, name: str, namespace: str) -> Any:
    simple = {BooleanType: "boolean", ByteType: "int", ShortType: "int", IntegerType: "int", LongType: "long",
              FloatType: "float", DoubleType: "double", StringType: "string", BinaryType: "bytes"}
    for spark_type, avro in simple.items():
        if isinstance(dtype, spark_type):
            return avro
    if isinstance(dtype, DateType):
        return {"type": "int", "logicalType": "date"}
    if isinstance(dtype, TimestampNTZType):
        return {"type": "long", "logicalType": "local-timestamp-micros"}
    if isinstance(dtype, TimestampType):
        return {"type": "long", "logicalType": "timestamp-micros"}
    if isinstance(dtype, DecimalType):
        size = 1
        while 2 ** (8 * size - 1) < 10 ** dtype.precision:
            size += 1
        return {"type": "fixed", "name": name, **({"namespace": namespace} if namespace else {}), "size": size,
                "logicalType": "decimal", "precision": dtype.precision, "scale": dtype.scale}
    if isinstance(dtype, ArrayType):
        return {"type": "array", "items": _type(path + "[]", dtype.elementType, dtype.containsNull, name, namespace)}
    if isinstance(dtype, MapType) and isinstance(dtype.keyType, StringType):
        return {"type": "map", "values": _type(path + "{}", dtype.valueType, dtype.valueContainsNull, name,
                                                namespace)}
    if isinstance(dtype, StructType):
        return _record(path, dtype, name, namespace)
    raise SchemaError(f"column {path} has type {dtype.simpleString()}, which has no Avro type the sink encodes; "
                      "cast it (a map needs string keys), or encode the column with to_avro and pass its schema "
                      "as value.avro.schema")
