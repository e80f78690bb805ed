"""LMDB environments: the directory's permissions, the memory map's size and growth, a directory deleted while open."""


import logging
import os
import shutil
import stat
import subprocess
import sys

import pytest

from recoverable_sink.errors import WalError, WalFullError
from recoverable_sink.wal import env as wal_env
from recoverable_sink.wal import open_wal
from tests.unit.wal.helpers import append, batch


def test_directory_is_owner_only_and_files_are_0600(wal_dir):
    wal = open_wal(wal_dir)
    append(wal, wal.begin_attempt("w", 0, 0, {}), 0, batch([b"v"]))
    assert stat.S_IMODE(os.stat(wal_dir).st_mode) == 0o700
    for name in ("data.mdb", "lock.mdb"):
        assert stat.S_IMODE(os.stat(os.path.join(wal_dir, name)).st_mode) == 0o600


def test_an_existing_directory_keeps_its_mode_and_a_world_writable_one_is_refused(tmp_path):
    own = tmp_path / "own"
    own.mkdir(mode=0o750)
    os.chmod(own, 0o750)
    open_wal(str(own))
    assert stat.S_IMODE(os.stat(own).st_mode) == 0o750
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    with pytest.raises(WalError, match=r"writable by every user; point wal.path at a directory of its own"):
        open_wal(str(shared))
    assert stat.S_IMODE(os.stat(shared).st_mode) == 0o1777


def test_unusable_wal_path_is_a_clear_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(WalError, match=r"wal\.path=.*cannot be created"):
        open_wal(str(blocker / "wal"))


def test_the_map_fits_a_capped_address_space_and_is_large_otherwise(tmp_path):
    # A child process, so the cap (what spark.executor.pyspark.memory sets) does not bind the test runner.
    code = (
        "import resource, sys\n"
        "from recoverable_sink.wal import map_size\n"
        "print(map_size())\n"
        "resource.setrlimit(resource.RLIMIT_AS, (2 << 30, resource.RLIM_INFINITY))\n"
        "print(map_size())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    unlimited, capped = (int(line) for line in out.stdout.split())
    assert unlimited == 1 << 40
    assert capped == 512 << 20


def test_a_wal_directory_deleted_while_open_is_opened_anew_not_written_through_the_old_handle(wal_dir, caplog):
    wal = open_wal(wal_dir)
    key = wal.begin_attempt("w", 0, 0, {})
    append(wal, key, 0, batch([b"v"]))
    shutil.rmtree(wal_dir)
    with caplog.at_level(logging.WARNING, logger="recoverable_sink.wal"):
        fresh = open_wal(wal_dir)
    assert "was removed or replaced while open" in caplog.text
    assert fresh.attempts() == []
    assert os.path.exists(os.path.join(wal_dir, "data.mdb"))


def test_the_map_starts_small_and_doubles_when_full_up_to_its_limit(wal_dir, monkeypatch):
    """Under an address-space cap the map reserves little until the WAL needs it; past the limit a write fails
    with WalFullError and the WAL keeps what it had."""
    monkeypatch.setattr(wal_env, "_MIN_MAP_SIZE", 1 << 20)
    monkeypatch.setattr(wal_env, "map_size", lambda: 8 << 20)
    wal = open_wal(wal_dir)
    assert wal.env.info()["map_size"] == 1 << 20
    key = wal.begin_attempt("w", 0, 0, {})
    big = batch([os.urandom(1 << 20)])
    for i in range(4):
        append(wal, key, i, big, max_bytes=1 << 30)
    assert wal.env.info()["map_size"] == 8 << 20
    with pytest.raises(WalFullError, match="memory map is full"):
        for i in range(4, 16):
            append(wal, key, i, big, max_bytes=1 << 30)
    assert [s.count for s in wal.segments(key)] == [1] * (wal.record_count(key))
    assert wal.record_count(key) >= 4


def test_a_map_grown_by_another_process_is_adopted(wal_dir, monkeypatch):
    """Python workers share one WAL: when another one grows the map past this process's, LMDB says so
    (MDB_MAP_RESIZED) and this process takes the new size instead of failing."""
    monkeypatch.setattr(wal_env, "_MIN_MAP_SIZE", 1 << 20)
    wal = open_wal(wal_dir)
    key = wal.begin_attempt("w", 0, 0, {})
    append(wal, key, 0, batch([b"small"]))
    assert wal.env.info()["map_size"] == 1 << 20
    code = (
        "import os, sys\n"
        "import pyarrow as pa\n"
        "from recoverable_sink import wal as w\n"
        "from recoverable_sink.wal import env\n"
        "from recoverable_sink.identity import record_digests\n"
        "env._MIN_MAP_SIZE = 1 << 20\n"
        "wal = w.open_wal(sys.argv[1])\n"
        "key = wal.begin_attempt('other', 0, 0, {})\n"
        "for i in range(6):\n"
        "    b = pa.RecordBatch.from_arrays([pa.array([os.urandom(1 << 20)], pa.binary())], names=['value'])\n"
        "    wal.append(key, i, b, record_digests(b, 't', 'c'), 1 << 30, {})\n"
        "print(wal.env.info()['map_size'])\n"
    )
    out = subprocess.run([sys.executable, "-c", code, wal_dir], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) > 1 << 20
    assert wal.record_count(wal.attempts("other/")[0].key) == 6  # reading past our old map adopts the new size
    assert wal.env.info()["map_size"] == int(out.stdout)
    append(wal, key, 1, batch([b"after"]), max_bytes=1 << 30)
    assert [s.count for s in wal.segments(key)] == [1, 1]
