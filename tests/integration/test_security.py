"""Secrets given as kafka.* options stay out of what Spark and the sink show: the SQL plan of the Spark UI
(read through its REST API), the driver's and tasks' logs, the summary file and the error of a failed write."""

import json
import subprocess
import sys

from testing.kafka_local import REPO
from testing.spark import python_env

SECRET = "s3cr3t-Value-7f1d"

APP = '''
import json, sys, urllib.request
from testing.spark import local_spark, sink_writer
bootstrap, topic, wal, summary, secret, out = sys.argv[1:7]
spark = local_spark("secrets", "local[2]", **{"spark.ui.enabled": "true", "spark.ui.port": "0"})
df = spark.range(100).selectExpr("CAST(id AS STRING) AS value")
options = {"summary.path": summary, "kafka.sasl.password": secret, "kafka.sasl.username": "u-" + secret}
sink_writer(df, bootstrap, topic, wal, **options).save()
try:
    sink_writer(df, bootstrap, "no-such-topic-" + topic, wal, **options).save()
    error = ""
except Exception as exc:
    error = str(exc)
sc = spark.sparkContext
plans = urllib.request.urlopen(
    f"{sc.uiWebUrl}/api/v1/applications/{sc.applicationId}/sql?details=true&planDescription=true").read().decode()
json.dump({"plans": plans, "error": error}, open(out, "w"))
spark.stop()
'''


def test_secrets_stay_out_of_the_ui_plan_logs_summary_and_errors(kafka, new_topic, tmp_path):
    topic = new_topic()
    (tmp_path / "app.py").write_text(APP)
    out, summary = tmp_path / "out.json", tmp_path / "summary.jsonl"
    run = subprocess.run([sys.executable, str(tmp_path / "app.py"), kafka.bootstrap_servers, topic,
                          str(tmp_path / "wal"), str(summary), SECRET, str(out)],
                         cwd=REPO, env={**python_env(), "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    shown = json.loads(out.read_text())
    assert "AppendData" in shown["plans"] and "does not exist" in shown["error"]  # both were really read
    assert summary.read_text().count("\n") >= 1
    for name, text in {"the UI's SQL plans": shown["plans"], "the error": shown["error"],
                       "the summary file": summary.read_text(), "the logs": run.stdout + run.stderr}.items():
        assert SECRET not in text, f"the secret appears in {name}"
