"""The WAL side of one task attempt (executor): its entry in the host's WAL, the stores and acknowledgement saves
queued on the process's WAL thread, and what the write's earlier attempts left there.

:class:`AttemptLog` is the WAL on; :class:`NoLog` (``wal.enabled=false``) keeps nothing. Both are a
:class:`LogOfAttempt`, the type the writers hold, so they never ask which one it is.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import suppress
from typing import Any, NamedTuple, Protocol

import pyarrow as pa

from recoverable_sink._logging import get_logger
from recoverable_sink.contract import TaskIdentity
from recoverable_sink.errors import WalError
from recoverable_sink.executor import retention
from recoverable_sink.executor.resume_plan import Finish
from recoverable_sink.identity import Fingerprint, record_digests
from recoverable_sink.options import SinkOptions
from recoverable_sink.wal import DONE, LOGGED, AttemptInfo, Wal, open_wal

log = get_logger("attempt_log")

Acks = dict[int, bytearray]


class Stored(NamedTuple):
    """A segment in the log: its payload's bytes and its records' digests."""

    payload: int
    digests: bytes

_threads: dict[str, ThreadPoolExecutor] = {}


def helper_thread(name: str) -> ThreadPoolExecutor:
    """One of the process's helper threads: "wal" writes the WAL, "hash" hashes digests (Python workers are
    reused across tasks, so are the threads)."""
    if name not in _threads:
        _threads[name] = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"recoverable-sink-{name}")
    return _threads[name]


class LogOfAttempt(Protocol):
    """What a writer holds of its attempt's log: :class:`AttemptLog`, or :class:`NoLog` with the WAL off. ``key`` is
    the attempt's path once begun (None before, and always without a WAL); ``seq`` the order it began in here;
    ``wal`` the host's WAL (None without one), where earlier attempts' proof is read."""

    path: str | None
    key: str | None
    seq: int | None
    wal: Wal | None

    def begin(self, ident: TaskIdentity, meta: dict[str, object]) -> None: ...

    def write_attempts(self) -> list[AttemptInfo]: ...

    def record_count(self, key: str) -> int: ...

    def latest_micro_batch(self, query_id: str) -> int | None: ...

    def end(self) -> None: ...

    def drop(self) -> None: ...

    def store(self, batch: pa.RecordBatch, first: int, digests: bytes | None, acks: Acks,
              topic_option: str | None, cluster_id: str, fingerprint: Fingerprint) -> Future[Stored] | None: ...

    def save_acks(self, acks: Acks, sync: bool = True) -> None: ...

    def wait(self) -> None: ...

    def settle(self) -> list[Acks]: ...

    def mark_logged(self, acks: Acks) -> None: ...

    def apply(self, finish: Finish) -> None: ...

    def publish(self) -> None: ...


class NoLog:
    """``wal.enabled=false``: nothing is logged, no earlier attempt is known here, nothing is proven here."""

    path: str | None = None
    key: str | None = None
    seq: int | None = None
    wal: Wal | None = None

    def begin(self, ident: TaskIdentity, meta: dict[str, object]) -> None:
        """Nothing to begin."""

    def write_attempts(self) -> list[AttemptInfo]:
        """No log: no earlier attempt is known."""
        return []

    def record_count(self, key: str) -> int:
        return 0

    def latest_micro_batch(self, query_id: str) -> int | None:
        return None

    def end(self) -> None:
        """Nothing to end."""

    def drop(self) -> None:
        """Nothing to drop."""

    def store(self, batch: pa.RecordBatch, first: int, digests: bytes | None, acks: Acks,
              topic_option: str | None, cluster_id: str, fingerprint: Fingerprint) -> Future[Stored] | None:
        return None

    def save_acks(self, acks: Acks, sync: bool = True) -> None:
        """Nothing to save."""

    def wait(self) -> None:
        """Nothing queued."""

    def settle(self) -> list[Acks]:
        return []

    def mark_logged(self, acks: Acks) -> None:
        """Nothing to mark."""

    def apply(self, finish: Finish) -> None:
        """Nothing to keep as proof."""

    def publish(self) -> None:
        """Nothing to note."""


class AttemptLog:
    """One attempt's entry in the host's WAL. :meth:`open` runs the retention rules a starting task runs
    (:mod:`recoverable_sink.executor.retention`); :meth:`begin` opens this attempt's entry.

    Writes go to the process's one WAL thread in order: a batch's store, then the acknowledgement saves queued
    after it, so a segment's bitmap is never written before the segment, nor an older bitmap after a newer one.
    Once a write failed no later batch enters the log, and the bitmaps it carried are kept for :meth:`settle`."""

    def __init__(self, wal: Wal, options: SinkOptions, ident: TaskIdentity) -> None:
        self.wal: Wal | None = wal
        self._wal = wal
        self.path: str | None = wal.path
        self.options = options
        self.ident = ident
        self.key: str | None = None
        self.seq: int | None = None  # the order this attempt began in on the host, once begun
        self._last_store: Future[Stored] | None = None
        self._last_job: Future[Any] | None = None  # the newest store or acknowledgement save queued
        self._failed: BaseException | None = None  # a failed store or save: no later batch enters the log
        self._save_failed: BaseException | None = None
        # Bitmaps taken from the ledger whose write failed: the ledger forgets a fully acknowledged segment once
        # its bitmap is taken, so they go back to it after a failure, to be saved again.
        self._unsaved: list[Acks] = []

    @classmethod
    def open(cls, options: SinkOptions, ident: TaskIdentity) -> AttemptLog:
        wal = open_wal(options.resolved_wal_path())
        stream = (ident.query_id, ident.batch_id) if ident.kind == "stream" and ident.query_id is not None \
            and ident.batch_id is not None else None
        retention.as_task_starts(wal, options.retention_seconds, options.proof_max_bytes, stream)
        return cls(wal, options, ident)

    def begin(self, ident: TaskIdentity, meta: dict[str, object]) -> None:
        self.key = self._wal.begin_attempt(ident.write_id, ident.partition, ident.attempt,
                                           {**ident.wal_fields(), **meta})

    def write_attempts(self) -> list[AttemptInfo]:
        """The write's attempts in this WAL, any partition, this one included. An attempt whose own entry is gone (a
        release purged it while it ran) fails before sending anything."""
        found = self._wal.attempts(f"{self.ident.write_id}/")
        own = next((a for a in found if a.key == self.key), None)
        if own is not None:
            self.seq = own.seq
        if self.key is not None and own is None:
            raise WalError(f"WAL {self.path}: attempt {self.key} is no longer in the log (purged while it ran?); "
                           "this attempt stops before sending anything, and its retry starts afresh")
        return found

    def record_count(self, key: str) -> int:
        return self._wal.record_count(key)

    def latest_micro_batch(self, query_id: str) -> int | None:
        batches = [a.batch_id for a in self._wal.attempts(f"{query_id}-b")
                   if a.query_id == query_id and a.batch_id is not None and a.key != self.key]
        return max(batches, default=None)

    def end(self) -> None:
        """After a failure, behind the acknowledgement saves still queued: no retry need wait for this attempt."""
        if self.key is not None:
            key = self.key
            helper_thread("wal").submit(self._wal.end_attempt, key).result()

    def drop(self) -> None:
        """Remove this attempt's entry before anything was logged under it (a start that failed once begun)."""
        if self.key is not None:
            try:
                self._wal.purge([self.key])
            except Exception:  # noqa: BLE001 - at least no retry is to wait for it
                with suppress(Exception):
                    self._wal.end_attempt(self.key)
            self.key = None

    def store(self, batch: pa.RecordBatch, first: int, digests: bytes | None, acks: Acks,
              topic_option: str | None, cluster_id: str, fingerprint: Fingerprint) -> Future[Stored]:
        """Queue the batch (records ``first``...) with its digests and the bitmaps changed since the last write;
        the future gives the payload bytes stored and the digests. Without ``digests`` they are hashed on their own
        thread while the WAL thread may still be storing the batch before (both mostly without the GIL), and added to
        ``fingerprint`` there."""
        assert self.key is not None
        wal, key, max_bytes = self._wal, self.key, self.options.wal_max_bytes
        hashed = helper_thread("hash").submit(record_digests, batch, topic_option, cluster_id) \
            if digests is None else None

        def store() -> Stored:
            try:
                if self._failed is not None:  # a refused batch lets no later batch into the log
                    raise self._failed
                ids = hashed.result() if hashed is not None else digests
                assert ids is not None
                if hashed is not None:
                    fingerprint.add(ids)
                return Stored(wal.append(key, first, batch, ids, max_bytes, acks), ids)
            except BaseException as exc:
                self._failed = self._failed or exc
                if acks:
                    self._unsaved.append(acks)
                raise

        self._last_store = helper_thread("wal").submit(store)
        self._last_job = self._last_store
        return self._last_store

    def save_acks(self, acks: Acks, sync: bool = True) -> None:
        """Queue the bitmaps behind the stores; with ``sync``, return once every queued write is done (raising a
        failed save's error)."""
        if self.key is None:
            return
        if acks:
            wal, key = self._wal, self.key

            def save() -> None:
                try:
                    wal.save_acks(key, acks)
                except BaseException as exc:
                    self._save_failed = exc
                    self._failed = self._failed or exc  # no later batch enters the log either
                    self._unsaved.append(acks)
                    raise

            self._last_job = helper_thread("wal").submit(save)
        if sync:
            self.wait()

    def wait(self) -> None:
        """Return once every queued write is done, raising a failed save's error (a failed store is reported where
        its batch is produced)."""
        if self._last_job is not None:
            wait([self._last_job])
        if self._save_failed is not None:
            raise self._save_failed

    def settle(self) -> list[Acks]:
        """After a failure: wait for the queued writes whatever their outcome (LMDB commits whole or not at all)
        and hand back the bitmaps that did not land, newest first, so that a segment in two of them comes back
        with its later bitmap."""
        if self._last_job is not None:
            wait([self._last_job])
        self._save_failed = None  # a failed write's error is the task's, already raised
        unsaved = list(reversed(self._unsaved))
        self._unsaved.clear()
        return unsaved

    def mark_logged(self, acks: Acks) -> None:
        """The whole partition is in the log: wait for the last store and the queued saves, then mark the attempt
        ``logged`` with the bitmaps changed since."""
        if self.key is None:
            return
        try:
            if self._last_store is not None:
                self._last_store.result()
            self.wait()
            self._wal.set_state(self.key, LOGGED, acks)
        except BaseException:
            self._unsaved.append(acks)
            raise

    def apply(self, finish: Finish) -> None:
        """At the attempt's commit: what becomes of it and of the other attempts of its partition here
        (:func:`~recoverable_sink.executor.resume_plan.finishing`)."""
        if self.key is None:
            return
        if finish.purge_own:
            self._wal.purge([self.key, *finish.dropped])
        else:
            self._wal.finish(self.key, list(finish.superseded), dropped=list(finish.dropped))
        for key in finish.committed:  # a marker names them: their transactions committed
            with suppress(WalError):  # purged meanwhile: nothing left to mark
                self._wal.set_state(key, DONE)

    def publish(self) -> None:
        """The proof topic holds this attempt's whole proof of delivery: the WAL's copy may go (see retention)."""
        if self.key is not None:
            with suppress(WalError):
                self._wal.set_published(self.key)


def open_log(options: SinkOptions, ident: TaskIdentity) -> LogOfAttempt:
    """The attempt's log: the host's WAL, or nothing when ``wal.enabled=false``."""
    return AttemptLog.open(options, ident) if options.wal_enabled else NoLog()

