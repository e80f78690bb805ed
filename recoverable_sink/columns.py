"""The sink's input columns and which of them a DataFrame has (:class:`SchemaPlan`): what the driver decides from
the schema and every task is handed. Both sides import it; it imports neither."""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

# The sink's input columns, in the order a normalised batch keeps them.
COLUMNS = ("key", "value", "topic", "partition", "headers", "timestamp")
# The Arrow type of a normalised batch's headers (Spark's Kafka sink's); a map of headers is cast to it.
HEADERS_TYPE = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))


@dataclass(frozen=True)
class SchemaPlan:
    """Which of the sink's columns the DataFrame has; made on the driver, used by every task."""

    columns: tuple[str, ...]
    topic_option: str | None
    # Schema Registry framing: (column, the 5 bytes each of its non-null values starts with: magic 0, schema id).
    frames: tuple[tuple[str, bytes], ...] = ()
    # Struct columns the sink encodes as Avro binary itself: (column, the record schema as JSON).
    encodings: tuple[tuple[str, str], ...] = ()
    # Struct columns the sink writes as JSON text itself (a JSON Schema subject).
    json_encoded: tuple[str, ...] = ()

    @property
    def topic_from_column(self) -> bool:
        return self.topic_option is None
