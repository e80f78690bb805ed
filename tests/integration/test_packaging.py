"""Shipping the sink: spark-submit --py-files with no register call (auto-registration through the
pyspark_recoverable_kafka module), the tasks importing the sink from the shipped zip."""

import json
import subprocess
import sys
import zipfile
from pathlib import Path

from testing.kafka_check import read_topic
from testing.kafka_local import REPO

APP = '''
import json, sys
from pyspark.sql import SparkSession
spark = SparkSession.builder.getOrCreate()
spark.sparkContext.setLogLevel("ERROR")

def origin(_):
    import recoverable_sink
    yield recoverable_sink.__file__

files = spark.sparkContext.parallelize([0], 1).mapPartitions(origin).collect()
bootstrap, topic, wal, out = sys.argv[1:5]
# No spark.dataSource.register(...): Spark finds the format through pyspark_recoverable_kafka.DefaultSource.
(spark.range(500).selectExpr("CAST(id AS STRING) AS value").write.format("recoverable_kafka")
    .option("kafka.bootstrap.servers", bootstrap).option("topic", topic).option("wal.path", wal)
    .mode("append").save())
open(out, "w").write(json.dumps({"task_import": files[0]}))
spark.stop()
'''


def build_zip(path: Path) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        for f in sorted((REPO / "recoverable_sink").glob("*.py")):
            z.write(f, f"recoverable_sink/{f.name}")
        z.write(REPO / "pyspark_recoverable_kafka.py", "pyspark_recoverable_kafka.py")
    return path


def test_spark_submit_with_py_files_and_no_register_call(kafka, new_topic, tmp_path):
    topic = new_topic()
    (tmp_path / "app.py").write_text(APP)
    bundle = build_zip(tmp_path / "recoverable_sink.zip")
    submit = Path(sys.executable).parent / "spark-submit"
    out = tmp_path / "out.json"
    run = subprocess.run(
        [str(submit), "--master", "local[2]", "--py-files", str(bundle),
         "--conf", f"spark.pyspark.python={sys.executable}", "--conf", "spark.ui.enabled=false",
         "--conf", f"spark.driver.extraJavaOptions=-Dlog4j2.configurationFile={REPO / 'spark_conf/log4j2.properties'}",
         str(tmp_path / "app.py"), kafka.bootstrap_servers, topic, str(tmp_path / "wal"), str(out)],
        cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert ".zip" in json.loads(out.read_text())["task_import"]
    assert len(read_topic(kafka.bootstrap_servers, topic, 60, expected=500)) == 500
