"""A task whose JVM side fails upstream of the sink: its Python writer's input ends early, at an Arrow batch
boundary, and must not be taken for the whole partition. Both delivery modes, on real Spark and a real broker;
the failing row is drawn at random (printed, so a failure can be replayed)."""

import random
import subprocess
import sys
import time

import pytest
from pyspark import TaskContext
from pyspark.sql import functions as F
from pyspark.sql.types import StringType

from recoverable_sink.wal import LOGGED, open_wal
from testing.chaos.checker import ids_in_topic, verdict
from testing.spark import sink_writer

ROWS = 20_000
MODES = ["at_least_once", "exactly_once"]


pytestmark = pytest.mark.usefixtures("small_batches")  # Arrow batches of 1,000 rows: a cut lands mid-way


def _frame(spark, fail_at=None, wal=None, write_id=None):
    df = spark.range(ROWS, numPartitions=1)
    key = F.col("id").cast("string")
    if fail_at is None:
        return df.select(key.alias("key"), F.lit("v").alias("value"))
    wal_path = str(wal)

    def upstream(k: str) -> str:
        """Evaluated upstream of the sink, in every attempt; fails at ``fail_at`` once the sink's writer has begun
        its attempt (on a loaded machine the task could otherwise fail before the sink's worker started)."""
        if int(k) == fail_at:
            from recoverable_sink.wal import open_wal

            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and not open_wal(wal_path).attempts(f"{write_id}/"):
                time.sleep(0.05)
            raise RuntimeError(f"upstream failure at row {fail_at}")
        return "v"

    return df.select(key.alias("key"), F.udf(upstream, StringType())(key).alias("value"))


def _options(mode, write_id):
    return {"delivery.guarantee": mode, "wal.writeId": write_id, "transactional.id.prefix": f"cut-{write_id}-"}


@pytest.mark.parametrize("mode", MODES)
def test_a_partition_whose_input_the_jvm_cut_short_is_never_committed(spark, kafka, new_topic, tmp_path, mode):
    fail_at = random.randrange(3_000, ROWS - 1_000)
    print(f"failing at row {fail_at}")
    topic, wal = new_topic(1), tmp_path / "wal"
    write_id = f"cut-{mode}-{fail_at}"
    with pytest.raises(Exception, match=f"upstream failure at row {fail_at}"):
        sink_writer(_frame(spark, fail_at, wal, write_id), kafka.bootstrap_servers, topic, wal,
                    **_options(mode, write_id)).save()

    seen = ids_in_topic(kafka.bootstrap_servers, topic, timeout_s=30)
    if mode == "exactly_once":
        assert sum(seen.values()) == 0, "a read_committed reader sees records of a partition Spark failed"
    else:  # what was sent is at least once, never twice, and only rows before the failure
        assert max(seen.values(), default=1) == 1
        assert all(int(k) < fail_at for k in seen)
    attempts = open_wal(str(wal)).attempts(f"{write_id}/")
    assert attempts and all(a.state != LOGGED for a in attempts), [a.state for a in attempts]
    if mode == "at_least_once":
        # replay trusts only a fully logged partition: it must refuse this one, not report success.
        replay = subprocess.run([sys.executable, "-m", "recoverable_sink.ops.cli", "replay", "--path", str(wal),
                                 "--write-id", write_id, "--bootstrap-servers", kafka.bootstrap_servers],
                                capture_output=True, text=True, timeout=120)
        assert replay.returncode != 0, replay.stdout + replay.stderr

    # The fault fixed, a re-run under the same wal.writeId delivers every record exactly once.
    sink_writer(_frame(spark), kafka.bootstrap_servers, topic, wal, **_options(mode, write_id)).save()
    found = ids_in_topic(kafka.bootstrap_servers, topic, expected=ROWS)
    assert verdict((str(i) for i in range(ROWS)), found) == (0, 0, 0)


@pytest.mark.parametrize("mode", MODES)
def test_a_transient_upstream_failure_is_retried_to_every_record_once(spark, kafka, new_topic, tmp_path, mode):
    fail_at = random.randrange(3_000, ROWS - 1_000)
    print(f"first attempt failing at row {fail_at}")

    def flaky(key: str) -> str:
        ctx = TaskContext.get()
        if ctx is not None and ctx.attemptNumber() == 0 and int(key) == fail_at:
            raise RuntimeError(f"transient upstream failure at row {fail_at}")
        return "v"

    df = _frame(spark).withColumn("value", F.udf(flaky, StringType())("key"))
    topic = new_topic(1)
    sink_writer(df, kafka.bootstrap_servers, topic, tmp_path / "wal",
                **_options(mode, f"flaky-{mode}-{fail_at}")).save()
    found = ids_in_topic(kafka.bootstrap_servers, topic, expected=ROWS)
    assert verdict((str(i) for i in range(ROWS)), found) == (0, 0, 0)
