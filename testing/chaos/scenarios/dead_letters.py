"""Fault family: records Kafka refuses for what they are, with a dead-letter topic (errors.tolerance=all), while the
Python worker writing each partition is SIGKILLed once a random share of it is acknowledged (25).

A read_committed reader must see every good record once in its topic and every refused one once in the dead-letter
topic; under at_least_once as under exactly_once (a kill at a checkpoint leaves nothing in flight).
"""

from __future__ import annotations

import random
import uuid

from testing.chaos.checker import ids_in_topic, report_uncommitted, verdict
from testing.chaos.lab import Lab, Trial

# One record in a thousand is refused, each refusal class in turn: too large for the topic (max.message.bytes
# 2000), a partition the topic lacks, a negative partition, a timestamp before 1970, a header without a key.
_CLASSES = {101: "RecordTooLarge", 333: "PartitionOutOfRange", 555: "NegativePartition", 777: "TimestampBeforeEpoch",
            999: "NullHeaderKey"}


def dead_letters(lab: Lab, rng: random.Random, n: int) -> Trial:
    """0.1% refusable records of five classes, a dead-letter topic, each partition's first worker killed."""
    from pyspark.sql import functions as F

    spark = lab.spark  # started before any column is built
    d, topic, dead = lab.dir("dead-letters"), lab.topic(4, **{"max.message.bytes": "2000"}), lab.topic(2)
    prefix = uuid.uuid4().hex[:6]
    slot = F.floor((F.col("id") % 5000) / 5)  # 0..999: the refused ids are those whose slot is a key of _CLASSES
    refused_at = lambda k: (F.col("id") % 5 == 0) & (slot == k)  # noqa: E731 - one in 5,000 ids per class
    df = spark.range(n, numPartitions=4).select(
        F.concat(F.lit(f"{prefix}-"), F.col("id").cast("string")).alias("key"),
        F.when(refused_at(101), F.repeat(F.lit("x"), 3000)).otherwise(F.concat(F.lit("payload-"), F.col("id")))
        .cast("binary").alias("value"),
        F.when(refused_at(333), F.lit(40)).when(refused_at(555), F.lit(-3)).otherwise(F.lit(None)).cast("int")
        .alias("partition"),
        F.when(refused_at(777), F.lit("1969-07-20 20:17:40").cast("timestamp"))
        .otherwise(F.lit(None).cast("timestamp")).alias("timestamp"),
        F.array(F.struct(F.when(refused_at(999), F.lit(None).cast("string")).otherwise(F.lit("trace")).alias("key"),
                         F.lit(b"t").cast("binary").alias("value"))).alias("headers"))
    bad = [i for i in range(n) if i % 5 == 0 and (i % 5000) // 5 in _CLASSES]
    k = rng.randint(max(1, n // 40), max(2, n // 4 - n // 40))
    summary = lab.write(df, lab.kafka.bootstrap_servers, topic, d / "wal", d / "summary.jsonl",
                        **{"errors.tolerance": "all", "errors.deadletterqueue.topic.name": dead,
                           "_test.killAfterRecords": str(k), "transactional.id.prefix": f"{prefix}-"})
    good_ids = [f"{prefix}-{i}" for i in sorted(set(range(n)) - set(bad))]
    bad_ids = [f"{prefix}-{i}" for i in bad]
    trial = Trial(notes={"kill_after": k, "retried_partitions": summary["retried_partitions"],
                         "dead_lettered": summary["dead_lettered"], "refusable": len(bad)})
    found_good = ids_in_topic(lab.kafka.bootstrap_servers, topic, expected=len(good_ids))
    found_bad = ids_in_topic(lab.kafka.bootstrap_servers, dead, expected=len(bad_ids))
    lost_good, dup_good, odd_good = verdict(good_ids, found_good)
    lost_bad, dup_bad, odd_bad = verdict(bad_ids, found_bad)
    trial.lost, trial.duplicated = lost_good + lost_bad, dup_good + dup_bad
    trial.records_expected = n
    trial.notes["dead_letter_topic"] = {"lost": lost_bad, "duplicated": dup_bad}
    report_uncommitted(lab, trial, lab.kafka.bootstrap_servers, topic, good_ids)
    if odd_good or odd_bad:
        trial.errors.append(f"{odd_good} unexpected records in the topic, {odd_bad} in the dead-letter topic")
    trial.passed = (summary["retried_partitions"] > 0 and sum(summary["dead_lettered"].values()) == len(bad)
                    and trial.lost == 0 and trial.duplicated == 0 and not trial.errors)
    return trial
