"""The worker-Python check register() runs on a local master, and the sink's errors said as their sentence alone in
Spark's workers (no JVM: a stand-in session and stand-in Pythons)."""

import os
import sys
import types

import pytest

from recoverable_sink.driver.deployment import check_worker_python, missing_here
from recoverable_sink.errors import OptionError, sentence_first


def _session(python: str, master: str = "local[2]") -> types.SimpleNamespace:
    return types.SimpleNamespace(sparkContext=types.SimpleNamespace(pythonExec=python, master=master,
                                                                    _python_includes=[]))


def _python(tmp_path, name: str, *flags: str) -> str:
    """A stand-in for another interpreter: this one, started with ``flags``."""
    path = tmp_path / name
    path.write_text(f'#!/bin/sh\nexec {sys.executable} {" ".join(flags)} "$@"\n')
    path.chmod(0o755)
    return str(path)


def test_this_python_has_every_dependency():
    assert missing_here() == []


def test_a_worker_python_without_the_dependencies_is_named_with_the_settings(tmp_path):
    python = _python(tmp_path, "python-without-site", "-S")  # no site-packages: no pyarrow, lmdb, ...
    with pytest.raises(Exception, match="cannot run in Spark's Python workers") as failure:
        check_worker_python(_session(python))
    message = str(failure.value)
    assert python in message and "PYSPARK_PYTHON" in message and "spark.pyspark.python" in message
    assert "confluent_kafka, lmdb, pyarrow, numpy" in message
    assert f"PYSPARK_PYTHON={sys.executable}" in message


def test_a_worker_python_that_cannot_start_is_named(tmp_path):
    with pytest.raises(Exception, match="cannot be started"):
        check_worker_python(_session(str(tmp_path / "no-such-python")))


def test_a_worker_python_with_everything_passes(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.getcwd())  # where the sink's sources are, as the suite runs them
    check_worker_python(_session(_python(tmp_path, "same-python")))


def test_workers_on_other_hosts_are_not_asked(tmp_path):
    check_worker_python(_session(str(tmp_path / "no-such-python"), master="spark://elsewhere:7077"))


def test_a_sink_error_hides_the_traceback_only_in_a_spark_worker(monkeypatch):
    monkeypatch.delenv("SPARK_HIDE_TRACEBACK", raising=False)
    with pytest.raises(OptionError), sentence_first():
        raise OptionError("not in a worker")
    assert "SPARK_HIDE_TRACEBACK" not in os.environ
    monkeypatch.setitem(sys.modules, "pyspark.worker", types.ModuleType("pyspark.worker"))
    with pytest.raises(ValueError), sentence_first():
        raise ValueError("a bug keeps its traceback")
    assert "SPARK_HIDE_TRACEBACK" not in os.environ
    with pytest.raises(OptionError), sentence_first():
        raise OptionError("said alone")
    assert os.environ["SPARK_HIDE_TRACEBACK"] == "1"
