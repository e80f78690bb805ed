"""An input Arrow batch in the Kafka record shape (executor): only the sink's columns, the topic column giving way
to the topic option, timestamps as epoch milliseconds, headers given as a map as Spark's list of (key, value), and
values (or keys) encoded (Avro, JSON) and framed for a Schema Registry with their schema's id."""

from __future__ import annotations

import base64
import datetime
import decimal
import json
from functools import lru_cache
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from recoverable_sink.columns import HEADERS_TYPE, SchemaPlan
from recoverable_sink.executor.avro_encode import encode_column


def normalise(batch: pa.RecordBatch, plan: SchemaPlan) -> pa.RecordBatch:
    """Keep only the sink's columns (the topic column gives way to the topic option), store timestamps
    as epoch milliseconds, the form Kafka records carry, and headers as Spark's list of (key, value) structs
    whatever shape they came in, so a record's bytes, digest and WAL entry do not depend on it."""
    arrays: list[pa.Array] = []
    names: list[str] = []
    for name in plan.columns:
        if name == "topic" and not plan.topic_from_column:
            continue
        column = batch.column(name)
        if name == "timestamp":
            column = pc.divide(column.cast(pa.timestamp("us")).cast(pa.int64()), pa.scalar(1000, pa.int64()))
        elif name == "headers" and pa.types.is_map(column.type):
            column = column.cast(HEADERS_TYPE)  # a map: its entries in order, string values as their UTF-8
        for encoded, schema in plan.encodings:
            if encoded == name:
                column = encode_column(column, _schema(schema))
        if name in plan.json_encoded:
            column = json_column(column)
        for framed, prefix in plan.frames:
            if framed == name:  # Confluent's wire format: the registry's schema id before the encoded value
                column = pc.binary_join_element_wise(pa.scalar(prefix, pa.binary()), column.cast(pa.binary()),
                                                     pa.scalar(b"", pa.binary()))
        arrays.append(column)
        names.append(name)
    return pa.RecordBatch.from_arrays(arrays, names=names)


def json_column(column: pa.Array) -> pa.Array:
    """A struct column as JSON documents (UTF-8 bytes; a null struct stays null: a tombstone), as Spark's
    ``to_json`` writes them: field names as keys, timestamps and dates in ISO 8601, binary as base64."""
    return pa.array([None if row is None else json.dumps(row, separators=(",", ":"), default=_json_default).encode()
                     for row in column.to_pylist()], pa.binary())


def _json_default(value: object) -> object:
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, datetime.datetime | datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return float(value)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


@lru_cache(maxsize=8)
def _schema(text: str) -> Any:
    return json.loads(text)
