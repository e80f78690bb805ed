"""Shipping the sink as ``make dist`` builds it: spark-submit with no register call (auto-registration
through the pyspark_recoverable_kafka module), from the --py-files zip (pure Python: record digests by hashlib,
confluent-kafka's produce()) and from the wheel installed in a fresh virtualenv outside the repository (with the C
digest and produce extensions)."""

import json
import os
import subprocess
import sys
from pathlib import Path

from testing.kafka_check import read_topic
from testing.kafka_local import REPO
from tools.dist import build_pyfiles_zip, build_wheel

APP = '''
import json, sys
from pyspark.sql import SparkSession
spark = SparkSession.builder.getOrCreate()
spark.sparkContext.setLogLevel("ERROR")

def origin(_):
    import recoverable_sink
    from recoverable_sink import delivery, identity
    yield recoverable_sink.__file__, identity._native is not None, delivery.native_module() is not None

(file, native, producer), = spark.sparkContext.parallelize([0], 1).mapPartitions(origin).collect()
bootstrap, topic, wal, out = sys.argv[1:5]
# No spark.dataSource.register(...): Spark finds the format through pyspark_recoverable_kafka.DefaultSource.
(spark.range(500).selectExpr("CAST(id AS STRING) AS value").write.format("recoverable_kafka")
    .option("kafka.bootstrap.servers", bootstrap).option("topic", topic).option("wal.path", wal)
    .mode("append").save())
open(out, "w").write(json.dumps({"task_import": file, "native_digests": native, "native_producer": producer}))
spark.stop()
'''


def submit(spark_submit: Path, python: Path, tmp_path: Path, kafka, topic: str, *extra: str,
           env: dict[str, str] | None = None) -> dict[str, str]:
    (tmp_path / "app.py").write_text(APP)
    out = tmp_path / "out.json"
    run = subprocess.run(
        [str(spark_submit), "--master", "local[2]", *extra,
         "--conf", f"spark.pyspark.python={python}", "--conf", "spark.ui.enabled=false",
         "--conf", f"spark.driver.extraJavaOptions=-Dlog4j2.configurationFile={REPO / 'spark_conf/log4j2.properties'}",
         str(tmp_path / "app.py"), kafka.bootstrap_servers, topic, str(tmp_path / "wal"), str(out)],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    assert len(read_topic(kafka.bootstrap_servers, topic, 60, expected=500)) == 500
    return json.loads(out.read_text())


def test_spark_submit_with_py_files_and_no_register_call(kafka, new_topic, tmp_path):
    bundle = build_pyfiles_zip(tmp_path / "dist")
    out = submit(Path(sys.executable).parent / "spark-submit", Path(sys.executable), tmp_path, kafka, new_topic(),
                 "--py-files", str(bundle))
    assert ".zip" in out["task_import"]
    assert out["native_digests"] is False  # the zip holds no C extension: hashlib's digests delivered every record
    assert out["native_producer"] is False  # and confluent-kafka's produce() sent every record


def test_the_wheel_in_a_fresh_virtualenv_outside_the_repo_registers_the_format(kafka, new_topic, tmp_path):
    """pip install of the wheel alone (its dependencies resolved by pip, from its cache when warm) is enough:
    spark-submit finds format("recoverable_kafka"), and the tasks import the sink from that virtualenv."""
    wheel = build_wheel(tmp_path / "dist")
    venv = tmp_path / "venv"
    # Nothing of the repository's: no PYTHONPATH (pip would take a path entry holding the sources for an
    # installed copy and skip the wheel), and the PYSPARK_* variables point at the new virtualenv.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PYSPARK_", "VIRTUAL_ENV"))}
    env |= {"PYSPARK_PYTHON": str(venv / "bin/python"), "PYSPARK_DRIVER_PYTHON": str(venv / "bin/python")}
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120, env=env)
    install = subprocess.run([str(venv / "bin/pip"), "install", "-q", str(wheel)], timeout=900, env=env,
                             capture_output=True, text=True)
    assert install.returncode == 0, install.stderr[-3000:]
    out = submit(venv / "bin/spark-submit", venv / "bin/python", tmp_path, kafka, new_topic(), env=env)
    assert out["task_import"].startswith(str(venv / "lib")), out
    assert out["native_digests"] is True  # the wheel carries the digest extension
    assert out["native_producer"] is True  # and the produce loop, on confluent-kafka's own librdkafka
    cli = subprocess.run([str(venv / "bin/recoverable-kafka-wal"), "list", "--path", str(tmp_path / "wal"), "--json"],
                         capture_output=True, text=True, timeout=60, env=env)
    assert cli.returncode == 0, cli.stderr
