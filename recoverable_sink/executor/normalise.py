"""An input Arrow batch in the Kafka record shape (executor): only the sink's columns, the topic column giving way
to the topic option, timestamps as epoch milliseconds."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from recoverable_sink.columns import SchemaPlan


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
