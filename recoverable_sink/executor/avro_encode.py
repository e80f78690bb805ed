"""Avro binary encoding of a struct column (executor), for Schema Registry framing without ``to_avro``: each row of
an Arrow struct array becomes the Avro binary of the record schema the driver derived from the column's Spark type
(:func:`recoverable_sink.driver.avro_schema.avro_schema_for`). Columns of fixed-size and string types are encoded a
column at a time with Arrow and numpy (zigzag varints, length prefixes, union indexes), and the rows' bytes joined
field by field; arrays and maps are encoded row by row in Python."""

from __future__ import annotations

import datetime
import struct
from decimal import Decimal
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

_EMPTY = pa.scalar(b"", pa.binary())
_EPOCH_UTC = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)  # datetime.UTC is 3.11+
_NULL_INDEX = {0: b"\x00", 1: b"\x02"}  # a union branch index as a zigzag varint


def encode_column(column: pa.Array, schema: Any) -> pa.Array:
    """The Avro binary of each row of ``column`` (a record schema); a null row stays null (a tombstone)."""
    encoded = _encode(column, schema)
    if column.null_count:
        encoded = pc.if_else(column.is_null(), pa.scalar(None, pa.binary()), encoded)
    return encoded


def _encode(array: pa.Array, schema: Any) -> pa.Array:
    """Avro binary of every row of ``array`` under ``schema`` (rows that are null where the schema allows no null
    are encoded from a filler; callers mask them)."""
    if isinstance(schema, list):
        return _union(array, schema)
    kind = schema if isinstance(schema, str) else schema["type"]
    if isinstance(kind, (dict, list)):
        return _encode(array, kind)
    if kind == "record":
        if isinstance(array, pa.ChunkedArray):
            array = array.combine_chunks()
        parts = [_encode(child, f["type"]) for child, f in zip(array.flatten(), schema["fields"], strict=True)]
        if not parts:
            return pa.array([b""] * len(array), pa.binary())
        return pc.binary_join_element_wise(*parts, _EMPTY) if len(parts) > 1 else parts[0]
    if kind in ("int", "long"):
        values = array
        if pa.types.is_date(values.type) or pa.types.is_timestamp(values.type):
            values = values.cast(pa.int64() if pa.types.is_timestamp(values.type) else pa.int32())
        ints = np.asarray(values.fill_null(0).cast(pa.int64()), dtype=np.int64)
        return _varints(((ints << 1) ^ (ints >> 63)).view(np.uint64))
    if kind in ("string", "bytes"):
        data = array.fill_null("" if pa.types.is_string(array.type) or pa.types.is_large_string(array.type)
                               else b"").cast(pa.binary())
        lengths = np.asarray(pc.binary_length(data), dtype=np.int64)
        return pc.binary_join_element_wise(_varints((lengths << 1).view(np.uint64)), data, _EMPTY)
    if kind == "boolean":
        flags = np.asarray(array.fill_null(False), dtype=np.uint8)
        return _fixed(flags.tobytes(), 1, len(array))
    if kind in ("float", "double"):
        dtype = "<f4" if kind == "float" else "<f8"
        values = np.asarray(array.fill_null(0).cast(pa.float32() if kind == "float" else pa.float64()), dtype=dtype)
        return _fixed(values.tobytes(), values.itemsize, len(array))
    # arrays, maps, decimals: row by row (a null row, masked by the caller, as no bytes)
    return pa.array([b"" if v is None else _encode_value(v, schema) for v in array.to_pylist()], pa.binary())


def _union(array: pa.Array, branches: list[Any]) -> pa.Array:
    """A nullable field: Spark's unions are [type, "null"] (or the reverse)."""
    null_at = branches.index("null") if "null" in branches else None
    if null_at is None or len(branches) != 2:
        return pa.array([_encode_value(v, branches) for v in array.to_pylist()], pa.binary())
    value_at = 1 - null_at
    present = pc.binary_join_element_wise(pa.scalar(_NULL_INDEX[value_at], pa.binary()),
                                          _encode(array, branches[value_at]), _EMPTY)
    if not array.null_count:
        return present
    return pc.if_else(array.is_null(), pa.scalar(_NULL_INDEX[null_at], pa.binary()), present)


def _fixed(data: bytes, width: int, n: int) -> pa.Array:
    return pa.FixedSizeBinaryArray.from_buffers(pa.binary(width), n, [None, pa.py_buffer(data)]).cast(pa.binary())


def _varints(values: np.ndarray) -> pa.Array:
    """Each unsigned 64-bit value as an Avro varint (7 bits a byte, low first, high bit = more follows)."""
    n = len(values)
    lengths = np.ones(n, np.int64)
    rest = values >> np.uint64(7)
    while rest.any():
        lengths += rest != 0
        rest = rest >> np.uint64(7)
    offsets = np.zeros(n + 1, np.int32)
    np.cumsum(lengths, out=offsets[1:])
    out = np.zeros(int(offsets[-1]), np.uint8)
    remaining = values.copy()
    for k in range(int(lengths.max()) if n else 0):
        rows = np.nonzero(lengths > k)[0]
        byte = (remaining[rows] & np.uint64(0x7F)).astype(np.uint8)
        byte |= ((lengths[rows] > k + 1).astype(np.uint8) << 7)
        out[offsets[rows] + k] = byte
        remaining[rows] >>= np.uint64(7)
    return pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets.tobytes()), pa.py_buffer(out.tobytes())])


# ---- row by row --------------------------------------------------------------------------------------------------
def _long(n: int) -> bytes:
    z = (n << 1) ^ (n >> 63)
    out = bytearray()
    while z > 0x7F:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


def _encode_value(value: Any, schema: Any) -> bytes:
    """One value's Avro binary (Python objects as Arrow's to_pylist gives them)."""
    if isinstance(schema, list):
        if value is None:
            return _long(schema.index("null"))
        at = next(i for i, b in enumerate(schema) if b != "null")
        return _long(at) + _encode_value(value, schema[at])
    kind = schema if isinstance(schema, str) else schema["type"]
    if isinstance(kind, (dict, list)):
        return _encode_value(value, kind)
    if kind == "record":
        return b"".join(_encode_value(value.get(f["name"]) if value else None, f["type"]) for f in schema["fields"])
    if kind == "array":
        items = value or []
        body = b"".join(_encode_value(v, schema["items"]) for v in items)
        return (_long(len(items)) + body if items else b"") + b"\x00"
    if kind == "map":
        entries = list(value.items()) if isinstance(value, dict) else list(value or [])
        body = b"".join(_encode_value(k, "string") + _encode_value(v, schema["values"]) for k, v in entries)
        return (_long(len(entries)) + body if entries else b"") + b"\x00"
    if kind in ("int", "long"):
        if isinstance(value, datetime.datetime):  # timestamp-micros: from the UTC epoch, whatever the session zone
            epoch = _EPOCH_UTC if value.tzinfo is not None else _EPOCH_UTC.replace(tzinfo=None)
            value = (value - epoch) // datetime.timedelta(microseconds=1)
        elif isinstance(value, datetime.date):  # date: days since the epoch
            value = value.toordinal() - 719163
        return _long(int(value))
    if kind == "boolean":
        return b"\x01" if value else b"\x00"
    if kind == "float":
        return struct.pack("<f", value)
    if kind == "double":
        return struct.pack("<d", value)
    if kind in ("string", "bytes"):
        data = value.encode() if isinstance(value, str) else bytes(value)
        return _long(len(data)) + data
    if kind == "fixed":  # a decimal: the unscaled value, big-endian two's complement, in the fixed size
        return _unscaled(value, schema["scale"]).to_bytes(schema["size"], "big", signed=True)
    raise ValueError(f"Avro type {kind!r} is not encoded by the sink")


def _unscaled(value: Decimal, scale: int) -> int:
    """A decimal's digits as an integer at ``scale``, exactly (Decimal arithmetic would round past 28 digits)."""
    sign, digits, exponent = value.as_tuple()
    n = int("".join(map(str, digits)) or "0")
    shift = int(exponent) + scale
    factor: int = 10 ** abs(shift)
    n = n * factor if shift >= 0 else n // factor
    return -n if sign else n
