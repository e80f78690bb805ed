"""The fault scenarios, one module per fault family, assembled here into the campaign's ordered registry.
Each scenario takes the lab, a seeded random generator and a size, runs one trial and returns what the
independent checker counted: lost (never landed), duplicated (landed twice), errors seen.

    worker     Python worker SIGKILL (1, 1b)
    executor   executor JVM SIGKILL, a lost WAL host, speculation (2, 14, 15, 16)
    broker     broker SIGKILL, broker down past the delivery timeout (3, 4, 5)
    stream     streaming driver SIGKILL and restart from checkpoint (6, 12, 13)
    wal_disk   WAL bound, WAL corruption, full disk (7, 8, 9)
    inputs     bad inputs, secrets and WAL modes (10, 11)
    upstream   failures upstream of the sink's writer (17, 18, 19)
    retention  broker state of a long stream, WAL retention sweeps (20, 21)
    reruns     a failed micro-batch re-run on another partitioning, a zombie driver (22, 23)
    silence    brokers that stop answering at a task's commit (24)
    dead_letters  refused records routed to a dead-letter topic under worker kills (25)
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from testing.chaos.lab import Lab, Trial
from testing.chaos.scenarios.broker import (
    broker_down_past_delivery_timeout,
    broker_kill_single,
    leader_kill_three_brokers,
)
from testing.chaos.scenarios.dead_letters import dead_letters
from testing.chaos.scenarios.executor import (
    executor_jvm_kill,
    executor_kill_wal_lost,
    shuffle_executor_kill,
    speculation,
)
from testing.chaos.scenarios.inputs import bad_inputs, security
from testing.chaos.scenarios.reruns import stream_rerun_repartitioned, zombie_driver
from testing.chaos.scenarios.retention import long_stream_broker_state, sweep_while_running
from testing.chaos.scenarios.silence import silenced_commit
from testing.chaos.scenarios.stream import (
    stream_driver_kill,
    stream_driver_kill_random,
    stream_restart_to_another_topic,
)
from testing.chaos.scenarios.upstream import stream_upstream_failures, transient_upstream_failure, upstream_failure
from testing.chaos.scenarios.wal_disk import disk_full, wal_bound, wal_corruption
from testing.chaos.scenarios.worker import python_worker_kill, python_worker_kill_random_moment

ALO, EO = "at_least_once", "exactly_once"


@dataclass(frozen=True)
class Scenario:
    id: str  # its number in the campaign's table and results
    title: str
    run: Callable[[Lab, random.Random, int], Trial]
    strict: bool  # lost and duplicated must both be 0 (every scenario requires lost == 0)
    # delivery.guarantee values it runs under; under exactly_once every scenario is strict (read_committed)
    modes: tuple[str, ...] = (ALO, EO)

    @property
    def name(self) -> str:
        """What the suite's test ids and CHAOS_ONLY choose it by: its trial's function, hyphenated."""
        return self.run.__name__.replace("_", "-")


def by_name(*names: str) -> set[str]:
    """The names, checked against the registry (a renamed scenario must not drop silently out of a selection)."""
    known = {s.name for s in SCENARIOS}
    unknown = set(names) - known
    assert not unknown, f"no such chaos scenario: {sorted(unknown)}"
    return set(names)


# Non-strict scenarios allow repeats only where the sink cannot know the outcome (records acknowledged after
# the last checkpoint of a killed process, or in flight when a broker died): see README, Guarantees.
SCENARIOS: list[Scenario] = [
    Scenario("1", "1. Python worker SIGKILL at a checkpoint (local[2,4])", python_worker_kill, True),
    Scenario("1b", "1b. Python worker SIGKILL at a random moment", python_worker_kill_random_moment, False),
    Scenario("2", "2. Executor JVM SIGKILL (local-cluster[2,1,1024])", executor_jvm_kill, True),
    Scenario("3", "3. Broker SIGKILL and restart, single broker", broker_kill_single, True),
    Scenario("4", "4. Partition leader SIGKILL, 3 brokers, RF 3, min.isr 2", leader_kill_three_brokers, True),
    Scenario("5", "5. Broker down past delivery.timeout.ms, then replay and re-run", broker_down_past_delivery_timeout,
             False),
    Scenario("6", "6. Streaming driver SIGKILL at a checkpoint, restart from checkpoint", stream_driver_kill, True),
    Scenario("7", "7. wal.maxBytes reached (broker killed at random), then re-run", wal_bound, False),
    Scenario("8", "8. WAL corruption: flipped byte, truncated file", wal_corruption, False),
    Scenario("9", "9. Disk full under wal.path (1 MiB tmpfs)", disk_full, False),
    Scenario("10", "10. Bad inputs", bad_inputs, False),
    Scenario("11", "11. Security: WAL modes, secrets never logged", security, False),
    Scenario("12", "12. Streaming driver SIGKILL at random moments (one after a batch's commit())",
             stream_driver_kill_random, True),
    Scenario("13", "13. Streaming query killed at random, restarted towards another topic",
             stream_restart_to_another_topic, True),
    Scenario("14", "14. Shuffle before the sink, executor JVM SIGKILL at random (local-cluster)",
             shuffle_executor_kill, False),
    # At-least-once repeats what the lost WAL had seen acknowledged (its documented limit): no loss is all it
    # promises there; exactly_once is strict, as everywhere.
    Scenario("15", "15. Executor JVM SIGKILL and its WAL directory deleted (retry as on another host)",
             executor_kill_wal_lost, False),
    Scenario("16", "16. spark.speculation: a stalled task and its copy on another host (standalone cluster)",
             speculation, False),
    Scenario("17", "17. A task failing upstream of the sink in every attempt, then a re-run", upstream_failure, True),
    Scenario("18", "18. Every task's first attempt failing upstream of the sink", transient_upstream_failure, True),
    Scenario("19", "19. A stream failing upstream of the sink, restarted with a transient failure",
             stream_upstream_failures, True),
    Scenario("20", "20. exactly_once stream of 200 micro-batches: transactional ids and marker groups",
             long_stream_broker_state, True, (EO,)),
    Scenario("21", "21. wal.retentionHours of 2 s, swept while a task waits for its input", sweep_while_running,
             True),
    Scenario("22", "22. A failed micro-batch re-run on another partitioning after a restart",
             stream_rerun_repartitioned, True),
    # A zombie frozen mid-send goes on sending under at_least_once (repeats, never loss); exactly_once fences it.
    Scenario("23", "23. A zombie driver frozen as a micro-batch starts, resumed after another ran the query",
             zombie_driver, False),
    # at_least_once: a record whose acknowledgement the proxy swallowed was stored, and is sent again.
    Scenario("24", "24. Coordinators or leaders stop answering at a random point of a task's commit (3 brokers)",
             silenced_commit, False),
    Scenario("25", "25. 0.1% refusable records of five classes to a dead-letter topic, each first worker SIGKILLed",
             dead_letters, True),
]
