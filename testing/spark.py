"""One way to start a SparkSession for the tests, the demo, the chaos campaign and the benchmark (the
virtualenv's Python for the workers, Spark's Kafka connector on the classpath, no UI, quiet logs), and one way
to build a sink write.

This module is the one place that sets ``PYSPARK_PYTHON``: importing it points Spark's Python workers (and
every child process started afterwards) at this interpreter, which has pyarrow, lmdb and confluent-kafka.
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
import tempfile
from importlib.metadata import version
from typing import TYPE_CHECKING

from testing.kafka_local import REPO

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, DataFrameWriter, SparkSession
    from pyspark.sql.streaming import DataStreamWriter

SPARK_JARS = REPO / "build" / "spark-jars"
LOG4J = REPO / "spark_conf" / "log4j2.properties"
# Spark's classes as the JVM left them after loading (AppCDS), for the pyspark installed: a driver that maps
# them starts in about 70% of the time (13.7 -> 9.5 s to a first write here). The JVM checks the archive
# against its own build and the class path (jar sizes and times), and ignores one that does not match.
CLASS_ARCHIVE = REPO / "build" / "cds" / f"spark-{version('pyspark')}.jsa"
# Set by the test suite: drivers that do little work start faster with the JIT's first tier only (C1).
QUICK_START_ENV = "RK_QUICK_JVM_START"

log = logging.getLogger(__name__)


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
               .config("spark.driver.extraJavaOptions", driver_java_options()))
    if os.environ.get(QUICK_START_ENV) == "1":
        builder = builder.config("spark.executor.extraJavaOptions", "-XX:TieredStopAtLevel=1")
    for key, value in conf.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session


def driver_java_options(archive_to: str | None = None) -> str:
    """The driver JVM's options: quiet logs; Spark's classes from :data:`CLASS_ARCHIVE` when it exists (or
    written to ``archive_to`` at exit); the C1 JIT only under ``RK_QUICK_JVM_START=1`` (the tests' drivers
    start often and do little, the benchmark's must run at full speed)."""
    options = [f"-Dlog4j2.configurationFile={LOG4J}"]
    if archive_to is not None:
        options += [f"-XX:ArchiveClassesAtExit={archive_to}", "-Xlog:cds=off"]  # not a line per class skipped
    elif CLASS_ARCHIVE.exists():
        options.append(f"-XX:SharedArchiveFile={CLASS_ARCHIVE}")
    if os.environ.get(QUICK_START_ENV) == "1":
        options.append("-XX:TieredStopAtLevel=1")
    return " ".join(options)


def write_class_archive() -> None:
    """Write :data:`CLASS_ARCHIVE`, unless it exists, from a driver of its own that does what the tests'
    drivers do (a Python data source, a write, a file stream): the JVM writes the archive as it exits. It is
    written under another name and renamed, so that no driver maps a half-written archive."""
    if CLASS_ARCHIVE.exists():
        return
    CLASS_ARCHIVE.parent.mkdir(parents=True, exist_ok=True)
    for stale in CLASS_ARCHIVE.parent.glob("*.jsa*"):
        stale.unlink()
    partial = CLASS_ARCHIVE.with_name(CLASS_ARCHIVE.name + ".partial")
    subprocess.run([sys.executable, "-m", "testing.spark", "--archive-driver", str(partial)], cwd=REPO,
                   env=python_env(), check=True, timeout=600)
    if partial.exists():
        partial.rename(CLASS_ARCHIVE)
    else:  # only slower starts follow
        log.warning("the JVM wrote no class archive at %s; Spark drivers start without one", partial)


def _archive_driver(archive_to: str) -> None:
    from pyspark.sql import SparkSession

    from recoverable_sink import RecoverableKafkaDataSource

    spark = (SparkSession.builder.master("local[2]").appName("class-archive")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.jars", connector_jars())
             .config("spark.driver.extraJavaOptions", driver_java_options(archive_to=archive_to)).getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(RecoverableKafkaDataSource)
    with tempfile.TemporaryDirectory() as tmp:
        spark.range(1000, numPartitions=2).selectExpr("CAST(id AS STRING) AS value").write.mode("overwrite").json(tmp)
        query = (spark.readStream.schema("value STRING").json(tmp).writeStream.format("noop")
                 .option("checkpointLocation", f"{tmp}/checkpoint").trigger(availableNow=True).start())
        query.awaitTermination()
    jvm = spark.sparkContext._gateway.proc
    spark.stop()
    jvm.stdin.close()  # the gateway JVM exits when its stdin closes, and writes the archive as it does
    jvm.wait(300)


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


def tasks_running(spark: SparkSession) -> int:
    """How many tasks the scheduler has launched and not yet seen end. A failed job returns while its stage's other
    tasks still run (or were launched a moment before the abort and have not begun). The scheduler's own count, not
    the status tracker's, which lags and in local mode stays at 0."""
    counts = spark.sparkContext._jsc.sc().taskScheduler().runningTasksByExecutors().values().iterator()
    running = 0
    while counts.hasNext():
        running += counts.next()
    return running


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="write CLASS_ARCHIVE (make integration and make chaos do)")
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--class-archive", action="store_true", help="write it unless it exists")
    group.add_argument("--archive-driver", metavar="PATH", help="(internal) the driver whose JVM writes it")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO)
    if args.archive_driver:
        _archive_driver(args.archive_driver)
    else:
        write_class_archive()
