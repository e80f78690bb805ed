"""The attempt store: :class:`Wal`, an attempt's reads and writes in the log (begin, append with its
acknowledgements, compaction of acknowledged segments, state changes, finish, purge, segments and counts)."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import NamedTuple, Protocol

import lmdb
import pyarrow as pa

from recoverable_sink.errors import WalError, WalFullError
from recoverable_sink.identity import DIGEST_SIZE, DeliveredSet
from recoverable_sink.wal import attempt as _attempt
from recoverable_sink.wal.attempt import DONE, AttemptInfo, AttemptState, Owner, decode_attempt
from recoverable_sink.wal.env import Gate, Transactions, check_room, open_env
from recoverable_sink.wal.format import (
    ACKS,
    ALL_ACKED,
    META,
    SEGMENTS,
    SEQUENCE_KEY,
    USAGE_KEY,
    Segment,
    ack_key,
    ack_key_of,
    all_acked,
    claims_prefix,
    decode_claims,
    decode_segment,
    encode_acks,
    encode_claims,
    encode_segment,
    meta_key,
    payload_len,
    record_count,
    segment_key,
    segment_value,
    segments_start,
)


class _Entry(NamedTuple):
    """A stored segment as its header tells it."""

    key: bytes
    ack: bytes  # its bitmap's key
    payload: int  # payload bytes it holds
    all_acked: bool  # rewritten as digests alone


@dataclass(frozen=True)
class WalStats:
    """What ``Wal.stats`` finds: payload bytes by the usage counter and by a scan, and orphaned entries."""

    used_bytes: int
    payload_bytes: int
    attempts: int
    orphaned_entries: int


class Wal(Transactions):
    """The write-ahead log in one directory. Obtain it with :func:`open_wal`."""

    def __init__(self, path: str, env: lmdb.Environment, gate: Gate | None = None) -> None:
        super().__init__(path, env, gate)
        # Segments this handle appended whose payload is still stored: segment key -> (digests, payload
        # length). Compacting one of them needs neither to read back its payload nor to checksum it again.
        self._appended: dict[bytes, tuple[bytes, int]] = {}

    # ---- attempts -------------------------------------------------------------------------------------
    def begin_attempt(self, write_id: str, partition: int, attempt: int, fields: Mapping[str, object]) -> str:
        """Register a new attempt and return its path ``<write id>/<partition>/<attempt key>``. ``fields``: the
        task identity's WAL fields and what the writer adds (kind, topic, cluster id, guarantee), recorded in its
        :class:`AttemptInfo` with this process as its owner.

        The attempt key starts with the order attempts began in on this host (an LMDB sequence, no clock), so a prefix
        scan lists them in that order, and ends with a random part so that no two hosts' keys collide."""
        created = _attempt.host.now()
        owner = Owner.this_process()
        tail = f"{attempt:03d}-{uuid.uuid4().hex[:8]}"
        made: list[str] = []

        def body(txn: lmdb.Transaction[bytes]) -> None:  # run again whole if LMDB retries the transaction
            last = txn.get(SEQUENCE_KEY)
            seq = (int.from_bytes(last, "big") if last else 0) + 1
            txn.put(SEQUENCE_KEY, seq.to_bytes(8, "big"))
            key = f"{write_id}/{partition:06d}/{seq:020d}-{tail}"
            record = AttemptInfo.begun(key, write_id, partition, attempt, {**fields, "seq": seq},
                                       host=_attempt.host.name(), created=created, owner=owner)
            txn.put(meta_key(key), record.encode())
            made[:] = [key]

        self._write(body)
        return made[0]

    def attempts(self, prefix: str = "") -> list[AttemptInfo]:
        """Attempts whose path starts with ``prefix`` (``"<write id>/"``, ``"<write id>/<partition>/"``)."""
        found: list[AttemptInfo] = []
        start = meta_key(prefix)
        with self._read() as txn:
            cursor = txn.cursor()
            if not cursor.set_range(start):
                return found
            for k, v in cursor:
                if not k.startswith(start):
                    break
                found.append(decode_attempt(self.path, k[len(META):].decode(), v))
        return found

    def attempt_keys(self, prefix: str = "") -> list[str]:
        """The paths of the attempts :meth:`attempts` would list, without decoding their records (a purge must reach
        those it cannot read)."""
        start = meta_key(prefix)
        with self._read() as txn:
            cursor = txn.cursor()
            if not cursor.set_range(start):
                return []
            keys = []
            for k in cursor.iternext(keys=True, values=False):
                if not k.startswith(start):
                    break
                keys.append(k[len(META):].decode())
        return keys

    def delivered(self, attempt_keys: list[str], all_acknowledged: bool = False) -> DeliveredSet:
        """What these attempts logged, and which of it Kafka acknowledged, as a multiset of record digests.
        Digests include the cluster id and topic, so attempts towards another destination never match.
        ``all_acknowledged``: every logged record counts (attempts whose Kafka transaction committed)."""
        delivered = DeliveredSet()
        for key in attempt_keys:
            for seg in self.segments(key, payload=False):
                delivered.add(seg.digests, None if all_acknowledged else seg.acked)
        return delivered

    def prior_attempts(self, write_id: str, partition: int) -> list[AttemptInfo]:
        """Every attempt of this write's partition logged here, oldest first (asked before a new one begins)."""
        return self.attempts(f"{write_id}/{partition:06d}/")

    def set_state(self, attempt_key: str, state: AttemptState, acks: dict[int, bytearray] | None = None) -> None:
        """Move an attempt to ``logged`` or ``done``, with the acknowledgement bitmaps that changed."""
        def body(txn: lmdb.Transaction[bytes]) -> None:
            self._put_acks(txn, attempt_key, acks or {})
            self._set_state(txn, attempt_key, state)

        self._write(body)
        self._forget_compacted(attempt_key, acks or {})

    def set_published(self, attempt_key: str) -> None:
        """Note that the proof topic holds this attempt's whole proof of delivery."""
        def body(txn: lmdb.Transaction[bytes]) -> None:
            txn.put(meta_key(attempt_key), self._record(txn, attempt_key).with_published().encode())

        self._write(body)

    def end_attempt(self, attempt_key: str) -> None:
        """Note that a failed attempt stopped sending, its acknowledgements saved: a retry waiting for it goes on."""
        def body(txn: lmdb.Transaction[bytes]) -> None:
            txn.put(meta_key(attempt_key), self._record(txn, attempt_key).with_end(_attempt.host.now()).encode())

        self._write(body)

    def _require_attempt(self, txn: lmdb.Transaction[bytes], attempt_key: str) -> bytes:
        raw = txn.get(meta_key(attempt_key))
        if raw is None:
            raise WalError(f"WAL {self.path}: attempt {attempt_key} is no longer in the log (purged while it ran?); "
                           "this attempt stops before sending anything more, and its retry starts afresh")
        return raw

    def _record(self, txn: lmdb.Transaction[bytes], attempt_key: str) -> AttemptInfo:
        return decode_attempt(self.path, attempt_key, self._require_attempt(txn, attempt_key))

    def _set_state(self, txn: lmdb.Transaction[bytes], attempt_key: str, state: AttemptState) -> None:
        txn.put(meta_key(attempt_key), self._record(txn, attempt_key).with_state(state, _attempt.host.now()).encode())

    # ---- writing --------------------------------------------------------------------------------------
    def append(self, attempt_key: str, first: int, batch: pa.RecordBatch, digests: bytes, max_bytes: int,
               acks: dict[int, bytearray]) -> int:
        """Durably store one batch at positions [first, first + n), its records' digests, and the
        acknowledgement bitmaps in ``acks`` (segment first position -> bitmap). Returns the payload's size.

        Raises WalFullError, leaving the WAL as it was, when the payload would take the WAL past
        ``max_bytes`` (payload of records Kafka has not acknowledged)."""
        value, length = segment_value(first, digests, batch)
        prefix = attempt_key.encode()
        seg_key = segment_key(prefix, first)
        check_room(self.path, value.size)

        def body(txn: lmdb.Transaction[bytes]) -> None:
            self._require_attempt(txn, attempt_key)  # nothing of an attempt that is gone may enter the log
            self._put_acks(txn, attempt_key, acks)  # may free bytes: fully acknowledged segments drop payload
            used = int(txn.get(USAGE_KEY) or b"0")
            if used + length > max_bytes:
                raise WalFullError(
                    f"WAL {self.path} holds {used} bytes not yet acknowledged by Kafka and the next "
                    f"{batch.num_rows} records to log ({length} bytes) would pass wal.maxBytes={max_bytes}; nothing "
                    "was dropped: the records accepted so far stay in the WAL until Kafka acknowledges them. Raise "
                    "wal.maxBytes, free the WAL of failed writes (`recoverable-kafka-wal list`), or use smaller "
                    "Arrow batches (spark.sql.execution.arrow.maxRecordsPerBatch)"
                )
            txn.put(seg_key, value)
            txn.put(ack_key(prefix, first), encode_acks(bytearray(batch.num_rows)))
            txn.put(USAGE_KEY, str(used + length).encode())

        self._write(body)
        self._appended[seg_key] = (digests, length)
        self._forget_compacted(attempt_key, acks)
        return length

    def save_acks(self, attempt_key: str, acks: dict[int, bytearray]) -> None:
        """Durably store acknowledgement bitmaps (segment first position -> bitmap)."""
        if acks:
            def body(txn: lmdb.Transaction[bytes]) -> None:
                self._require_attempt(txn, attempt_key)
                self._put_acks(txn, attempt_key, acks)

            self._write(body)
            self._forget_compacted(attempt_key, acks)

    def _put_acks(self, txn: lmdb.Transaction[bytes], attempt_key: str, acks: dict[int, bytearray]) -> None:
        prefix = attempt_key.encode()
        freed = 0
        for seg_first, bitmap in acks.items():
            if 0 not in bitmap:
                freed += self._compact(txn, segment_key(prefix, seg_first), bitmap)
                txn.delete(ack_key(prefix, seg_first))
            else:
                txn.put(ack_key(prefix, seg_first), encode_acks(bitmap))
        if freed:
            self._release(txn, freed)

    def _forget_compacted(self, attempt_key: str, acks: dict[int, bytearray]) -> None:
        """After the commit: segments just rewritten as digests are no longer this handle's to compact."""
        prefix = attempt_key.encode()
        for seg_first, bitmap in acks.items():
            if 0 not in bitmap:
                self._appended.pop(segment_key(prefix, seg_first), None)

    def _compact(self, txn: lmdb.Transaction[bytes], seg_key: bytes, acked: bytes | bytearray) -> int:
        """Rewrite a segment as the digests of its acknowledged records alone; returns the payload bytes freed."""
        known = self._appended.get(seg_key)
        if known is not None and 0 not in acked:
            # Appended by this handle, so its digests and size are known: only check that it is still there (a
            # cursor finds the key without copying the value out of the map).
            digests, length = known
            if not txn.cursor().set_key(seg_key):
                return 0
            txn.put(seg_key, encode_segment(int(seg_key.rsplit(b"/", 1)[1]), digests, b"", ALL_ACKED))
            return length
        value = txn.get(seg_key)
        if value is None:
            return 0
        seg = self._decode(seg_key, value, None, payload=False)
        if 0 not in acked:
            kept = seg.digests
        else:
            kept = b"".join(seg.digests[i * DIGEST_SIZE:(i + 1) * DIGEST_SIZE] for i in range(seg.count) if acked[i])
        txn.put(seg_key, encode_segment(seg.first, kept, b"", ALL_ACKED))
        return payload_len(value)

    @staticmethod
    def _release(txn: lmdb.Transaction[bytes], freed: int) -> None:
        """Take ``freed`` payload bytes off the usage counter."""
        used = int(txn.get(USAGE_KEY) or b"0")
        txn.put(USAGE_KEY, str(max(0, used - freed)).encode())

    def finish(self, attempt_key: str, superseded: list[str], dropped: list[str] | None = None) -> None:
        """A successful attempt: mark it done; drop what the attempts it superseded still hold beyond the
        digests of records Kafka acknowledged to them (its own records were all acknowledged), and delete the
        ``dropped`` attempts altogether, in the same transaction."""
        def body(txn: lmdb.Transaction[bytes]) -> None:
            freed = self._delete(txn, dropped or [])
            for key in superseded:
                for entry in self._segment_entries(txn, key):
                    if entry.all_acked:
                        continue
                    value = txn.get(entry.key)
                    if value is None:
                        continue
                    seg = self._decode(entry.key, value, txn.get(entry.ack), payload=False)
                    freed += self._compact(txn, entry.key, seg.acked)
                    txn.delete(entry.ack)
                if txn.get(meta_key(key)) is not None:
                    self._set_state(txn, key, DONE)
            self._set_state(txn, attempt_key, DONE)
            if freed:
                self._release(txn, freed)

        self._write(body)

    # ---- re-runs ------------------------------------------------------------------------------------------
    def claim(self, write_id: str, run: str, partition: int, digests: list[bytes], proven: Counter[bytes],
              taken: Counter[bytes]) -> list[bool]:
        """Count records of one batch of ``partition`` as delivered by an earlier run of the write, in one
        transaction, so that of all partitions of run ``run`` on this host no two count the same acknowledged
        copy. ``proven`` is the earlier runs' proof (record digest -> acknowledged copies); ``taken``, what this
        attempt already counted (updated). A partition's own earlier claims in the same run are its to take again:
        a retry of it recomputes the same input. Returns, per record, whether it is already delivered."""
        prefix = claims_prefix(write_id, run)
        result: list[bool] = []
        counted: Counter[bytes] = Counter()

        def body(txn: lmdb.Transaction[bytes]) -> None:  # run again whole if LMDB retries the transaction
            found, now = claim_copies(digests, partition, proven, taken, _Claims(txn, prefix))
            result[:] = found
            counted.clear()
            counted.update(now)

        self._write(body)
        taken.update(counted)
        return result

    def purge(self, attempt_keys: list[str]) -> int:
        """Delete attempts (metadata, segments, bitmaps) in one transaction; returns the payload bytes freed."""
        if not attempt_keys:
            return 0
        freed = 0

        def body(txn: lmdb.Transaction[bytes]) -> None:
            nonlocal freed
            freed = self._delete(txn, attempt_keys)
            self._release(txn, freed)

        self._write(body)
        return freed

    def _delete(self, txn: lmdb.Transaction[bytes], attempt_keys: list[str]) -> int:
        """Delete attempts' metadata, segments and bitmaps; returns the payload bytes freed (the caller
        updates the usage counter)."""
        freed = 0
        for key in attempt_keys:
            txn.delete(meta_key(key))
            for entry in self._segment_entries(txn, key):
                freed += entry.payload
                txn.delete(entry.key)
                txn.delete(entry.ack)
        return freed

    def proof_bytes(self, attempt_keys: list[str]) -> dict[str, int]:
        """The bytes each attempt's segments take in the log (headers, digests, any payload), by its key (one
        read, values not copied out of the map)."""
        sizes: dict[str, int] = {}
        with self._read(buffers=True) as txn:
            cursor = txn.cursor()
            for key in attempt_keys:
                start, total = segments_start(key), 0
                if cursor.set_range(start):
                    for k, v in cursor:
                        if not bytes(k).startswith(start):
                            break
                        total += len(v)
                sizes[key] = total
        return sizes

    def trim_proof(self, attempt_keys: list[str]) -> None:
        """Delete the segments and bitmaps of attempts holding only proof of delivery, keeping their records,
        marked trimmed, so that a later attempt still knows what they were (one transaction)."""
        def body(txn: lmdb.Transaction[bytes]) -> None:
            for key in attempt_keys:
                value = txn.get(meta_key(key))
                if value is None:
                    continue
                for entry in self._segment_entries(txn, key):
                    txn.delete(entry.key)
                    txn.delete(entry.ack)
                txn.put(meta_key(key), decode_attempt(self.path, key, value).with_proof_trimmed().encode())

        if attempt_keys:
            self._write(body)

    def drop_claims(self, write_ids: set[str]) -> None:
        """Delete the re-run claims of writes that have no attempt left here. Only the retention sweep calls
        this: a task that read the earlier runs' proof and has yet to claim from it must find the claims other
        partitions made meanwhile, which a purge of the write's last attempts must not take away."""
        def body(txn: lmdb.Transaction[bytes]) -> None:
            for write_id in write_ids:
                start = meta_key(f"{write_id}/")
                cursor = txn.cursor()
                if cursor.set_range(start) and cursor.key().startswith(start):
                    continue
                self._delete_range(txn, claims_prefix(write_id))

        if write_ids:
            self._write(body)

    @staticmethod
    def _delete_range(txn: lmdb.Transaction[bytes], prefix: bytes) -> None:
        cursor = txn.cursor()
        if not cursor.set_range(prefix):
            return
        while cursor.key().startswith(prefix):
            if not cursor.delete():
                break

    def holding_payload(self, attempt_keys: list[str]) -> set[str]:
        """Which of these attempts still hold a segment with records Kafka never acknowledged (one read)."""
        with self._read() as txn:
            return {key for key in attempt_keys
                    if any(not entry.all_acked for entry in self._segment_entries(txn, key))}

    def used_bytes(self) -> int:
        with self._read() as txn:
            return int(txn.get(USAGE_KEY) or b"0")

    def stats(self) -> WalStats:
        """Recount what the WAL holds by scanning it: the payload bytes (against the usage counter) and the
        segment or bitmap entries whose attempt has no metadata (orphans: never replayed, safe to purge)."""
        attempts: set[bytes] = set()
        payload = orphans = 0
        with self._read() as txn:
            cursor = txn.cursor()
            if cursor.set_range(META):
                for k in cursor.iternext(keys=True, values=False):
                    if not k.startswith(META):
                        break
                    attempts.add(k[2:])
            for kind in (ACKS, SEGMENTS):
                if not cursor.set_range(kind):
                    continue
                for k, v in cursor:
                    if not k.startswith(kind):
                        break
                    if k[2:].rsplit(b"/", 1)[0] not in attempts:
                        orphans += 1
                    elif kind == SEGMENTS:
                        payload += payload_len(v)
            used = int(txn.get(USAGE_KEY) or b"0")
        return WalStats(used_bytes=used, payload_bytes=payload, attempts=len(attempts), orphaned_entries=orphans)

    # ---- reading --------------------------------------------------------------------------------------
    def segments(self, attempt_key: str, payload: bool = True) -> Iterator[Segment]:
        """Decode an attempt's segments in position order, checking every checksum; ``payload=False`` skips
        decoding the records (digests and bitmaps only)."""
        start = segments_start(attempt_key)
        with self._read() as txn:
            keys = []
            cursor = txn.cursor()
            if cursor.set_range(start):
                for k in cursor.iternext(keys=True, values=False):
                    if not k.startswith(start):
                        break
                    keys.append(k)
        for k in keys:
            with self._read() as txn:
                value = txn.get(k)
                ack_value = txn.get(ack_key_of(k))
                if value is None:
                    continue
                segment = self._decode(k, value, ack_value, payload)
            yield segment

    def record_count(self, attempt_key: str) -> int:
        """How many records an attempt logged, from the segment headers alone (no payload read, no checksum:
        for progress reports; :meth:`segments` checks every byte)."""
        start = segments_start(attempt_key)
        total = 0
        with self._read() as txn:
            cursor = txn.cursor()
            if cursor.set_range(start):
                for k, v in cursor.iternext():
                    if not k.startswith(start):
                        break
                    total += record_count(v)
        return total

    def _segment_entries(self, txn: lmdb.Transaction[bytes], attempt_key: str) -> list[_Entry]:
        """An attempt's segments, in position order, as read from their headers: each value is let go once its
        header is read, since an attempt's segments can hold gigabytes (the digests alone are 16 bytes a record)
        and a purge or sweep holding them all at once made a commit's Python worker grow by as much."""
        start = segments_start(attempt_key)
        cursor = txn.cursor()
        found = []
        if cursor.set_range(start):
            for k, v in cursor:
                if not k.startswith(start):
                    break
                found.append(_Entry(k, ack_key_of(k), payload_len(v), all_acked(v)))
        return found

    def _decode(self, key: bytes, value: bytes, ack_value: bytes | None, payload: bool) -> Segment:
        return decode_segment(f"WAL {self.path}, entry {key.decode()}", value, ack_value, payload)


class ClaimBook(Protocol):
    """Where a run's claims are kept: per record digest, the copies each partition counted."""

    def get(self, digest: bytes) -> dict[int, int]: ...

    def put(self, digest: bytes, claims: dict[int, int]) -> None: ...


class _Claims:
    """A run's claims in one LMDB write transaction."""

    def __init__(self, txn: lmdb.Transaction[bytes], prefix: bytes) -> None:
        self.txn, self.prefix = txn, prefix

    def get(self, digest: bytes) -> dict[int, int]:
        return decode_claims(self.txn.get(self.prefix + digest))

    def put(self, digest: bytes, claims: dict[int, int]) -> None:
        self.txn.put(self.prefix + digest, encode_claims(claims))


def claim_copies(digests: list[bytes], partition: int, proven: Counter[bytes], taken: Counter[bytes],
                 book: ClaimBook) -> tuple[list[bool], Counter[bytes]]:
    """The claim rule (:meth:`Wal.claim`), apart from its storage: per record, whether ``partition`` may count one
    more of the ``proven`` copies as its own, given what the run's other partitions claimed (``book``) and what this
    attempt counted before (``taken``); and the copies counted now, which the caller adds to ``taken`` once the
    claims are stored."""
    result: list[bool] = []
    counted: Counter[bytes] = Counter()
    for d in digests:
        available = proven.get(d, 0)
        if not available:
            result.append(False)
            continue
        claims = book.get(d)
        others = sum(n for p, n in claims.items() if p != partition)
        mine = taken[d] + counted[d]
        if mine < available - others:
            counted[d] += 1
            if claims.get(partition, 0) < mine + 1:
                claims[partition] = mine + 1
                book.put(d, claims)
            result.append(True)
        else:
            result.append(False)
    return result, counted


def open_wal(path: str) -> Wal:
    """Open (once per process, at most 16 directories at a time) the WAL under ``path``, creating it with
    owner-only permissions."""
    return Wal(*open_env(path))
