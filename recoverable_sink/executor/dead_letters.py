"""Dead letters (executor): with ``errors.tolerance=all``, the records of a batch that Kafka would refuse for what
they are leave it for the dead-letter topic, each with its key, value and headers as they were plus the headers a
Kafka Connect dead-letter record carries (so the tools that read those read these).

A dead letter's delivery identity is its record's, aimed at the dead-letter topic: the same record refused again by
a retry (in any order, on any host) is the same dead letter, skipped if Kafka has it, and never one of the write's
records to its own topic. The headers saying why and which task attempt refused it are not part of that identity.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from recoverable_sink.columns import HEADERS_TYPE
from recoverable_sink.executor.record_checks import Refusal
from recoverable_sink.identity import record_digests
from recoverable_sink.options import DeadLetterTopic

# Kafka Connect's dead-letter headers (DeadLetterQueueReporter), and two of the sink's own.
H_TOPIC = "__connect.errors.topic"
H_PARTITION = "__connect.errors.partition"
H_CONNECTOR = "__connect.errors.connector.name"
H_TASK = "__connect.errors.task.id"
H_STAGE = "__connect.errors.stage"
H_CLASS = "__connect.errors.class.name"
H_EXCEPTION = "__connect.errors.exception.class.name"
H_MESSAGE = "__connect.errors.exception.message"
H_WRITE = "__recoverable.errors.write.id"
H_ATTEMPT = "__recoverable.errors.task.attempt"
_SINK_CLASS = "recoverable_sink.RecoverableKafkaDataSource"


@dataclass(frozen=True)
class DeadLetters:
    """The records of one batch that go to the dead-letter topic: ``batch`` (in the sink's record shape, a topic
    column naming the dead-letter topic), ``digests`` (their delivery identities), ``input_digests`` (their
    identities as they came in, for the input's fingerprint, which a skipped exactly_once partition compares with
    its marker's), ``rows`` (their indexes in the batch they left) and ``kinds`` (each one's refusal, the first
    found)."""

    batch: pa.RecordBatch
    digests: bytes
    input_digests: bytes
    rows: list[int]
    kinds: list[str]

    def counts(self) -> Counter[str]:
        return Counter(self.kinds)


def split(batch: pa.RecordBatch, refusals: list[Refusal], dead: DeadLetterTopic, topic_option: str | None,
          cluster_id: str, context: dict[str, str]) -> tuple[pa.RecordBatch, DeadLetters | None]:
    """The batch less its refused records, and those records as dead letters (None if none). ``context``: the
    write's and task attempt's headers (:data:`H_CONNECTOR`, :data:`H_TASK`, :data:`H_WRITE`, :data:`H_ATTEMPT`)."""
    if not refusals:
        return batch, None
    n = batch.num_rows
    reason = np.full(n, -1, dtype=np.int64)  # per row, the first refusal that names it
    for i, refusal in reversed(list(enumerate(refusals))):
        reason[refusal.rows.to_numpy(zero_copy_only=False)] = i
    refused = reason >= 0
    rows = np.flatnonzero(refused).tolist()
    kept = batch.filter(pa.array(~refused))
    taken = batch.take(pa.array(rows, pa.int64()))
    names = batch.schema.names
    # Identity: the record as it was, aimed at the dead-letter topic.
    identity = _replace_topic(taken, dead.topic) if "topic" in names else taken
    digests = record_digests(identity, dead.topic, cluster_id)
    as_input = record_digests(taken, topic_option, cluster_id)
    why = [refusals[reason[r]] for r in rows]
    topics = taken.column("topic").to_pylist() if "topic" in names else [topic_option] * len(rows)
    parts = taken.column("partition").to_pylist() if "partition" in names else [None] * len(rows)
    extra: list[list[dict[str, str | bytes]]] = []  # each record's reasons, as header entries (key, value)
    for refusal, row, topic, part in zip(why, rows, topics, parts, strict=True):
        headers = {H_TOPIC: topic or "", H_STAGE: refusal.stage, H_CLASS: _SINK_CLASS,
                   H_EXCEPTION: refusal.kind, H_MESSAGE: refusal.message(row), **context}
        if part is not None:
            headers[H_PARTITION] = str(part)
        extra.append([{"key": k, "value": v.encode()} for k, v in headers.items()])
    letters = _letters(taken, dead.topic, extra)
    return kept, DeadLetters(letters, digests, as_input, rows, [r.kind for r in why])


def _replace_topic(batch: pa.RecordBatch, topic: str) -> pa.RecordBatch:
    i = batch.schema.get_field_index("topic")
    return batch.set_column(i, "topic", pa.array([topic] * batch.num_rows, batch.schema.field(i).type))


def _letters(taken: pa.RecordBatch, topic: str, extra: list[list[dict[str, str | bytes]]]) -> pa.RecordBatch:
    """The dead-letter records: key, value and timestamp as they were (a timestamp Kafka refuses: none, the
    producer stamps it), the headers as they were (a null key as the empty string) followed by the reasons; no
    partition (the partitioner picks, by key)."""
    names = taken.schema.names
    columns: dict[str, pa.Array] = {}
    if "key" in names:
        columns["key"] = taken.column("key")
    columns["value"] = taken.column("value")
    columns["topic"] = pa.array([topic] * taken.num_rows, pa.string())
    if "timestamp" in names:
        stamps = taken.column("timestamp")
        columns["timestamp"] = pc.if_else(pc.fill_null(pc.less(stamps, 1), False), pa.scalar(None, stamps.type),
                                          stamps)
    original = taken.column("headers").to_pylist() if "headers" in names else [None] * taken.num_rows
    headers = [[{"key": h["key"] or "", "value": h["value"]} for h in (kept or [])] + more
               for kept, more in zip(original, extra, strict=True)]
    columns["headers"] = pa.array(headers, HEADERS_TYPE)
    return pa.RecordBatch.from_pydict(columns)
