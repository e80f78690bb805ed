"""The driver-side check of a DataFrame's schema against the Kafka sink schema, before any task runs.

The schema is Spark's built-in Kafka sink's: ``value`` (string or binary, required), ``key`` (string or
binary), ``topic`` (string; the ``topic`` option overrides it), ``partition`` (int), ``headers``
(array<struct<key: string, value: binary>>), plus ``timestamp`` (timestamp) for the record's CreateTime, and
``headers`` also as a map<string, string> or map<string, binary>, which Spark's sink refuses.
"""

from __future__ import annotations

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    ByteType,
    DataType,
    IntegerType,
    MapType,
    ShortType,
    StringType,
    StructType,
    TimestampType,
)

from recoverable_sink._logging import get_logger
from recoverable_sink.columns import COLUMNS, SchemaPlan
from recoverable_sink.errors import SchemaError

log = get_logger("schema")

_EXPECTED = {
    "key": "string or binary",
    "value": "string or binary",
    "topic": "string",
    "partition": "int",
    "headers": "array<struct<key: string, value: binary>>, map<string, string> or map<string, binary>",
    "timestamp": "timestamp",
}


def _type_ok(column: str, dtype: DataType) -> bool:
    if column in ("key", "value"):
        return isinstance(dtype, StringType | BinaryType)
    if column == "topic":
        return isinstance(dtype, StringType)
    if column == "partition":
        return isinstance(dtype, IntegerType | ShortType | ByteType)
    if column == "timestamp":
        return isinstance(dtype, TimestampType)
    # headers: Spark's shape, or a map of header names to values (one header per key, in the map's order)
    if isinstance(dtype, MapType):
        return isinstance(dtype.keyType, StringType) and isinstance(dtype.valueType, StringType | BinaryType)
    if not isinstance(dtype, ArrayType) or not isinstance(dtype.elementType, StructType):
        return False
    fields = {f.name: f.dataType for f in dtype.elementType.fields}
    return (
        set(fields) == {"key", "value"}
        and isinstance(fields["key"], StringType)
        and isinstance(fields["value"], BinaryType)
    )


def plan_schema(schema: StructType, topic_option: str | None, encoded: frozenset[str] = frozenset()) -> SchemaPlan:
    """Check a DataFrame schema against the Kafka sink schema on the driver, before any task runs.

    >>> from pyspark.sql.types import StructType, StructField, StringType, LongType
    >>> plan_schema(StructType([StructField("value", StringType())]), "t").columns
    ('value',)
    >>> plan_schema(StructType([StructField("value", LongType())]), "t")
    Traceback (most recent call last):
    ...
    recoverable_sink.errors.SchemaError: column value has type bigint; the Kafka sink needs string or binary: ...
    """
    names = [f.name for f in schema.fields]
    unknown = [n for n in names if n not in COLUMNS]
    if unknown:  # as format("kafka") does; said once, since a misspelt column would otherwise go unnoticed
        log.warning("column(s) %s are not part of the Kafka sink schema (%s) and are not written; drop them, or "
                    "fold them into value (to_json(struct(...)))", ", ".join(unknown), ", ".join(COLUMNS))
    for f in schema.fields:
        if f.name not in COLUMNS:
            continue
        if f.name in encoded and isinstance(f.dataType, StructType):
            continue  # a struct the sink encodes as Avro for the Schema Registry (driver/registry.py checks it)
        if not _type_ok(f.name, f.dataType):
            hint = "build it with array(struct(lit('k').alias('key'), col.cast('binary').alias('value'))), or " \
                "create_map(lit('k'), col.cast('string'))" \
                if f.name == "headers" else f"cast it, e.g. col('{f.name}').cast('{_EXPECTED[f.name].split()[0]}')"
            raise SchemaError(
                f"column {f.name} has type {f.dataType.simpleString()}; the Kafka sink needs "
                f"{_EXPECTED[f.name]}: {hint}"
            )
    if "value" not in names:
        raise SchemaError("the Kafka sink needs a value column (string or binary); none was found")
    if topic_option is None and "topic" not in names:
        raise SchemaError("no topic: set the topic option or add a topic column (string)")
    return SchemaPlan(columns=tuple(n for n in COLUMNS if n in names), topic_option=topic_option)
