"""Fault family: brokers that stop answering (24). Three brokers behind a proxy that swallows replies
(testing.kafka_proxy): at a random point of a task's commit, the partition's transaction and group coordinators
(exactly_once) or the topic's leaders (at_least_once) process requests and never answer, for longer than the stuck
call's deadline, then answer again.

The stuck call must end within its deadline (the call's own limit plus the sink's margin), the task fail and Spark's
retry complete the write: every record once for a read_committed reader under exactly_once; under at_least_once
nothing lost, and a repeat only of a record whose acknowledgement was swallowed.
"""

from __future__ import annotations

import random

from testing.chaos.checker import check, ids_in_topic
from testing.chaos.lab import Lab, Trial
from testing.kafka_proxy import GatedCluster, Silencer, silenced_nodes
from testing.waiting import wait_until

DELIVERY_MS = 6000


def silenced_commit(lab: Lab, rng: random.Random, n: int) -> Trial:
    from recoverable_sink.deadlines import MARGIN_S
    from recoverable_sink.executor.partition_writer import final_wait_s
    from recoverable_sink.options import parse_options

    cluster = GatedCluster(lab.dir("silence-brokers"), 3)
    cluster.start()
    try:
        d = lab.dir("silence")
        topic = cluster.create_topic(f"chaos-{rng.randrange(16**8):08x}", 4)
        df, ids = lab.records(3 * n, 4)
        conf = {"kafka.delivery.timeout.ms": str(DELIVERY_MS), "kafka.request.timeout.ms": "3000",
                "transactional.id.prefix": f"{d.name}-"}
        if lab.guarantee == "exactly_once":
            conf["kafka.transaction.timeout.ms"] = "10000"
        options = parse_options({"kafka.bootstrap.servers": cluster.bootstrap_servers, "topic": topic,
                                 "delivery.guarantee": lab.guarantee, **conf})
        limit = final_wait_s(options) if lab.guarantee == "at_least_once" else min(final_wait_s(options),
                                                                                  DELIVERY_MS / 1000)
        silencer = Silencer(cluster, d / "wal", silenced_nodes(cluster, options, topic, lab.guarantee, 4),
                            hold_s=limit + MARGIN_S + 1)
        trial = Trial(notes={"deadline_seconds": limit + MARGIN_S})
        silencer.start()
        try:
            lab.write(df, cluster.bootstrap_servers, topic, d / "wal", d / "summary.jsonl", **conf)
        except Exception as exc:  # noqa: BLE001 - the trial reports it
            trial.errors.append(f"the write failed: {str(exc)[:500]}")
        silencer.done.wait(120)
        if silencer.silenced is None:
            trial.errors.append("no task reached its commit while the fault waited")
        else:
            _, attempt, nodes = silencer.silenced
            trial.notes.update(silenced_nodes=sorted(nodes), partition=attempt.partition,
                               # None: the attempt did not fail (done first); below 0: it had ended before
                               stuck_call_ended_after_s=None if silencer.took is None else round(silencer.took, 2))
            if silencer.took is not None and silencer.took > limit + MARGIN_S + 5:
                trial.errors.append(f"the stuck attempt ended {silencer.took:.1f} s after the silence, past its "
                                    f"{limit + MARGIN_S:.0f} s deadline")
        trial.passed = not trial.errors
        try:  # an aborted transaction's markers may still be on their way to the partitions
            wait_until(lambda: sum(ids_in_topic(cluster.bootstrap_servers, topic, expected=len(ids),
                                                timeout_s=10).values()) >= len(ids), 90, "every record")
        except AssertionError:
            pass  # fewer is a result, counted by check
        passed = trial.passed
        check(lab, trial, cluster.bootstrap_servers, topic, ids)
        if lab.guarantee == "at_least_once":
            # Every record handed over while the leaders stayed silent was stored and never acknowledged: its fate is
            # unknown to any producer, and the retry sends it again (Spark's sink would resend the partition).
            trial.notes["repeated_unknown_fate"] = trial.duplicated
            trial.passed = passed and trial.lost == 0 and not trial.errors  # check() names ids never written
        return trial
    finally:
        cluster.stop(timeout_s=20)
