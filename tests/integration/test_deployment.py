"""The sink as users deploy it, outside the repository's virtualenv: spark-submit with the --py-files zip alone
(into a fresh virtualenv holding pyspark and the sink's dependencies, not the sink), a write from a Python thread,
a wrong worker Python (named, with the setting to change), and the sink's own sentence first in a failed write."""

import json
import os
import subprocess
import sys
import zipfile
from importlib.metadata import requires, version
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from testing.kafka_check import read_topic
from testing.kafka_local import REPO
from testing.spark import sink_writer
from tools.dist import build_pyfiles_zip

ROWS = 300
LOG4J = f"-Dlog4j2.configurationFile={REPO / 'spark_conf/log4j2.properties'}"

# argv: bootstrap topic wal out rows. A write with no register call (recorded, not raised), then one after
# recoverable_sink.register(spark), then one from a Python thread (after its own register call).
APP = '''
import json, sys, threading
from pyspark.sql import SparkSession
spark = SparkSession.builder.getOrCreate()
spark.sparkContext.setLogLevel("ERROR")
bootstrap, topic, wal, out, rows = sys.argv[1:6]
df = spark.range(int(rows)).selectExpr("CAST(id AS STRING) AS value")

def write(target):
    (df.write.format("recoverable_kafka").option("kafka.bootstrap.servers", bootstrap).option("topic", target)
       .option("wal.path", wal).mode("append").save())

report = {}
try:
    write(topic + "-plain")
    report["plain"] = "ok"
except Exception as exc:
    report["plain"] = str(exc)[:500]
import recoverable_sink
recoverable_sink.register(spark)
write(topic)
report["sink"] = recoverable_sink.__file__

def in_thread():
    try:
        recoverable_sink.register(spark)
        write(topic + "-thread")
        report["thread"] = "ok"
    except Exception as exc:
        report["thread"] = str(exc)[:500]

thread = threading.Thread(target=in_thread)
thread.start()
thread.join()
open(out, "w").write(json.dumps(report))
spark.stop()
'''


def _dependencies() -> list[str]:
    """The sink's install requirements (pyproject's), pyspark pinned to this suite's version."""
    deps = [Requirement(r) for r in requires("recoverable-sink") or []]
    return [f"pyspark=={version('pyspark')}" if d.name == "pyspark" else str(d) for d in deps if d.marker is None]


def _user_env(venv: Path | None = None) -> dict[str, str]:
    """The environment of a user's shell: nothing of the repository's (no PYTHONPATH, no PYSPARK_*); with
    ``venv``, that virtualenv activated (its bin/ first on the PATH)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PYSPARK_", "VIRTUAL_ENV", "SPARK_"))}
    if venv is not None:
        env |= {"PATH": f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", "VIRTUAL_ENV": str(venv)}
    return env


@pytest.fixture(scope="module")
def user_venv(tmp_path_factory):
    """A fresh virtualenv outside the repository with pyspark and the sink's dependencies, not the sink."""
    venv = tmp_path_factory.mktemp("user") / "venv"
    env = _user_env()
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120, env=env)
    install = subprocess.run([str(venv / "bin/pip"), "install", "-q", *_dependencies()], timeout=900, env=env,
                             capture_output=True, text=True)
    assert install.returncode == 0, install.stderr[-3000:]
    return venv


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory):
    """A Python with nothing installed: what a worker started with the wrong interpreter has."""
    venv = tmp_path_factory.mktemp("bare") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120,
                   env=_user_env())
    return venv / "bin/python"


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    return build_pyfiles_zip(tmp_path_factory.mktemp("dist"))


def _run(cmd: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    (cwd / "app.py").write_text(APP)
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def _spark_submit(venv: Path, tmp_path: Path, kafka, topic: str, *conf: str) -> subprocess.CompletedProcess:
    return _run([str(venv / "bin/spark-submit"), "--master", "local[2]", "--conf", "spark.ui.enabled=false",
                 "--conf", f"spark.driver.extraJavaOptions={LOG4J}", *conf, str(tmp_path / "app.py"),
                 kafka.bootstrap_servers, topic, str(tmp_path / "wal"), str(tmp_path / "out.json"), str(ROWS)],
                tmp_path, _user_env(venv))


def test_py_files_alone_with_one_register_call_writes_from_the_main_thread_and_a_python_thread(
        user_venv, bundle, kafka, new_topic, tmp_path):
    """spark-submit --py-files with the zip, in a virtualenv without the sink: Spark's own search does not look
    inside the zip (DATA_SOURCE_NOT_FOUND, as the README says), and recoverable_sink.register(spark) is enough."""
    topic = new_topic(2)
    kafka.create_topic(topic + "-thread", 2, 1)
    run = _spark_submit(user_venv, tmp_path, kafka, topic, "--py-files", str(bundle))
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads((tmp_path / "out.json").read_text())
    assert "DATA_SOURCE_NOT_FOUND" in report["plain"], report
    assert ".zip" in report["sink"], report  # the driver imported the sink from the shipped zip
    assert report["thread"] == "ok", report
    assert len(read_topic(kafka.bootstrap_servers, topic, 60, expected=ROWS)) == ROWS
    assert len(read_topic(kafka.bootstrap_servers, topic + "-thread", 60, expected=ROWS)) == ROWS


def test_a_wrong_worker_python_is_named_with_the_setting_that_picks_it(
        user_venv, bare_python, bundle, kafka, new_topic, tmp_path):
    """The driver runs the virtualenv's Python but spark.pyspark.python names one without the sink's dependencies:
    register() says so, with that Python and the settings, before any task fails."""
    run = _spark_submit(user_venv, tmp_path, kafka, new_topic(), "--py-files", str(bundle),
                        "--conf", f"spark.pyspark.driver.python={user_venv / 'bin/python'}",
                        "--conf", f"spark.pyspark.python={bare_python}")
    assert run.returncode != 0
    error = next(line for line in run.stdout.splitlines() + run.stderr.splitlines()
                 if line.startswith("recoverable_sink.errors.RecoverableSinkError"))
    assert "recoverable_kafka cannot run in Spark's Python workers" in error
    assert str(bare_python) in error and "spark.pyspark.python" in error and "PYSPARK_PYTHON" in error
    assert "cannot import confluent_kafka, lmdb, pyarrow, numpy" in error
    assert f"PYSPARK_PYTHON={user_venv / 'bin/python'}" in error


def test_a_script_run_from_a_virtualenv_that_is_not_activated(user_venv, bare_python, bundle, kafka, new_topic,
                                                               tmp_path):
    """venv/bin/python app.py with the sink installed in that virtualenv but not activated: Spark starts python3
    from the PATH (here one without the sink or its dependencies), and register() names it and PYSPARK_PYTHON."""
    site = tmp_path / "site"
    with zipfile.ZipFile(bundle) as z:  # the sink in the virtualenv, outside the repository, as an install would be
        z.extractall(site)
    (next(user_venv.glob("lib/python3.*/site-packages")) / "recoverable-sink-test.pth").write_text(f"{site}\n")
    try:
        path = tmp_path / "path"
        path.mkdir()
        (path / "python3").write_text(f'#!/bin/sh\nexec {bare_python} "$@"\n')
        (path / "python3").chmod(0o755)
        env = _user_env() | {"PATH": f"{path}{os.pathsep}{os.environ['PATH']}"}
        run = _run([str(user_venv / "bin/python"), "app.py", kafka.bootstrap_servers, new_topic(),
                    str(tmp_path / "wal"), str(tmp_path / "out.json"), str(ROWS)], tmp_path, env)
    finally:
        next(user_venv.glob("lib/python3.*/site-packages/recoverable-sink-test.pth")).unlink()
    assert run.returncode != 0
    error = next(line for line in run.stderr.splitlines() if line.startswith("recoverable_sink.errors."))
    assert "they start python3 (" in error and "PYSPARK_PYTHON" in error and "spark.pyspark.python" in error
    assert "cannot import recoverable_sink, confluent_kafka" in error
    assert f"PYSPARK_PYTHON={user_venv / 'bin/python'}" in error


@pytest.mark.parametrize(("frame", "options", "sentence"), [
    ("'v' AS value", {"delivery.guarantee": "bogus"},
     "recoverable_sink.errors.OptionError: option delivery.guarantee='bogus' must be"),
    ("id AS value", {}, "recoverable_sink.errors.SchemaError: column value has type bigint"),
])
def test_the_sinks_sentence_comes_right_after_sparks_prefix(spark, kafka, new_topic, tmp_path, frame, options,
                                                             sentence):
    df = spark.range(5).selectExpr("CAST(id AS STRING) AS key", frame)
    with pytest.raises(Exception) as failure:
        sink_writer(df, kafka.bootstrap_servers, new_topic(), tmp_path / "wal", **options).save()
    message = str(failure.value)
    assert message.startswith(f"[PYTHON_DATA_SOURCE_ERROR] Failed to initialize Python data source writer: {sentence}")
    assert "Traceback" not in message
