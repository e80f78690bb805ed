"""The fault campaign's fast subset: one trial of every scenario (``make chaos`` runs several, with more
records). Nothing may be lost anywhere; nothing may be repeated in the strict scenarios."""

import random

import pytest

from recoverable_sink import RecoverableKafkaDataSource
from testing.chaos.lab import Lab
from testing.chaos.scenarios import SCENARIOS


@pytest.fixture(scope="module")
def lab(spark, kafka, request, tmp_path_factory):
    spark.dataSource.register(RecoverableKafkaDataSource)
    # Smaller Arrow batches, so kill points fall inside partitions of a test-sized write.
    before = spark.conf.get("spark.sql.execution.arrow.maxRecordsPerBatch")
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "2000")
    yield Lab(tmp_path_factory.mktemp("chaos"), kafka, lambda: request.getfixturevalue("kafka3"), lambda: spark)
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", before)


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.id for s in SCENARIOS])
def test_fault_scenario(lab, scenario):
    trial = scenario.run(lab, random.Random(f"test-{scenario.id}"), 16_000)
    assert trial.passed, f"{scenario.title}: {trial}"
    assert trial.lost == 0, trial
    if scenario.strict:
        assert trial.duplicated == 0, trial
        assert trial.records_expected > 0
