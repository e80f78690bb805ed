"""What the driver and the tasks agree on: who a task is, and what it reports back to ``commit``/``abort``.

Driver-side modules (``summary``, ``batch``, ``stream``) import this, never the executor's ``task`` module.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pyspark.sql.datasource import WriterCommitMessage

# Re-exported: run ids are part of what driver and tasks agree on; they live apart so the CLI needs no pyspark.
from recoverable_sink.offsets import OffsetRange
from recoverable_sink.runs import new_run_id as new_run_id


@dataclass(frozen=True)
class TaskIdentity:
    """Who is writing: the WAL identity of a partition is (write id, partition); ``attempt`` tells retries
    apart. ``kind`` is ``"batch"`` or ``"stream"``. The rest comes from Spark's task context and the driver-side
    writer, and lands in the attempt's WAL record: ``run`` (one driver-side writer; None for a writer driven
    outside Spark), Spark's ``task_attempt_id`` (ordered within one run) and ``stage``, a stream's ``query_id`` and
    ``batch_id``, and whether the write id was ``generated`` (never re-run)."""

    write_id: str
    partition: int
    attempt: int
    kind: str = "batch"
    run: str | None = None
    task_attempt_id: int | None = None
    stage: int | None = None
    query_id: str | None = None
    batch_id: int | None = None
    generated: bool = False

    def wal_fields(self) -> dict[str, object]:
        """What the attempt's WAL record keeps of this identity (the fields that are set)."""
        fields: dict[str, object] = {"run": self.run, "task_attempt_id": self.task_attempt_id, "stage": self.stage,
                                     "query_id": self.query_id, "batch_id": self.batch_id}
        return {k: v for k, v in fields.items() if v is not None} | ({"generated": True} if self.generated else {})

    @property
    def retry(self) -> bool:
        """Whether Spark ran this partition before, as far as a Python task can tell: a later task attempt (a
        re-run stage starts its attempt numbers at 0 again, and pyspark's TaskContext does not say)."""
        return self.attempt > 0

    @property
    def transaction_scope(self) -> str:
        """What a partition's transactional id (and marker group) is shared across under exactly_once: every
        micro-batch of a streaming query, so their number on the brokers does not grow with the query's length;
        a batch write's own id otherwise."""
        if self.kind != "stream":
            return self.write_id
        assert self.query_id is not None, "a micro-batch's task has its query id"
        return self.query_id

    @property
    def where(self) -> str:
        """How error messages and log lines name this task."""
        return f"partition {self.partition} (attempt {self.attempt}) of write {self.write_id}"


@dataclass
class SinkCommitMessage(WriterCommitMessage):
    """What one task reports to the driver's ``commit``."""

    write_id: str
    partition: int
    attempt: int
    host: str
    wal_path: str | None
    received: int = 0  # records in the partition
    published: int = 0  # handed to the producer by this attempt
    acknowledged: int = 0  # acknowledged by Kafka to this attempt
    skipped: int = 0  # not re-sent: an earlier attempt got the same record to the same destination acknowledged
    replayed: int = 0  # re-sent: an earlier attempt had logged it but never got it acknowledged
    diverged: int = 0  # acknowledged to an earlier attempt but absent from this attempt's input
    unproven: int = 0  # at_least_once: sent by a retry that found no earlier attempt's log on its host (maybe again)
    wal_bytes: int = 0
    seconds: float = 0.0
    committed_before: bool = False  # exactly_once: an earlier attempt's transaction already holds the partition
    query_id: str | None = None  # streaming only
    producer: str = ""  # "native" (the C produce loop) or "confluent" (confluent-kafka's produce() per record)
    # Where this attempt's acknowledged records went: (topic, partition, first offset, last offset, records), and
    # whether that covers the partition (not where records were skipped as delivered by an earlier attempt).
    offsets: tuple[OffsetRange, ...] = ()
    offsets_complete: bool = True
    # errors.tolerance=all: the partition's records that went to the dead-letter topic, by refusal (none when an
    # exactly_once attempt skipped a partition already committed).
    dead_lettered: dict[str, int] = field(default_factory=dict)
    dead_letter_topic: str = ""
    # The proof topic (None: proof.kafka=false): the write's proof partition there, the lowest offset of this write's
    # proof this attempt knows of, and the proof chunks it knows of in its partition (attempt name, run, exactly_once,
    # chunks), which a release of the write tombstones.
    proof_topic: str | None = None
    proof_partition: int = 0
    proof_low: int | None = None
    proof_chunks: tuple[tuple[str, str, bool, int], ...] = ()
    # What reading the write's proof from the proof topic cost this attempt: records, bytes, seconds.
    proof_read_records: int = 0
    proof_read_bytes: int = 0
    proof_read_seconds: float = 0.0


def stream_write_id(query_id: str, batch_id: int) -> str:
    """The write id of one micro-batch: stable across task retries and driver restarts from a checkpoint."""
    return f"{query_id}-b{batch_id:012d}"


def stream_batch_of(write_id: str) -> int | None:
    """The micro-batch id in a stream's write id (see :func:`stream_write_id`), None for a batch write's.

    >>> stream_batch_of(stream_write_id("q1", 7)), stream_batch_of("w1")
    (7, None)
    """
    head, sep, tail = write_id.rpartition("-b")
    return int(tail) if sep and head and len(tail) == 12 and tail.isdigit() else None
