"""The WAL's LMDB environments: one open per directory and process (at most 16 at a time), each behind a gate
that lets its map grow while no transaction of the process is open; checks of the files and the disk, and
LMDB's errors translated into the sink's (what broke, what to do)."""

from __future__ import annotations

import errno
import os
import resource
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, suppress
from typing import Any, Literal, overload

import lmdb

from recoverable_sink._logging import get_logger
from recoverable_sink.errors import WalCorruptionError, WalError, WalFullError

log = get_logger("wal")

_MAX_MAP_SIZE = 1 << 40  # virtual address space only: LMDB grows the file as data is written
_MIN_MAP_SIZE = 64 << 20
_MAX_ENVS = 16
_RESERVE_BYTES = 4 << 20  # left free for the acknowledgement checkpoints (and compactions) after a refusal


class Gate:
    """This process's transactions on one environment, and the rare change of its map size, which LMDB allows
    only with no transaction open in the process (it remaps in place: another thread's reader would be left
    holding pointers into the old map). Transactions are short and never nested in one thread."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._active = 0
        self._resizing = False

    @contextmanager
    def txn(self) -> Iterator[None]:
        with self._cond:
            while self._resizing:
                self._cond.wait()
            self._active += 1
        try:
            yield
        finally:
            with self._cond:
                self._active -= 1
                self._cond.notify_all()

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._cond:
            while self._resizing:
                self._cond.wait()
            self._resizing = True
            while self._active:
                self._cond.wait()
        try:
            yield
        finally:
            with self._cond:
                self._resizing = False
                self._cond.notify_all()


_envs: dict[str, lmdb.Environment] = {}
_env_files: dict[str, tuple[int, int] | None] = {}  # (device, inode) of each open environment's data.mdb
_gates: dict[str, Gate] = {}
_envs_lock = threading.Lock()


class Transactions:
    """Read and write transactions on one environment through its gate: a full map is grown, a map another
    process grew is adopted, and LMDB's errors come out as :class:`WalError`."""

    def __init__(self, path: str, env: lmdb.Environment, gate: Gate | None = None) -> None:
        self.path = path
        self.env = env
        self._gate = gate if gate is not None else Gate()

    def _write(self, body: Callable[[lmdb.Transaction[bytes]], None]) -> None:
        """Run ``body`` in one write transaction; a full map is grown (up to :func:`map_size`) and the body run
        again from scratch (the aborted transaction left nothing), so bodies must only touch the transaction."""
        while True:
            try:
                with self._gate.txn(), self.env.begin(write=True) as txn:
                    body(txn)
                return
            except lmdb.MapFullError as exc:
                if not self._grow():
                    raise _wal_error(self.path, exc) from None
            except lmdb.MapResizedError:
                self._adopt_size()
            except lmdb.Error as exc:
                raise _wal_error(self.path, exc) from None

    # Typed per mode so that a caller's keys and values are bytes, or memoryviews only where it asked for them.
    @overload
    def _read(self, buffers: Literal[False] = False) -> AbstractContextManager[lmdb.Transaction[bytes]]: ...
    @overload
    def _read(self, buffers: Literal[True]) -> AbstractContextManager[lmdb.Transaction[memoryview]]: ...
    @overload
    def _read(self, buffers: bool) -> AbstractContextManager[lmdb.Transaction[bytes | memoryview]]: ...

    @contextmanager
    def _read(self, buffers: bool = False) -> Iterator[lmdb.Transaction[Any]]:
        """A read transaction; ``buffers``: values as views into the map (valid only inside it), not copies."""
        while True:
            with self._gate.txn():
                txn: lmdb.Transaction[Any] | None
                try:
                    txn = self.env.begin(buffers=True) if buffers else self.env.begin()
                except lmdb.MapResizedError:
                    txn = None
                except lmdb.Error as exc:
                    raise _wal_error(self.path, exc) from None
                if txn is not None:
                    with txn:
                        yield txn
                    return
            self._adopt_size()

    def _grow(self) -> bool:
        """Double this process's map, up to the limit; False when it is at the limit already."""
        with self._gate.exclusive():
            current = self.env.info()["map_size"]
            limit = map_size()
            if current >= limit:
                return False
            new = min(limit, current * 2)
            self.env.set_mapsize(new)
        log.info("WAL %s: memory map grown from %d to %d MiB", self.path, current >> 20, new >> 20)
        return True

    def _adopt_size(self) -> None:
        """Another process grew the map past ours (LMDB's MDB_MAP_RESIZED): take its size (set_mapsize(0))."""
        with self._gate.exclusive():
            self.env.set_mapsize(0)


def _free_bytes(path: str) -> int | None:
    try:
        fs = os.statvfs(path)
    except OSError:
        return None
    return fs.f_bavail * fs.f_frsize


def _disk_nearly_full(path: str) -> bool:
    free = _free_bytes(path)
    return free is not None and free < _RESERVE_BYTES


def check_room(path: str, size: int) -> None:
    """Refuse a segment that would leave less than a reserve free on the disk: once the disk is full LMDB can
    commit nothing, not even the acknowledgements Kafka already gave, and a retry would then re-send those."""
    free = _free_bytes(path)
    if free is not None and free < size + _RESERVE_BYTES:
        raise WalError(f"WAL {path}: the disk is full ({free} bytes free; the next records to log need {size} plus "
                       f"{_RESERVE_BYTES} kept free for acknowledgements); free space under wal.path or point "
                       "wal.path at a larger disk. Records accepted so far stay in the WAL")


def map_size() -> int:
    """The largest LMDB map this process grows to: 1 TiB of address space (it costs nothing until written),
    unless the address space is capped, as ``spark.executor.pyspark.memory`` caps each Python worker's
    (RLIMIT_AS, like YARN's virtual-memory check); then a quarter of the cap, leaving the rest to Python, Arrow
    and librdkafka. The map starts small (:func:`_initial_map_size`) and doubles when full."""
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return _MAX_MAP_SIZE
    page = resource.getpagesize()
    return max(_MIN_MAP_SIZE, min(_MAX_MAP_SIZE, soft // 4 // page * page))


def _initial_map_size(path: str) -> int:
    """Twice what the data file holds now, at least 64 MiB, at most :func:`map_size`: under an address-space
    cap the map reserves little until the WAL needs it."""
    try:
        used = os.path.getsize(os.path.join(path, "data.mdb"))
    except OSError:
        used = 0
    page = resource.getpagesize()
    return min(map_size(), max(_MIN_MAP_SIZE, (2 * used + page - 1) // page * page))


def _wal_error(path: str, exc: BaseException) -> WalError:
    text = str(exc)
    if isinstance(exc, lmdb.MapFullError):
        return WalFullError(
            f"WAL {path}: its memory map is full ({map_size() >> 20} MiB, a quarter of this worker's address-space "
            "limit, spark.executor.pyspark.memory); raise that limit, lower wal.maxBytes or wal.retentionHours. "
            "Nothing was dropped: records accepted so far stay in the WAL")
    if isinstance(exc, MemoryError) or "Cannot allocate memory" in text:
        return WalError(
            f"WAL {path}: the {map_size() >> 20} MiB memory map does not fit this process's address space "
            f"({text}); raise spark.executor.pyspark.memory or move older writes' logs aside (a log larger than "
            "the map cannot be opened under the limit)")
    # A full disk reaches LMDB as ENOSPC or, on some filesystems (tmpfs), as EIO from the commit: ask the
    # filesystem rather than trust the error text.
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC or "No space left" in text or _disk_nearly_full(path):
        return WalError(f"WAL {path}: the disk is full ({text}); free space under wal.path or point wal.path "
                        "at a larger disk. Records accepted so far stay in the WAL")
    if isinstance(exc, lmdb.CorruptedError | lmdb.InvalidError | lmdb.PageNotFoundError | lmdb.BadValsizeError):
        return WalCorruptionError(f"WAL {path}: the LMDB files are damaged ({text}); nothing in them is replayed "
                                  "blindly. Move the directory aside and re-run the write from its source")
    return WalError(f"WAL {path}: {text}")


def _check_not_truncated(path: str, env: lmdb.Environment) -> None:
    """A data file shorter than the pages LMDB's meta page says are in use was truncated (a copy cut short, a
    full disk); reading it through the memory map would kill the process with SIGBUS, so refuse it here."""
    needed = (env.info()["last_pgno"] + 1) * env.stat()["psize"]
    size = os.path.getsize(os.path.join(path, "data.mdb"))
    if size < needed:
        env.close()
        raise WalCorruptionError(
            f"WAL {path}: data.mdb is truncated ({size} bytes, the log needs {needed}); nothing in it is "
            "replayed or skipped blindly. Move the directory aside and re-run the write from its source"
        )


def open_env(path: str) -> tuple[str, lmdb.Environment, Gate]:
    """This process's environment on the directory ``path`` (made absolute, as returned first), opened once and
    kept (at most 16 at a time), and its gate; the directory is created owner-only."""
    path = os.path.abspath(path)
    with _envs_lock:
        env = _envs.get(path)
        if env is not None:
            if _same_file(path, _env_files[path]):
                return path, env, _gates[path]
            # The directory was deleted or replaced (by an operator, a cleanup job) while this process held it
            # open: logging on into the old, unlinked file would lose every record with the process. Start
            # over on what is there now; the old handle is left to the tasks that may still hold it.
            log.warning("WAL %s was removed or replaced while open; opening it anew", path)
            del _envs[path]
        try:
            if not os.path.isdir(path):
                os.makedirs(path, mode=0o700, exist_ok=True)  # only what the sink creates is made owner-only
            shared = os.stat(path).st_mode & 0o002
        except OSError as exc:
            raise WalError(
                f"wal.path={path} cannot be created or used by user {os.getuid()} on {socket.gethostname()}: "
                f"{exc.strerror}; point wal.path at a writable executor-local directory"
            ) from None
        if shared:
            # Never chmod a directory the sink did not create (pointed at /tmp, that would strip its sticky,
            # world-writable mode), and never keep a log where anyone may plant or swap files.
            raise WalError(f"wal.path={path} is writable by every user; point wal.path at a directory of its own, "
                           f"e.g. {os.path.join(path, 'recoverable_kafka_wal')} (the sink creates it owner-only)")
        if not os.access(path, os.W_OK | os.X_OK):
            raise WalError(f"wal.path={path} is not writable by user {os.getuid()} on {socket.gethostname()}; "
                           "point wal.path at a writable executor-local directory")
        try:
            env = lmdb.open(path, map_size=_initial_map_size(path), subdir=True, sync=True, metasync=True, lock=True,
                            mode=0o600, max_readers=512, readahead=False)
        except lmdb.Error as exc:
            raise _wal_error(path, exc) from None
        for name in ("data.mdb", "lock.mdb"):
            file = os.path.join(path, name)
            if os.path.exists(file):
                os.chmod(file, 0o600)
        _check_not_truncated(path, env)
        # A worker SIGKILLed while it read leaves its reader slot behind, and LMDB then keeps every page freed since
        # that snapshot from reuse: the file grows a step with each killed worker (make soak showed the steps).
        # Each process that opens the WAL clears the slots of processes that are gone.
        with suppress(lmdb.Error):
            env.reader_check()
        while len(_envs) >= _MAX_ENVS:  # the oldest opened goes first; a task holds its Wal for its duration
            _envs.pop(next(iter(_envs))).close()
        _envs[path] = env
        _env_files[path] = _file_id(path)
        _gates[path] = Gate()
        return path, env, _gates[path]


def _file_id(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(os.path.join(path, "data.mdb"))
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _same_file(path: str, opened: tuple[int, int] | None) -> bool:
    return opened is not None and _file_id(path) == opened


def close_wal(path: str) -> None:
    """Close this process's handle on the WAL under ``path``, if open (the files stay)."""
    with _envs_lock:
        env = _envs.pop(os.path.abspath(path), None)
    if env is not None:
        env.close()


def close_wals() -> None:
    """Close every WAL this process has open (tests, a worker shutting down)."""
    with _envs_lock:
        envs = list(_envs.values())
        _envs.clear()
    for env in envs:
        env.close()
