"""The attempt record: what the WAL keeps of one task attempt under ``m/`` (typed and versioned), its encoding, and
the one home of the rules read from it (still sending, kept by the sweep, proof released), so that the attempt
log, the retention and the CLI judge an attempt alike.

A record is JSON with ``"v": 1``. One without ``"v"`` was written before records carried a version (the same
fields) and reads as version 0; a newer version than :data:`VERSION` is refused, not guessed at. A field at its
default (None, False) is not written, so the JSON is the one the version before wrote, which took the presence of
``ended`` for "ended". Keys this version does not know are kept in :attr:`AttemptInfo.extra` and written back.

>>> rec = AttemptInfo.begun("w/000003/k", "w", 3, 0, {"run": "r1", "kind": "batch", "later": [1]}, host="h",
...                         created=1.0, owner=None)
>>> stored = rec.encode()
>>> json.loads(stored)["v"], decode_attempt("/wal", rec.key, stored) == rec, rec.run, rec.extra
(1, True, 'r1', {'later': [1]})
"""

from __future__ import annotations

import functools
import json
import os
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Protocol, TypeVar

from recoverable_sink.errors import WalCorruptionError, WalError

VERSION = 1  # of the attempt record: raised when a field's meaning changes, so that older code refuses, not misreads

T = TypeVar("T")


class AttemptState(str, Enum):
    """Where an attempt is: ``open`` -> ``logged`` (its whole partition is in the log) -> ``done`` (Kafka
    acknowledged everything, or its transaction committed; only digests are left, as proof of delivery)."""

    OPEN = "open"
    LOGGED = "logged"
    DONE = "done"


OPEN, LOGGED, DONE = AttemptState.OPEN, AttemptState.LOGGED, AttemptState.DONE


# ---- the process that began an attempt ------------------------------------------------------------------
@functools.cache
def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip()
    except OSError:
        return ""


def _started(pid: int) -> str | None:
    """A process's start time (clock ticks since boot), which tells it from a later process with its pid."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


class Host(Protocol):
    """What the WAL asks of the host it runs on: its name and boot, this process and whether a process still runs,
    and its wall clock (kept in records for operators; no rule decides by it but the sweep of published proof).
    :data:`host` is the machine's own; the writer's model scripts several hosts, their processes and their clocks."""

    def name(self) -> str: ...

    def boot(self) -> str: ...

    def pid(self) -> int: ...

    def started(self, pid: int) -> str | None: ...

    def now(self) -> float: ...


class ThisHost:
    def name(self) -> str:
        return socket.gethostname()

    def boot(self) -> str:
        return _boot_id()

    def pid(self) -> int:
        return os.getpid()

    def started(self, pid: int) -> str | None:
        return _started(pid)

    def now(self) -> float:
        return time.time()


host: Host = ThisHost()


@dataclass(frozen=True)
class Owner:
    """The process that began an attempt: its host, that host's boot, its pid and its start time."""

    host: str
    boot: str
    pid: int
    started: str | None  # None where /proc could not tell: then its liveness is never knowable

    @classmethod
    def this_process(cls) -> Owner:
        pid = host.pid()
        return cls(host=host.name(), boot=host.boot(), pid=pid, started=host.started(pid))

    def _visible_here(self) -> bool:
        """Whether this host can tell if the process runs: begun here, in this boot, with a known start time."""
        return self.host == host.name() and self.boot == host.boot() and bool(self.started)

    def runs_here(self) -> bool:
        """Whether the process is known to run still on this host (same boot, pid and start time); one this host
        cannot see counts as not running."""
        return self._visible_here() and host.started(self.pid) == self.started

    def may_still_run(self) -> bool:
        """Whether the process may still run: yes unless it is known to be gone (this host and boot, and no process
        with its pid and start time), since another host's or boot's process is not knowable from here."""
        return not self._visible_here() or host.started(self.pid) == self.started

    def to_json(self) -> dict[str, object]:
        return {"host": self.host, "boot": self.boot, "pid": self.pid, "started": self.started}

    @classmethod
    def from_json(cls, value: object) -> Owner:
        if not isinstance(value, dict):
            raise ValueError(f"owner {value!r}")
        return cls(host=_typed(value, "host", str), boot=_typed(value, "boot", str), pid=_typed(value, "pid", int),
                   started=_optional(value, "started", str))


# ---- the record -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class AttemptInfo:
    """One attempt's record, as stored under ``m/`` (``key`` is its path ``<write id>/<partition>/<attempt key>``,
    the rest the JSON's fields)."""

    key: str
    write_id: str
    partition: int
    attempt: int  # Spark's attempt number of the task (0 for the first)
    host: str
    created: float
    state: AttemptState = OPEN
    ended: float | None = None  # when a failed attempt stopped sending, its acknowledgements saved
    done_at: float | None = None  # when it was marked done
    owner: Owner | None = None  # None: written before owners were recorded
    kind: str | None = None  # "batch" or "stream"
    topic: str | None = None  # the write's topic option (None: each record names its own)
    cluster_id: str | None = None
    guarantee: str | None = None  # "at_least_once" or "exactly_once"
    run: str | None = None  # the run of the write (one driver-side writer; see recoverable_sink.runs)
    task_attempt_id: int | None = None  # Spark's, unique and ordered within one application
    stage: int | None = None
    query_id: str | None = None  # streaming only
    batch_id: int | None = None  # streaming only: the micro-batch
    generated: bool = False  # the write id was generated (never re-run), not given as wal.writeId
    seq: int | None = None  # the order attempts began in on this host (LMDB's serialised begins; None: before)
    trimmed: bool = False  # its proof of delivery (digests) was removed to keep wal.proofMaxBytes; the record stays
    # The proof topic holds its whole proof of delivery (exactly_once: committed with it; at_least_once: its last
    # checkpoint, after everything it logged was acknowledged or it stopped): the WAL's copy is then a cache.
    published: bool = False
    extra: dict[str, object] = field(default_factory=dict, hash=False)  # keys this version does not know

    @classmethod
    def begun(cls, key: str, write_id: str, partition: int, attempt: int, fields: Mapping[str, object], *,
              host: str, created: float, owner: Owner | None) -> AttemptInfo:
        """A new attempt's record. ``fields``: the task identity's ``extra`` (run, task attempt id, stage, query and
        batch ids, generated) and what the writer adds (kind, topic, cluster id, guarantee); keys this record does
        not type are kept in :attr:`extra`."""
        return _from_json(key, {**fields, "write_id": write_id, "partition": partition, "attempt": attempt,
                                "host": host, "created": created, "state": OPEN.value,
                                "owner": owner.to_json() if owner is not None else None})

    def encode(self) -> bytes:
        """The JSON stored under ``m/``, with this code's version."""
        meta: dict[str, object] = {**self.extra, "v": VERSION, "write_id": self.write_id, "partition": self.partition,
                                   "attempt": self.attempt, "host": self.host, "created": self.created,
                                   "state": AttemptState(self.state).value}
        for name in _OPTIONAL:
            value = getattr(self, name)
            if value is not None:
                meta[name] = value
        if self.owner is not None:
            meta["owner"] = self.owner.to_json()
        if self.generated:
            meta["generated"] = True
        if self.trimmed:
            meta["trimmed"] = True
        if self.published:
            meta["published"] = True
        return json.dumps(meta).encode()

    # ---- changes ----------------------------------------------------------------------------------------
    def with_state(self, state: AttemptState, now: float) -> AttemptInfo:
        """This record moved to ``state``; marked done for the first time, with the time (``done_at``)."""
        done_at = now if state == DONE and self.done_at is None else self.done_at
        return replace(self, state=AttemptState(state), done_at=done_at)

    def with_end(self, now: float) -> AttemptInfo:
        """This record of a failed attempt that stopped sending, its acknowledgements saved."""
        return replace(self, ended=now)

    def with_proof_trimmed(self) -> AttemptInfo:
        """This record once its digests are gone (:meth:`Wal.trim_proof`): it still says what the attempt was."""
        return replace(self, trimmed=True)

    def with_published(self) -> AttemptInfo:
        """This record once the proof topic holds its whole proof of delivery."""
        return replace(self, published=True)

    # ---- the rules read from it -------------------------------------------------------------------------
    @property
    def exactly_once(self) -> bool:
        """Written under exactly_once: its records count only once its transaction committed (it is then done)."""
        return self.guarantee == "exactly_once"

    def still_sending(self) -> bool:
        """Not done, not ended, and the process that began it runs here still: a failed task's Python worker goes on
        sending what its input had buffered, and a retry waits for it to end with its acknowledgements saved."""
        return self.state != DONE and self.ended is None and self.owner is not None and self.owner.runs_here()

    def may_be_running(self) -> bool:
        """For the retention sweep: not finished (neither done nor ended) while the process that began it may still
        run it. One whose process is gone, or written before owners were recorded, counts as a failed attempt."""
        return self.state != DONE and self.ended is None and self.owner is not None and self.owner.may_still_run()

    def micro_batch_of(self, query_id: str) -> int | None:
        """The micro-batch of streaming query ``query_id`` this attempt wrote; None for any other attempt."""
        return self.batch_id if self.query_id == query_id else None


_OPTIONAL = ("ended", "done_at", "kind", "topic", "cluster_id", "guarantee", "run", "task_attempt_id", "stage",
             "query_id", "batch_id", "seq")


# ---- decoding -------------------------------------------------------------------------------------------
def decode_attempt(path: str, key: str, value: bytes) -> AttemptInfo:
    """The record stored under ``m/<key>``; ``path`` (the WAL's) names it in the errors: one that does not decode
    (WalCorruptionError), or one a newer version of the sink wrote (WalError)."""
    try:
        meta = json.loads(value)
        if not isinstance(meta, dict):
            raise ValueError("not an object")
        version = _typed(meta, "v", int) if "v" in meta else 0  # no "v": written before records had a version
        if version < 0:
            raise ValueError(f"version {version}")
    except ValueError:
        raise _invalid(path, key) from None
    if version > VERSION:
        raise WalError(
            f"WAL {path}: attempt {key} was recorded by a newer version of recoverable-sink (attempt record version "
            f"{version}; this one reads versions up to {VERSION}), so this one cannot tell what it says. Upgrade "
            "recoverable-sink on this host, or delete that write's attempts from the WAL with `recoverable-kafka-wal "
            f"purge --path {path} --write-id {key.rsplit('/', 2)[0]}`")
    try:
        return _from_json(key, meta)
    except (ValueError, KeyError):
        raise _invalid(path, key) from None


def _invalid(path: str, key: str) -> WalCorruptionError:
    return WalCorruptionError(f"WAL {path}: metadata entry m/{key} is not valid; inspect it with "
                              "`recoverable-kafka-wal list`, then purge that attempt")


def _from_json(key: str, meta: Mapping[str, object]) -> AttemptInfo:
    """A record from its JSON fields (``v`` aside); raises ValueError or KeyError where one is missing or mistyped."""
    rest = {k: v for k, v in meta.items() if k != "v"}
    owner = rest.pop("owner", None)
    state = rest.pop("state", None)
    known = {"write_id", "partition", "attempt", "host", "created", "generated", "trimmed", "published", *_OPTIONAL}
    return AttemptInfo(
        key=key, write_id=_typed(rest, "write_id", str), partition=_typed(rest, "partition", int),
        attempt=_typed(rest, "attempt", int), host=_typed(rest, "host", str), created=_time(rest, "created"),
        state=AttemptState(state) if state is not None else OPEN, ended=_optional_time(rest, "ended"),
        done_at=_optional_time(rest, "done_at"), owner=Owner.from_json(owner) if owner is not None else None,
        kind=_optional(rest, "kind", str), topic=_optional(rest, "topic", str),
        cluster_id=_optional(rest, "cluster_id", str), guarantee=_optional(rest, "guarantee", str),
        run=_optional(rest, "run", str), task_attempt_id=_optional(rest, "task_attempt_id", int),
        stage=_optional(rest, "stage", int), query_id=_optional(rest, "query_id", str),
        batch_id=_optional(rest, "batch_id", int), seq=_optional(rest, "seq", int),
        generated=_optional(rest, "generated", bool) or False,
        trimmed=_optional(rest, "trimmed", bool) or False,
        published=_optional(rest, "published", bool) or False,
        extra={k: v for k, v in rest.items() if k not in known})


def _optional(meta: Mapping[str, object], name: str, kind: type[T]) -> T | None:
    value = meta.get(name)
    if value is None:
        return None
    # bool is an int to Python, never to this record
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise ValueError(f"{name}: {value!r}")
    return value


def _typed(meta: Mapping[str, object], name: str, kind: type[T]) -> T:
    value = _optional(meta, name, kind)
    if value is None:
        raise KeyError(name)
    return value


def _optional_time(meta: Mapping[str, object], name: str) -> float | None:
    value = meta.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name}: {value!r}")
    return float(value)


def _time(meta: Mapping[str, object], name: str) -> float:
    value = _optional_time(meta, name)
    if value is None:
        raise KeyError(name)
    return value
