"""The ceiling of a produce path of the sink's own, measured (benchmark-only: not shipped, not on a user's path).

``bench/own_produce.c`` encodes Kafka record batches (v2, CRC-32C) straight from a batch's Arrow buffers; this
module sends them as Produce requests (v3, acks=all) over a plain socket to the one local broker, keeping up to five
requests in flight as librdkafka does, and parses every acknowledgement. Against it, librdkafka through the sink's
own native produce loop (``producer/native.py``) on the same Arrow batch, idempotent (as the sink runs it) and not.
CPU per record is the process's (every thread: librdkafka's too), from sending the first record to the last
acknowledgement; the broker is another process and not counted.

    .venv/bin/python -m bench.own_produce      # OWN_PRODUCE_ROWS=1000000 OWN_PRODUCE_REPS=3

What it leaves out, and a real client would need, is in docs/performance.md ("A produce path of our own").
"""

from __future__ import annotations

import ctypes
import json
import os
import socket
import statistics
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow as pa

from bench.harness import OUT

ROWS = int(os.environ.get("OWN_PRODUCE_ROWS", "1000000"))
REPS = int(os.environ.get("OWN_PRODUCE_REPS", "3"))
BATCH_BYTES = 384 * 1024  # the sink's batch.size
IN_FLIGHT = 5
SOURCE = Path(__file__).with_name("own_produce.c")
HEADERS = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))


def _library() -> Any:
    """own_produce.c, compiled once into build/bench."""
    lib = OUT / "own_produce.so"
    if not lib.exists() or lib.stat().st_mtime < SOURCE.stat().st_mtime:
        OUT.mkdir(parents=True, exist_ok=True)
        subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", str(lib), str(SOURCE)], check=True, timeout=120)
    c = ctypes.CDLL(str(lib))
    c.own_encode_batch.restype = ctypes.c_size_t
    c.own_encode_batch.argtypes = [ctypes.c_void_p] * 9 + [ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                                                           ctypes.c_void_p, ctypes.c_size_t]
    return c


def records(rows: int, value_bytes: int, headers: bool) -> pa.RecordBatch:
    """Keyed records as the benchmark writes them (bench.raw_client's shape): key k<id>, value <id> padded."""
    keys = pa.array([b"k%07d" % i for i in range(rows)], pa.binary())
    pad = b"x" * max(0, value_bytes - 8)
    values = pa.array([b"%08d" % i + pad for i in range(rows)], pa.binary())
    columns = {"key": keys, "value": values}
    if headers:
        columns["headers"] = pa.array([[("source", b"bench"), ("seq", b"%d" % i)] for i in range(rows)], HEADERS)
    return pa.RecordBatch.from_pydict(columns)


def _buffers(array: pa.Array) -> tuple[int, int]:
    """(offsets address, data address) of an unsliced binary or string array."""
    bufs = array.buffers()
    return bufs[1].address, bufs[2].address


class _Connection:
    """One broker connection speaking just enough of the protocol: Metadata is not asked (one broker, whose
    address is the leader of every partition here), Produce v3 requests and their responses."""

    def __init__(self, bootstrap: str) -> None:
        host, port = bootstrap.split(",")[0].rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=60)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.correlation = 0
        self.pending = 0

    def produce(self, topic: str, partition: int, batch: memoryview) -> None:
        self.correlation += 1
        name = topic.encode()
        body = struct.pack(">hhih", 0, 3, self.correlation, 3) + b"own" + struct.pack(">hhi", -1, -1, 30_000)
        body += struct.pack(">ih", 1, len(name)) + name + struct.pack(">iii", 1, partition, len(batch))
        self.sock.sendall(struct.pack(">i", len(body) + len(batch)) + body)
        self.sock.sendall(batch)
        self.pending += 1

    def acknowledged(self) -> None:
        """Read one Produce response; raise on a partition error."""
        size = struct.unpack(">i", self._read(4))[0]
        data = self._read(size)
        # correlation id, one topic (name), one partition: partition, error code, base offset, log append time.
        name_len = struct.unpack_from(">h", data, 8)[0]
        _, error, _, _ = struct.unpack_from(">ihqq", data, 10 + name_len + 4)
        if error:
            raise RuntimeError(f"Produce answered error code {error}")
        self.pending -= 1

    def _read(self, n: int) -> bytes:
        out = bytearray()
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            if not chunk:
                raise ConnectionError("the broker closed the connection")
            out += chunk
        return bytes(out)

    def close(self) -> None:
        self.sock.close()


def send_own(c: Any, bootstrap: str, topic: str, batch: pa.RecordBatch) -> Any:
    """Connected (not timed); the returned call sends every record of ``batch`` to partition 0 in record batches of
    up to BATCH_BYTES, IN_FLIGHT requests at once, and reads every acknowledgement."""
    keys, values = batch.column("key"), batch.column("value")
    key_off, key_data = _buffers(keys)
    val_off, val_data = _buffers(values)
    h: list[Any] = [None] * 5
    if "headers" in batch.schema.names:
        lists = batch.column("headers")
        items = lists.values
        h = [lists.buffers()[1].address, *_buffers(items.field("key")), *_buffers(items.field("value"))]
    out = (ctypes.c_uint8 * (BATCH_BYTES + 65536))()
    conn = _Connection(bootstrap)

    def send() -> None:
        try:
            first, n, now = 0, batch.num_rows, int(time.time() * 1000)
            per_batch = max(1, BATCH_BYTES // max(1, (keys.nbytes + values.nbytes) // max(1, n) + 16))
            while first < n:
                count = min(per_batch, n - first)
                size = c.own_encode_batch(key_off, key_data, val_off, val_data, *h, first, count, now, out, len(out))
                while size == 0:  # larger records than estimated: fewer of them
                    count = max(1, count // 2)
                    size = c.own_encode_batch(key_off, key_data, val_off, val_data, *h, first, count, now, out,
                                              len(out))
                if conn.pending >= IN_FLIGHT:
                    conn.acknowledged()
                conn.produce(topic, 0, memoryview(out)[:size])
                first += count
            while conn.pending:
                conn.acknowledged()
        finally:
            conn.close()

    return send


def send_librdkafka(bootstrap: str, topic: str, batch: pa.RecordBatch, idempotent: bool) -> Any:
    """A producer of the sink's native produce loop (librdkafka), connected (not timed); the returned call sends
    the same records to partition 0 and returns once every one is acknowledged."""
    from recoverable_sink.options import parse_options
    from recoverable_sink.producer.ledger import Ledger
    from recoverable_sink.producer.native import NativeProducer

    conf = dict(parse_options({"kafka.bootstrap.servers": bootstrap}).producer_config())
    if not idempotent:
        conf["enable.idempotence"] = "false"
    producer = NativeProducer(conf)
    producer.connect(30, topic)
    with_partition = batch.append_column("partition", pa.array([0] * batch.num_rows, pa.int32()))

    def send() -> None:
        ledger = Ledger(producer)
        ledger.send(with_partition, topic, 0)
        ledger.wait_for_acks(300)
        if ledger.acked != batch.num_rows:
            raise RuntimeError(f"librdkafka: {ledger.acked} of {batch.num_rows} acknowledged: "
                               f"{ledger.first_error()}")

    return send


def _timed(send: Any) -> tuple[float, float]:
    cpu, wall = time.process_time(), time.perf_counter()
    send()
    return time.process_time() - cpu, time.perf_counter() - wall


def measure(bootstrap: str, fresh_topic: Any, count: Any) -> dict[str, Any]:
    """CPU per record of each path and shape, medians of REPS, each write to a fresh 1-partition topic whose record
    count is checked. ``fresh_topic()`` makes a topic, ``count(topic)`` counts its records."""
    c = _library()
    out: dict[str, Any] = {"rows": ROWS, "reps": REPS, "shapes": []}
    for value_bytes, headers in ((100, False), (1024, False), (100, True)):
        rows = ROWS if value_bytes <= 100 else ROWS // 2
        batch = records(rows, value_bytes, headers)
        paths = {
            "own_path": lambda t, b=batch: send_own(c, bootstrap, t, b),
            "librdkafka_idempotent": lambda t, b=batch: send_librdkafka(bootstrap, t, b, True),
            "librdkafka": lambda t, b=batch: send_librdkafka(bootstrap, t, b, False),
        }
        cpu: dict[str, list[float]] = {p: [] for p in paths}
        wall: dict[str, list[float]] = {p: [] for p in paths}
        for rep in range(REPS + 1):  # the first round warms up the broker's log and the page cache
            for name, write in paths.items():
                topic = fresh_topic()
                spent, took = _timed(write(topic))
                landed = count(topic)
                if landed != rows:
                    raise RuntimeError(f"{name}: {landed} of {rows} records in {topic}")
                if rep:
                    cpu[name].append(spent)
                    wall[name].append(took)
        shape = {"shape": f"{value_bytes}B" + ("+headers" if headers else ""), "rows": rows}
        for name in paths:
            shape[name] = {"cpu_us_per_record": round(statistics.median(cpu[name]) * 1e6 / rows, 3),
                           "seconds": round(statistics.median(wall[name]), 3)}
        shape["own_vs_librdkafka_idempotent"] = round(
            shape["own_path"]["cpu_us_per_record"] / shape["librdkafka_idempotent"]["cpu_us_per_record"], 3)
        out["shapes"].append(shape)
    return out


def main() -> int:
    from testing.kafka_check import count_records
    from testing.kafka_local import ensure_local, local_cluster

    ensure_local()
    cluster = local_cluster()
    result = measure(cluster.bootstrap_servers,
                     lambda: cluster.create_topic(f"own-produce-{os.urandom(4).hex()}", 1, 1),
                     lambda topic: count_records(cluster.bootstrap_servers, topic))
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "own_produce.json").write_text(json.dumps(result, indent=2) + "\n")
    sys.stdout.write(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
