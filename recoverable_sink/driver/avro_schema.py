"""The Avro schema of a struct column (driver), for Schema Registry framing of a ``value`` (or ``key``) column that
is a struct rather than ``to_avro`` binary: Spark's own mapping (``SchemaConverters.toAvroType``: a nullable field
is a union of its type and null, dates and timestamps as logical types, decimals as fixed), with the top-level
record not nullable since a null value is a tombstone, not an Avro null."""

from __future__ import annotations

import json
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
        # Named as Spark names it: <namespace>.<field>.fixed
        return {"type": "fixed", "name": f"{namespace}.{name}.fixed" if namespace else f"{name}.fixed", "size": size,
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


def check_given(column: str, given: Any, derived: Any) -> None:
    """A schema given for a struct column must encode it as the derived one would: the same fields in the same
    order, the same types, and a union with null wherever the column may hold one (the sink pairs fields by
    position and writes a null only where the schema lets it)."""
    problem = _differs(given, derived, column)
    if problem:
        raise SchemaError(f"{column}.avro.schema does not fit column {column}: {problem}. Leave {column}.avro.schema "
                          f"unset to register the schema derived from the column, or match its fields, their order, "
                          "types and nullability")


def _kind(schema: Any) -> str:
    if isinstance(schema, dict):
        inner = schema.get("type")
        return inner if isinstance(inner, str) else "?"
    return schema if isinstance(schema, str) else "union"


def _differs(given: Any, derived: Any, path: str) -> str | None:
    if isinstance(given, dict) and isinstance(given.get("type"), (dict, list)):
        given = given["type"]
    if isinstance(derived, list):  # nullable here: the given type must allow null
        if not (isinstance(given, list) and len(given) == 2 and "null" in given):
            return f"{path} may be null, so its type must be a union with null, not {json.dumps(given)}"
        return _differs(next(b for b in given if b != "null"), derived[0], path)
    if isinstance(given, list):
        if len(given) == 2 and "null" in given:
            return _differs(next(b for b in given if b != "null"), derived, path)
        return f"{path} has the union {json.dumps(given)}; only a type or a union of one type with null is encoded"
    kind, expected = _kind(given), _kind(derived)
    if kind != expected:
        return f"{path} is {json.dumps(derived)} by the column's type, {json.dumps(given)} in the schema"
    if isinstance(derived, dict) and derived.get("logicalType") != (given.get("logicalType")
                                                                     if isinstance(given, dict) else None):
        return f"{path} has logical type {derived.get('logicalType')} by the column's type, " \
               f"{given.get('logicalType') if isinstance(given, dict) else None} in the schema"
    if kind == "record":
        names = [f.get("name") for f in given.get("fields", [])]
        wanted = [f["name"] for f in derived["fields"]]
        if names != wanted:
            return f"{path} has the fields {wanted} in this order, the schema {names}"
        for g, d in zip(given["fields"], derived["fields"], strict=True):
            problem = _differs(g.get("type"), d["type"], f"{path}.{d['name']}")
            if problem:
                return problem
    if kind == "array":
        return _differs(given.get("items"), derived["items"], path + "[]")
    if kind == "map":
        return _differs(given.get("values"), derived["values"], path + "{}")
    if kind == "fixed" and any(given.get(k) != derived[k] for k in ("size", "precision", "scale")):
        return f"{path} is a decimal of precision {derived['precision']} and scale {derived['scale']} in " \
               f"{derived['size']} bytes by the column's type"
    return None
