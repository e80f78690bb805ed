"""The at_least_once kill window, at random moments (issue 61's third case): Python workers SIGKILLed from outside at
random points of a write of 400,000 rows of about 300 bytes on 4 partitions (local[2,4]: the retry runs on the same
host). A kill repeats at most what was handed to the producer in the last two drain windows: a drain comes every
CHECKPOINT_MAX_RECORDS records handed over (and every 0.05 s), and a drain's acknowledgements reach the WAL before the
window after the next begins (docs/guarantees.md). Before the windows had a record bound, one kill repeated 40,000."""

import os
import random
import signal
import threading

from pyspark.sql import functions as F

from recoverable_sink.executor.partition_writer import CHECKPOINT_MAX_RECORDS
from testing.chaos.checker import ids_in_topic, verdict
from testing.chaos.lab import python_workers
from testing.kafka_check import count_topic
from testing.spark import sink_writer

ROWS, PARTITIONS, KILLS = 400_000, 4, 3


def test_a_kill_at_a_random_moment_repeats_at_most_two_drain_windows(spark, kafka, new_topic, tmp_path):
    topic, wal = new_topic(PARTITIONS), tmp_path / "wal"
    df = spark.range(ROWS, numPartitions=PARTITIONS).select(
        F.col("id").cast("string").alias("key"),
        F.concat(F.lit("v-"), F.col("id").cast("string"), F.lit("-"), F.repeat(F.lit("x"), 280)).alias("value"))
    rng = random.Random()
    targets = sorted(rng.sample(range(ROWS // 10, ROWS * 8 // 10), KILLS))
    print(f"kills once {targets} records landed")
    killed: list[int] = []
    done = threading.Event()

    def kill_at_random_moments() -> None:
        for target in targets:
            while not done.is_set() and count_topic(kafka.bootstrap_servers, topic) < target:
                done.wait(0.02)
            workers = python_workers(wal)
            if done.is_set() or not workers:
                return
            pid = rng.choice(workers)
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except ProcessLookupError:
                pass

    killer = threading.Thread(target=kill_at_random_moments, daemon=True)
    killer.start()
    try:
        sink_writer(df, kafka.bootstrap_servers, topic, wal).save()
    finally:
        done.set()
        killer.join(30)
    found = ids_in_topic(kafka.bootstrap_servers, topic, expected=ROWS)
    lost, duplicated, unexpected = verdict((str(i) for i in range(ROWS)), found)
    bound = len(killed) * 2 * CHECKPOINT_MAX_RECORDS
    print(f"{len(killed)} kills: lost {lost}, duplicated {duplicated} (bound {bound})")
    assert killed, "no kill landed on a worker writing this write"
    assert (lost, unexpected) == (0, 0)
    assert duplicated <= bound
