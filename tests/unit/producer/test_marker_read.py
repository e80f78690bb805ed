"""The commit-marker read survives a coordinator that moved. librdkafka's own in-process mock cluster answers
OffsetFetch with NOT_COORDINATOR / COORDINATOR_NOT_AVAILABLE: read through an AdminClient, that answer killed the
process (SIGSEGV in librdkafka's main thread); the sink's read must retry it and return. A subprocess each, so a
crash fails the test instead of the test run."""

import subprocess
import sys

import pytest

_SCRIPT = r"""
import ctypes, pathlib, sys
import confluent_kafka
from recoverable_sink.options import parse_options
from recoverable_sink.producer.transactions import group_offsets

libdir = pathlib.Path(confluent_kafka.__file__).resolve().parent.parent / "confluent_kafka.libs"
lib = ctypes.CDLL(str(sorted(libdir.glob("librdkafka*.so*"))[0]))  # the instance confluent-kafka loaded
lib.rd_kafka_conf_new.restype = ctypes.c_void_p
lib.rd_kafka_conf_set.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t]
lib.rd_kafka_new.restype = ctypes.c_void_p
lib.rd_kafka_new.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
lib.rd_kafka_handle_mock_cluster.restype = ctypes.c_void_p
lib.rd_kafka_handle_mock_cluster.argtypes = [ctypes.c_void_p]
lib.rd_kafka_mock_cluster_bootstraps.restype = ctypes.c_char_p
lib.rd_kafka_mock_cluster_bootstraps.argtypes = [ctypes.c_void_p]
err = ctypes.create_string_buffer(512)
conf = lib.rd_kafka_conf_new()
lib.rd_kafka_conf_set(conf, b"test.mock.num.brokers", b"3", err, 512)
rk = lib.rd_kafka_new(0, conf, err, 512)
cluster = lib.rd_kafka_handle_mock_cluster(rk)
bootstraps = lib.rd_kafka_mock_cluster_bootstraps(cluster).decode()
code, times = int(sys.argv[1]), int(sys.argv[2])
lib.rd_kafka_mock_push_request_errors(ctypes.c_void_p(cluster), ctypes.c_int16(9),  # OffsetFetch
                                      ctypes.c_size_t(times), *[ctypes.c_int(code)] * times)
options = parse_options({"kafka.bootstrap.servers": bootstraps})
print("offsets", group_offsets(options, "recoverable-kafka-preflight", ["t"], 20))
"""


@pytest.mark.parametrize(("code", "name"), [(16, "NOT_COORDINATOR"), (15, "COORDINATOR_NOT_AVAILABLE"),
                                            (14, "COORDINATOR_LOAD_IN_PROGRESS")])
def test_a_marker_read_retries_a_coordinator_that_moved_and_returns(code, name):
    run = subprocess.run([sys.executable, "-c", _SCRIPT, str(code), "2"], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, f"{name}: exit {run.returncode}\n{run.stdout}\n{run.stderr[-2000:]}"
    assert "offsets []" in run.stdout, run.stdout
