"""Proof of delivery kept in Kafka, on a cluster of two hosts: a Spark standalone cluster whose two workers each have a
host name of their own (a UTS namespace, ``unshare --uts``) and a WAL of their own, as executors on a real cluster
do. A retry on the other host, and a re-run of a failed write where its WAL is not (the hosts' WALs wiped between the
runs: lost disks, a cluster of other executors), on the same or another partitioning and again after that, must each
deliver every record once under exactly_once, and repeat nothing under at_least_once where every failed attempt got
to checkpoint (failures, not kills); each re-run completes, none is refused.

Issue 62's table, rows 1-3 and 5 (row 4, a stream restarted after the brokers expired its markers, on a host without
its WAL, is in test_broker_state.py)."""

import json
import random
import shutil

import pytest

from recoverable_sink.wal import close_wals, open_wal
from testing.chaos.checker import ids_in_topic, verdict
from testing.chaos.lab import python_subprocess
from testing.standalone import StandaloneCluster

pytestmark = pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare (util-linux)")

MODES = ["at_least_once", "exactly_once"]
HOSTS = {"127.0.0.1": "rk-host-a", "localhost": "rk-host-b"}  # Spark's host name -> the workers' own
ROWS = 12_000


@pytest.fixture(scope="module")
def two_hosts(tmp_path_factory):
    root = tmp_path_factory.mktemp("two-hosts")
    wals = {name: root / f"wal-{name}" for name in HOSTS.values()}
    workers = {spark_host: {"RECOVERABLE_KAFKA_WAL_PATH": str(wals[name])} for spark_host, name in HOSTS.items()}
    with StandaloneCluster(root / "cluster", workers, host_names=dict(HOSTS)) as cluster:
        yield cluster, wals


def _job(cluster, kafka, topic, log, rows, partitions, prefix, options, conf=None, fail_at=None):
    conf = {"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1", "spark.cores.max": "2",
            "spark.executor.cores": "1", **(conf or {})}
    args = ["-m", "testing.chaos.jobs", "--master", cluster.master_url, "--rows", str(rows), "--partitions",
            str(partitions), "--prefix", prefix, "--bootstrap", kafka.bootstrap_servers, "--topic", topic,
            "--summary", str(log.with_suffix(".jsonl")),
            *[a for k, v in options.items() for a in ("--option", f"{k}={v}")],
            *[a for k, v in conf.items() for a in ("--conf", f"{k}={v}")]]
    if fail_at is not None:
        args += ["--fail-at", str(fail_at)]
    job = python_subprocess(args, log, SPARK_LOCAL_IP="127.0.0.1")
    return job.wait(600), log


def _wipe(wals) -> None:
    """The hosts lose their disks: the next run finds no WAL of the earlier one."""
    close_wals()
    for wal in wals.values():
        shutil.rmtree(wal, ignore_errors=True)


def _check(kafka, topic, prefix, rows, mode):
    found = ids_in_topic(kafka.bootstrap_servers, topic, expected=rows)
    lost, duplicated, unexpected = verdict((f"{prefix}-{i}" for i in range(rows)), found)
    print(f"{mode}: lost {lost}, duplicated {duplicated}")
    return lost, duplicated, unexpected


@pytest.mark.parametrize("mode", MODES)
def test_a_task_retried_on_the_other_host_skips_what_its_failed_attempt_delivered(kafka, new_topic, two_hosts,
                                                                                 tmp_path, mode):
    """Row 1: every partition's first attempt dies at 60% of its rows, once what it sent is acknowledged and
    checkpointed; Spark's exclusion after a failure (spark.excludeOnFailure) runs the retry on the other host, whose
    WAL has none of it."""
    cluster, wals = two_hosts
    topic, prefix = new_topic(4), f"retry-{mode[:3]}"
    per = ROWS // 2
    code, log = _job(cluster, kafka, topic, tmp_path / "job.log", ROWS, 2, prefix,
                     {"delivery.guarantee": mode, "transactional.id.prefix": f"{prefix}-",
                      "_test.killAfterRecords": str(per * 6 // 10)},
                     {"spark.excludeOnFailure.enabled": "true", "spark.task.maxFailures": "4"})
    assert code == 0, log.read_text(errors="replace")[-3000:]
    assert _check(kafka, topic, prefix, ROWS, mode) == (0, 0, 0)
    close_wals()
    # Each partition ran on both hosts: its first attempt's WAL entry on one, the retry that finished on the other.
    hosts_of: dict[int, set[str]] = {}
    for name, wal in wals.items():
        if (wal / "data.mdb").exists():
            for a in open_wal(str(wal)).attempts():
                hosts_of.setdefault(a.partition, set()).add(name)
    assert hosts_of and all(len(h) == 2 for h in hosts_of.values()), hosts_of


@pytest.mark.parametrize("mode", MODES)
def test_a_failed_write_rerun_where_its_wal_is_not_on_the_same_partitioning(kafka, new_topic, two_hosts, tmp_path,
                                                                           mode):
    """Row 2: run 1 fails late in one partition of four (the others commit); run 2, same partitioning, on hosts
    without run 1's WAL."""
    cluster, wals = two_hosts
    topic, prefix = new_topic(4), f"same-{mode[:3]}"
    options = {"delivery.guarantee": mode, "wal.writeId": prefix, "transactional.id.prefix": f"{prefix}-"}
    per = ROWS // 4
    fail_at = 2 * per + per - random.randrange(1, per // 8)
    print(f"run 1 fails at row {fail_at}")
    code, log = _job(cluster, kafka, topic, tmp_path / "run1.log", ROWS, 4, prefix, options, fail_at=fail_at)
    assert code != 0 and f"upstream failure at row {fail_at}" in log.read_text(errors="replace")
    _wipe(wals)
    code, log = _job(cluster, kafka, topic, tmp_path / "run2.log", ROWS, 4, prefix, options)
    assert code == 0, log.read_text(errors="replace")[-3000:]
    assert _check(kafka, topic, prefix, ROWS, mode) == (0, 0, 0)


@pytest.mark.parametrize("mode", MODES)
def test_a_failed_write_rerun_where_its_wal_is_not_on_other_partitionings_again_and_again(kafka, new_topic,
                                                                                          two_hosts, tmp_path, mode):
    """Rows 3 and 5: run 1 fails on 4 partitions; run 2 splits the rows into 3 partitions on hosts without run 1's WAL
    (exactly_once used to commit duplicates of the partitions that had committed, then refuse one partition); then,
    each on fresh disks, re-runs on 5 and on 4 partitions (exactly_once used to refuse each of them, naming the
    other partitioning, until the markers expired). Every run after the first completes; every record once."""
    cluster, wals = two_hosts
    topic, prefix = new_topic(4), f"split-{mode[:3]}"
    options = {"delivery.guarantee": mode, "wal.writeId": prefix, "transactional.id.prefix": f"{prefix}-"}
    per = ROWS // 4
    fail_at = per + per - random.randrange(1, per // 8)
    print(f"run 1 fails at row {fail_at}")
    code, log = _job(cluster, kafka, topic, tmp_path / "run1.log", ROWS, 4, prefix, options, fail_at=fail_at)
    assert code != 0 and f"upstream failure at row {fail_at}" in log.read_text(errors="replace")
    for run, partitions in enumerate((3, 5, 4), start=2):
        _wipe(wals)
        code, log = _job(cluster, kafka, topic, tmp_path / f"run{run}.log", ROWS, partitions, prefix, options)
        assert code == 0, log.read_text(errors="replace")[-3000:]
        assert _check(kafka, topic, prefix, ROWS, mode) == (0, 0, 0), f"after run {run} on {partitions} partitions"
        summary = [json.loads(line) for line in log.with_suffix(".jsonl").read_text().splitlines() if line.strip()]
        assert summary and summary[-1]["event"] == "commit"
