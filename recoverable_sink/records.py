"""The Kafka sink schema: checked on the driver against the DataFrame, applied on executors to each Arrow
batch (normalise columns, reject records Kafka would refuse, turn columns into producer arguments).

The schema is Spark's built-in Kafka sink's: ``value`` (string or binary, required), ``key`` (string or
binary), ``topic`` (string; the ``topic`` option overrides it), ``partition`` (int), ``headers``
(array<struct<key: string, value: binary>>), plus ``timestamp`` (timestamp) for the record's CreateTime.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    ByteType,
    DataType,
    IntegerType,
    ShortType,
    StringType,
    StructType,
    TimestampType,
)

from recoverable_sink.errors import RecordError, SchemaError

COLUMNS = ("key", "value", "topic", "partition", "headers", "timestamp")
_EXPECTED = {
    "key": "string or binary",
    "value": "string or binary",
    "topic": "string",
    "partition": "int",
    "headers": "array<struct<key: string, value: binary>>",
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
    # headers
    if not isinstance(dtype, ArrayType) or not isinstance(dtype.elementType, StructType):
        return False
    fields = {f.name: f.dataType for f in dtype.elementType.fields}
    return (
        set(fields) == {"key", "value"}
        and isinstance(fields["key"], StringType)
        and isinstance(fields["value"], BinaryType)
    )


@dataclass(frozen=True)
class SchemaPlan:
    """Which of the sink's columns the DataFrame has; made on the driver, used by every task."""

    columns: tuple[str, ...]
    topic_option: str | None

    @property
    def topic_from_column(self) -> bool:
        return self.topic_option is None


def plan_schema(schema: StructType, topic_option: str | None) -> SchemaPlan:
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
    if unknown:
        raise SchemaError(
            f"column(s) {', '.join(unknown)} are not part of the Kafka sink schema ({', '.join(COLUMNS)}); "
            "select or drop them, or fold them into value (to_json(struct(...)))"
        )
    for f in schema.fields:
        if not _type_ok(f.name, f.dataType):
            hint = "build it with array(struct(lit('k').alias('key'), col.cast('binary').alias('value')))" \
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


@dataclass
class KafkaRecords:
    """One batch's records as the per-record lists the producer is called with."""

    values: list[Any]
    keys: list[Any] | None
    topics: list[str] | None  # None: every record goes to SchemaPlan.topic_option
    partitions: list[int | None] | None
    headers: list[list[tuple[str, bytes | None]] | None] | None
    timestamps: list[int | None] | None  # milliseconds since the epoch

    def __len__(self) -> int:
        return len(self.values)


def normalise(batch: pa.RecordBatch, plan: SchemaPlan) -> pa.RecordBatch:
    """Keep only the sink's columns (the topic column gives way to the topic option) and store timestamps
    as epoch milliseconds, the form Kafka records carry."""
    arrays: list[pa.Array] = []
    names: list[str] = []
    for name in plan.columns:
        if name == "topic" and not plan.topic_from_column:
            continue
        column = batch.column(name)
        if name == "timestamp":
            column = pc.divide(column.cast(pa.timestamp("us")).cast(pa.int64()), pa.scalar(1000, pa.int64()))
        arrays.append(column)
        names.append(name)
    return pa.RecordBatch.from_arrays(arrays, names=names)


def check_batch(batch: pa.RecordBatch, plan: SchemaPlan, where: str, first_position: int,
                max_message_bytes: int) -> None:
    """Reject a batch holding a record Kafka would refuse, before any of it enters the WAL."""
    names = batch.schema.names
    if "topic" in names and batch.column("topic").null_count:
        row = pc.index(pc.is_null(batch.column("topic")), True).as_py()
        raise RecordError(f"{where}, record {first_position + row}: topic is null and no topic option is set; "
                          "fill the topic column or set the topic option")
    if "partition" in names:
        negative = pc.less(batch.column("partition"), 0)
        if pc.any(negative).as_py():
            row = pc.index(negative, True).as_py()
            raise RecordError(f"{where}, record {first_position + row}: partition "
                              f"{batch.column('partition')[row].as_py()} is negative")
    size = pc.binary_length(batch.column("value").cast(pa.binary()))
    if "key" in names:
        size = pc.add(pc.fill_null(size, 0), pc.fill_null(pc.binary_length(batch.column("key").cast(pa.binary())), 0))
    too_big = pc.greater(pc.fill_null(size, 0), max_message_bytes)
    if pc.any(too_big).as_py():
        row = pc.index(too_big, True).as_py()
        raise RecordError(
            f"{where}, record {first_position + row}: key+value is {size[row].as_py()} bytes, more than the "
            f"producer's message.max.bytes={max_message_bytes}; raise kafka.message.max.bytes (and the topic's "
            "max.message.bytes) or make the record smaller"
        )


def to_records(batch: pa.RecordBatch) -> KafkaRecords:
    """Turn a normalised batch into the per-record lists handed to ``Producer.produce``."""
    names = batch.schema.names

    def column(name: str) -> list[Any] | None:
        return batch.column(name).to_pylist() if name in names else None

    headers = column("headers")
    if headers is not None:
        headers = [None if hs is None else [(h["key"], h["value"]) for h in hs] for hs in headers]
    return KafkaRecords(
        values=batch.column("value").to_pylist(),
        keys=column("key"),
        topics=column("topic"),
        partitions=column("partition"),
        headers=headers,
        timestamps=column("timestamp"),
    )


def equal_by_position(old: pa.RecordBatch, new: pa.RecordBatch) -> list[bool]:
    """For two batches of the same length, whether each record is identical in every column.

    Used on a retry to decide whether a record an earlier attempt got acknowledged is the record now
    recomputed at the same position (a deterministic source) or a different one.
    """
    if old.schema.names != new.schema.names or old.num_rows != new.num_rows:
        return [False] * new.num_rows
    same: pa.Array | None = None
    for name in new.schema.names:
        a, b = old.column(name), new.column(name)
        if pa.types.is_list(a.type) or pa.types.is_large_list(a.type):
            eq = pa.array([x == y for x, y in zip(a.to_pylist(), b.to_pylist(), strict=True)])
        else:
            if a.type != b.type:
                b = b.cast(a.type)
            both_null = pc.and_(pc.is_null(a), pc.is_null(b))
            eq = pc.or_(pc.fill_null(pc.equal(a, b), False), both_null)
        same = eq if same is None else pc.and_(same, eq)
    assert same is not None
    return same.to_pylist()


def header_key_problem(headers: Sequence[list[tuple[str, bytes | None]] | None]) -> int | None:
    """Index of the first record with a null header key (Kafka requires header keys), or None."""
    for i, hs in enumerate(headers):
        if hs and any(k is None for k, _ in hs):
            return i
    return None
