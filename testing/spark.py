"""One way to start a SparkSession for the tests, the demo, the chaos campaign and the benchmark (the
virtualenv's Python for the workers, Spark's Kafka connector on the classpath, no UI, quiet logs), and one way
to build a sink write.

This module is the one place that sets ``PYSPARK_PYTHON``: importing it points Spark's Python workers (and
every child process started afterwards) at this interpreter, which has pyarrow, lmdb and confluent-kafka.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from testing.kafka_local import REPO

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, DataFrameWriter, SparkSession
    from pyspark.sql.streaming import DataStreamWriter

SPARK_JARS = REPO / "build" / "spark-jars"
LOG4J = REPO / "spark_conf" / "log4j2.properties"


def python_env() -> dict[str, str]:
    """This process's environment with Spark's Python workers pointed at this interpreter."""
    return {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}


os.environ.update({k: v for k, v in python_env().items() if k.startswith("PYSPARK_")})


def connector_jars() -> str:
    """Spark's own Kafka connector (spark-sql-kafka-0-10 at the pyspark version) and its dependencies."""
    return ",".join(str(p) for p in sorted(SPARK_JARS.glob("*.jar")))


def local_spark(app: str, master: str = "local[2,4]", **conf: str) -> SparkSession:
    """A SparkSession on ``master`` (``local[N,F]`` retries failed tasks F-1 times); ``conf`` adds settings,
    e.g. ``**{"spark.driver.memory": "4g"}``."""
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


def _sink_options(bootstrap: str, topic: str | None, wal_path: object | None, options: dict[str, str]) -> dict:
    out = {"kafka.bootstrap.servers": bootstrap}
    if topic is not None:
        out["topic"] = topic
    if wal_path is not None:
        out["wal.path"] = str(wal_path)
    out.update({k: str(v) for k, v in options.items()})
    return out


def sink_writer(df: DataFrame, bootstrap: str, topic: str | None = None, wal_path: object | None = None,
                **options: str) -> DataFrameWriter:
    """``df.write.format("recoverable_kafka").mode("append")`` with the options given; names with dots go in
    as ``**{"wal.maxBytes": "1m"}``."""
    return df.write.format("recoverable_kafka").mode("append").options(
        **_sink_options(bootstrap, topic, wal_path, options))


def sink_stream_writer(df: DataFrame, bootstrap: str, topic: str | None = None, wal_path: object | None = None,
                       **options: str) -> DataStreamWriter:
    """``df.writeStream.format("recoverable_kafka")`` with the options given."""
    return df.writeStream.format("recoverable_kafka").options(**_sink_options(bootstrap, topic, wal_path, options))
