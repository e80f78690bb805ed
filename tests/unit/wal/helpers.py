"""Helpers shared by the WAL's unit tests."""

import time

import pyarrow as pa

from recoverable_sink.identity import record_digests
from recoverable_sink.wal import close_wals, open_wal


def later() -> float:
    """An hour from now: a clock ahead, which no rule but the sweep of published proof reads."""
    return time.time() + 3600


def batch(values, keys=None):
    arrays, names = [pa.array(values, pa.binary())], ["value"]
    if keys is not None:
        arrays.insert(0, pa.array(keys, pa.binary()))
        names.insert(0, "key")
    return pa.RecordBatch.from_arrays(arrays, names=names)


def append(wal, key, first, b, max_bytes=1 << 20, acks=None):
    return wal.append(key, first, b, record_digests(b, "t", "c"), max_bytes, acks or {})


def reopen(path):
    close_wals()
    return open_wal(path)
