"""One way to start a SparkSession for the tests, the demo, the chaos campaign and the benchmark: the
virtualenv's Python for the workers, Spark's Kafka connector on the classpath, no UI, quiet logs."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from devtools.kafka_local import REPO

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

SPARK_JARS = REPO / "build" / "spark-jars"
LOG4J = REPO / "spark_conf" / "log4j2.properties"


def connector_jars() -> str:
    """Spark's own Kafka connector (spark-sql-kafka-0-10 at the pyspark version) and its dependencies."""
    return ",".join(str(p) for p in sorted(SPARK_JARS.glob("*.jar")))


def local_spark(app: str, master: str = "local[2,4]", **conf: str) -> SparkSession:
    """A SparkSession on ``master`` (``local[N,F]`` retries failed tasks F-1 times); ``conf`` adds settings,
    e.g. ``**{"spark.driver.memory": "4g"}``."""
    # The Python workers must run this interpreter (the virtualenv's), or they will not find pyarrow and lmdb.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    builder = (SparkSession.builder.master(master).appName(app)
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.jars", connector_jars())
               .config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile={LOG4J}"))
    for key, value in conf.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session
