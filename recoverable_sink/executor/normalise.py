"""An input Arrow batch in the Kafka record shape (executor): only the sink's columns, the topic column giving way
to the topic option, timestamps as epoch milliseconds, headers given as a map as Spark's list of (key, value), and
values (or keys) encoded (Avro, JSON) and framed for a Schema Registry with their schema's id."""

from __future__ import annotations

import base64
import datetime
import decimal
import json
import math
import os
import re
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
    ``to_json`` writes them: field names as keys, a map as an object, timestamps and dates in ISO 8601, binary as
    base64, decimals with their exact digits; NaN and infinities, which JSON has no number for, as null."""
    kind = column.type
    return pa.array([None if row is None else
                     _dumps(_plain(row, kind)).encode()
                     for row in column.to_pylist()], pa.binary())


def _plain(value: Any, kind: pa.DataType) -> object:
    """A value as to_pylist gives it (its shape is ``kind``'s), in the shapes JSON has."""
    if value is None:
        return None
    if pa.types.is_struct(kind):
        return {f.name: _plain(value[f.name], f.type) for f in kind}
    if pa.types.is_map(kind):
        return {str(k): _plain(v, kind.item_type) for k, v in value}
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        return [_plain(v, kind.value_type) for v in value]
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, datetime.datetime | datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return f"{_DECIMAL}{value}{_DECIMAL}"  # unquoted afterwards: json writes no Decimal as it is
    return value


# Around a decimal's digits, a marker no input string holds: a NUL (json writes it as \u0000) and a random token.
_TOKEN = os.urandom(8).hex()
_DECIMAL = f"\x00{_TOKEN}"
_DECIMAL_TEXT = re.compile(r'"\\u0000' + _TOKEN + r'([-+0-9.Ee]+)\\u0000' + _TOKEN + '"')


def _dumps(value: object) -> str:
    text = json.dumps(value, separators=(",", ":"), allow_nan=False)
    return _DECIMAL_TEXT.sub(r"\1", text) if _TOKEN in text else text


@lru_cache(maxsize=8)
def _schema(text: str) -> Any:
    return json.loads(text)
