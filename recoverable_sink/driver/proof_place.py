"""The proof topic on the driver: where a write's tasks read its proof, and its release once Spark committed the write.

- A write with a generated id: its tasks read from where the proof partition ends as the write starts (only a retry
  reads at all). It has a directory entry too, written as it starts, since a failed one is finished by a re-run under
  that id (its abort says so) that may run where its WAL is not; its driver's commit tombstones the entry and every
  proof record its tasks report.
- A ``wal.writeId`` write may be re-run from any host, any day within ``proof.retentionHours``: its directory entry
  (where its live proof starts) is found or made as it starts and written again at its end, so that it outlives the
  write's proof; nothing releases that proof but the topic's retention.
- A stream's tasks find their query's entry themselves (the driver does not know the query's id when it plans a
  micro-batch); each micro-batch's commit moves the entry to where that micro-batch's proof starts, and the next
  micro-batch's tasks release the earlier ones' (see :mod:`recoverable_sink.executor.partition_writer`).
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql.datasource import WriterCommitMessage

from recoverable_sink._logging import get_logger
from recoverable_sink.contract import SinkCommitMessage
from recoverable_sink.executor.kafka_proof import ProofStart
from recoverable_sink.options import KafkaProof, SinkOptions
from recoverable_sink.proof.format import ChunkKey, DirectoryKey, MarkerKey, encode_directory, partition_of
from recoverable_sink.proof.io import KafkaIO, ProofIO

log = get_logger("driver")


def _io(options: SinkOptions, io: ProofIO | None) -> ProofIO | None:
    if io is not None:
        return io
    return KafkaIO(options, options.proof) if isinstance(options.proof, KafkaProof) else None


def start_for(options: SinkOptions, write_id: str, generated: bool, io: ProofIO | None = None) -> ProofStart | None:
    """Where this run's tasks read the write's proof (None: no proof topic)."""
    proof, found_io = options.proof, _io(options, io)
    if not isinstance(proof, KafkaProof) or found_io is None:
        return None
    partition = partition_of(write_id, proof.known_partitions)
    end = found_io.high_watermark(partition)  # read before the directory, as a stream's tasks do
    if generated:
        # Written before any task runs: the driver of a failed write may die before its abort could write it.
        _write_entry(found_io, write_id, {partition: end})
        return ProofStart(partition, {partition: end}, fresh=True)
    found = found_io.lookup(write_id)
    starts = dict(found or {})
    starts.setdefault(partition, end)
    if found != starts:
        _write_entry(found_io, write_id, starts)
    return ProofStart(partition, starts, fresh=found is None)


def _write_entry(io: ProofIO, scope: str, starts: dict[int, int]) -> None:
    io.produce([(0, DirectoryKey(scope).encode(), encode_directory(starts))], f"the directory entry of {scope}")


def finish_write(options: SinkOptions, write_id: str, start: ProofStart | None, generated: bool,
                 messages: Sequence[WriterCommitMessage | None], io: ProofIO | None = None) -> None:
    """At the driver's commit: a generated-id write's proof is released; a ``wal.writeId`` write's directory entry is
    written again, so that it outlives the proof its tasks wrote. Best effort: what a release misses goes with the
    topic's retention."""
    proof, found_io = options.proof, _io(options, io)
    if not isinstance(proof, KafkaProof) or start is None or found_io is None:
        return
    try:
        if generated:
            records: list[tuple[int, bytes, bytes | None]] = [
                (start.partition, key, None) for key in release_keys(write_id, messages)]
            records.append((0, DirectoryKey(write_id).encode(), None))
            found_io.produce(records, f"the release of write {write_id}")
        else:
            _write_entry(found_io, write_id, dict(start.starts))
    except Exception as exc:  # noqa: BLE001 - the write is committed; its proof then goes with the retention
        log.warning("write %s: the proof topic %s could not be updated (%s); its proof goes with the topic's "
                    "retention (proof.retentionHours)", write_id, proof.topic, options.scrub(str(exc)))


def refresh_entry(options: SinkOptions, write_id: str, start: ProofStart | None, io: ProofIO | None = None) -> None:
    """At a failed write's abort: its directory entry is written again, to outlive the proof its tasks wrote (a
    generated id's too: the abort tells the user to re-run the write under it)."""
    found_io = _io(options, io)
    if found_io is not None and start is not None:
        try:
            _write_entry(found_io, write_id, dict(start.starts))
        except Exception as exc:  # noqa: BLE001 - the abort reports the write's own failure
            log.warning("write %s: its directory entry in the proof topic could not be written again (%s)", write_id,
                        options.scrub(str(exc)))


def release_keys(write_id: str, messages: Sequence[WriterCommitMessage | None]) -> list[bytes]:
    """Every proof record of a committed write its tasks know of: their chunks and markers."""
    keys: set[bytes] = set()
    for m in messages:
        if not isinstance(m, SinkCommitMessage) or m.proof_topic is None:
            continue
        for attempt, run, exactly_once, chunks in m.proof_chunks:
            keys.update(ChunkKey(write_id, write_id, run, m.partition, attempt, exactly_once, n).encode()
                        for n in range(chunks))
        keys.add(MarkerKey(write_id, m.partition).encode())
    return sorted(keys)


def advance_stream(options: SinkOptions, messages: Sequence[WriterCommitMessage | None],
                   io: ProofIO | None = None) -> None:
    """At a micro-batch's commit: its query's directory entry moves to where this micro-batch's proof starts, which
    every later micro-batch's proof follows (Spark starts the next only once this one is in its commit log)."""
    found_io = _io(options, io)
    done = [m for m in messages if isinstance(m, SinkCommitMessage) and m.proof_topic is not None]
    if found_io is None or not done or done[0].query_id is None:
        return
    lows = [m.proof_low for m in done if m.proof_low is not None]
    partition = done[0].proof_partition
    try:
        # A micro-batch that wrote no proof (empty partitions) moves the entry to the partition's end: left where it
        # was, it would age past the retention in an idle query and its next micro-batch would find it expired.
        low = min(lows) if lows else found_io.high_watermark(partition)
        _write_entry(found_io, done[0].query_id, {partition: low})
    except Exception as exc:  # noqa: BLE001 - the next micro-batch then reads from the entry as it was
        log.warning("query %s: its directory entry in the proof topic could not be moved on (%s)", done[0].query_id,
                    options.scrub(str(exc)))
