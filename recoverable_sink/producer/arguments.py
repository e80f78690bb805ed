"""A normalised batch as a producer's arguments: the Arrow arrays the native producer takes through the C Data
Interface (:func:`producer_columns`), or the per-record lists confluent-kafka's ``produce`` is called with
(:func:`to_records`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeAlias

import pyarrow as pa


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


def to_records(batch: pa.RecordBatch) -> KafkaRecords:
    """Turn a normalised batch into the per-record lists handed to ``Producer.produce``."""
    names = batch.schema.names

    def column(name: str) -> list[Any] | None:
        return batch.column(name).to_pylist() if name in names else None

    headers = _header_lists(batch.column("headers")) if "headers" in names else None
    return KafkaRecords(
        values=batch.column("value").to_pylist(),
        keys=column("key"),
        topics=column("topic"),
        partitions=column("partition"),
        headers=headers,
        timestamps=column("timestamp"),
    )


Column: TypeAlias = "pa.Array | None"


def producer_columns(batch: pa.RecordBatch) -> tuple[pa.Array, Column, Column, Column, Column, Column]:
    """A normalised batch as the native producer's arguments: the Arrow arrays of value, key, topic, partition
    (int32), timestamp (int64) and headers (a list of structs), None where the batch has no such column. The
    extension takes them through the Arrow C Data Interface; nothing is copied."""
    # The C Data Interface carries no buffer sizes: Arrow's shallow validation (buffer sizes, first and last
    # offsets) is what lets the extension trust them; it checks the offsets in between itself.
    batch.validate()
    names = batch.schema.names

    def binary(name: str) -> Column:
        return _binary(batch.column(name)) if name in names else None

    def integer(name: str, kind: pa.DataType) -> Column:
        if name not in names:
            return None
        array = batch.column(name)
        return array if array.type == kind else array.cast(kind)

    headers: Column = None
    if "headers" in names:
        headers = batch.column("headers")
        if not pa.types.is_list(headers.type):
            headers = headers.cast(pa.list_(headers.type.value_type))
        if not all(_is_binary(f.type) for f in headers.type.value_type):
            headers = headers.cast(pa.list_(pa.struct([(f.name, f.type if _is_binary(f.type) else pa.binary())
                                                       for f in headers.type.value_type])))
    return (_binary(batch.column("value")), binary("key"), binary("topic"), integer("partition", pa.int32()),
            integer("timestamp", pa.int64()), headers)


def _is_binary(kind: pa.DataType) -> bool:
    return bool(pa.types.is_binary(kind) or pa.types.is_string(kind) or pa.types.is_large_binary(kind)
                or pa.types.is_large_string(kind))


def _binary(array: pa.Array) -> pa.Array:
    """A binary or string array as it is (64-bit offsets included), anything else cast to binary."""
    return array if _is_binary(array.type) else array.cast(pa.binary())


def _header_lists(headers: pa.ListArray) -> list[list[tuple[str, bytes | None]] | None]:
    """Each record's headers as the (key, value) pairs ``produce`` takes, or None for none: the pairs of the
    whole batch are made at once from the flat child arrays, then cut per record (no per-header dict, as
    to_pylist makes)."""
    items = headers.values
    pairs = list(zip(items.field("key").to_pylist(), items.field("value").to_pylist(), strict=True))
    offsets = headers.offsets.to_pylist()
    valid = headers.is_valid().to_pylist()
    return [pairs[start:end] if ok and end > start else None
            for start, end, ok in zip(offsets, offsets[1:], valid, strict=False)]
