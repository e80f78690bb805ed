"""The test harness's own servers (testing.kafka_local): a cluster that fails to start stops every broker it started,
and a fixture's start is tried once more with a fresh cluster, so that a slow start on a loaded machine neither
leaves brokers running for the rest of the session nor fails every test of a module."""

from __future__ import annotations

import logging
import os

import pytest

from testing.kafka_local import KafkaCluster, metadata, start_cluster


def _brokers_under(root) -> list[int]:
    """The pids of the broker JVMs whose properties file lies under ``root`` (by /proc, whoever started them)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if str(root).encode() in f.read():
                        found.append(int(entry))
            except OSError:
                continue
    return found


def test_a_cluster_not_ready_at_its_deadline_stops_the_brokers_it_started(tmp_path):
    cluster = KafkaCluster(tmp_path / "slow", 3)
    with pytest.raises(TimeoutError, match=r"not ready after 0.5s"):
        cluster.start(timeout_s=0.5)  # three JVMs are never ready this soon
    assert _brokers_under(tmp_path / "slow") == []
    assert all(cluster.pid(node) is None for node in cluster.node_ids)


def test_a_fixture_start_that_fails_is_tried_once_more_with_a_fresh_cluster(tmp_path, caplog):
    made: list[KafkaCluster] = []

    def make() -> KafkaCluster:
        # The first: a broker that refuses its configuration and exits while starting.
        props = {"num.network.threads": "0"} if not made else {}
        made.append(KafkaCluster(tmp_path / "retried", 1, broker_props=props))
        return made[-1]

    with caplog.at_level(logging.WARNING, logger="testing.kafka_local"):
        cluster = start_cluster(make)
    try:
        assert len(made) == 2 and cluster is made[1]
        assert "did not start" in caplog.text and "starting a fresh one" in caplog.text
        assert metadata(cluster.bootstrap_servers) is not None
        assert _brokers_under(tmp_path / "retried") == [cluster.pid(1)]
    finally:
        cluster.stop(timeout_s=20)
