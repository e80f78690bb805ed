"""``make chaos``: every fault scenario CHAOS_TRIALS times (default 3) with randomized kill points, on real
brokers and real Spark; results in build/chaos/results.json and a markdown table.

    make chaos                              # CHAOS_TRIALS=3 CHAOS_ROWS=40000 CHAOS_SEED=<time>
    CHAOS_ONLY=broker-kill-single,zombie-driver make chaos   # some scenarios only (by name, or number)
    CHAOS_MODES=exactly_once make chaos     # one delivery.guarantee only (default: both)
    python -m testing.chaos.run --list      # the scenarios (number, name, title, modes), without running any

Under exactly_once every scenario is strict, counted by a read_committed consumer; what a read_uncommitted
consumer sees is reported in each trial's details.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import shutil
import sys
import time
from typing import Any

from testing.chaos.lab import Lab, Trial
from testing.chaos.scenarios import ALO, EO, SCENARIOS, Scenario
from testing.kafka_local import REPO, KafkaCluster
from testing.spark import local_spark

OUT = REPO / "build" / "chaos"


def aggregate(scenario: Scenario, mode: str, trials: list[Trial]) -> dict[str, Any]:
    errors: list[str] = []
    for t in trials:
        errors.extend(e for e in t.errors if e not in errors)
    return {
        "id": scenario.id,
        "scenario": scenario.name,
        "mode": mode,
        "name": scenario.title,
        "strict": scenario.strict or mode == EO,  # lost and duplicated must both be 0
        "trials": len(trials),
        "records_expected": sum(t.records_expected for t in trials),
        "lost": sum(t.lost for t in trials),
        "duplicated": sum(t.duplicated for t in trials),
        "errors": errors,
        "passed": all(t.passed for t in trials),
        "details": [t.notes for t in trials],
    }


def merged(results: list[dict[str, Any]], partial: bool) -> list[dict[str, Any]]:
    """A CHAOS_ONLY rerun replaces its scenarios' entries in the last results and keeps the others."""
    path = OUT / "results.json"
    if not partial or not path.exists():
        return results
    fresh = {(r["id"], r["mode"]) for r in results}
    old = [r for r in json.loads(path.read_text()).get("scenarios", [])
           if (r.get("id"), r.get("mode", ALO)) not in fresh]
    order = {s.id: i for i, s in enumerate(SCENARIOS)}
    return sorted(old + results, key=lambda r: (r.get("mode", ALO) != ALO, order.get(r.get("id", ""), len(order))))


def table(results: list[dict[str, Any]]) -> str:
    lines = ["| scenario | delivery.guarantee | trials | records expected | lost | duplicated | result |",
             "|---|---|---:|---:|---:|---:|---|"]
    for r in results:
        lines.append(f"| {r['name']} | {r.get('mode', ALO)} | {r['trials']} | {r['records_expected']} | {r['lost']} | "
                     f"{r['duplicated']} | {'pass' if r['passed'] else 'FAIL'} |")
    return "\n".join(lines)


def listing() -> str:
    """Every scenario of the registry, in campaign order: number, name, delivery guarantees."""
    return "\n".join(f"{s.id}\t{s.name}\t{s.title}\t{','.join(s.modes)}" for s in SCENARIOS)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testing.chaos.run", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--list", action="store_true", help="print the scenarios and exit, running none")
    if parser.parse_args(argv).list:
        print(listing())
        return 0
    logging.basicConfig(level=logging.WARNING)
    trials = int(os.environ.get("CHAOS_TRIALS", "3"))
    rows = int(os.environ.get("CHAOS_ROWS", "40000"))
    seed = int(os.environ.get("CHAOS_SEED", str(int(time.time()))))
    only = {s.strip() for s in os.environ.get("CHAOS_ONLY", "").split(",") if s.strip()}
    modes = [m.strip() for m in os.environ.get("CHAOS_MODES", f"{ALO},{EO}").split(",") if m.strip()]
    shutil.rmtree(OUT / "work", ignore_errors=True)
    (OUT / "work").mkdir(parents=True)

    kafka = KafkaCluster(OUT / "kafka1", 1)
    kafka.wipe()
    kafka.start()
    clusters: dict[str, KafkaCluster] = {}
    sessions: dict[str, Any] = {}

    def kafka3() -> KafkaCluster:
        if "three" not in clusters:
            KafkaCluster(OUT / "kafka3", 3).wipe()
            clusters["three"] = KafkaCluster(OUT / "kafka3", 3).start()
        return clusters["three"]

    def spark() -> Any:
        if "spark" not in sessions:
            from recoverable_sink import RecoverableKafkaDataSource

            s = local_spark("recoverable-kafka-chaos", **{"spark.sql.execution.arrow.maxRecordsPerBatch": "2000"})
            s.dataSource.register(RecoverableKafkaDataSource)
            sessions["spark"] = s
        return sessions["spark"]

    results = []
    try:
        for mode in modes:
            lab = Lab(OUT / "work", kafka, kafka3, spark, guarantee=mode)
            for scenario in SCENARIOS:
                if (only and not only & {scenario.id, scenario.name}) or mode not in scenario.modes:
                    continue
                name = scenario.title
                runs = []
                for i in range(trials):
                    rng = random.Random(f"{seed}-{name}-{i}")
                    started = time.monotonic()
                    trial = scenario.run(lab, rng, rows)
                    trial.notes["seconds"] = round(time.monotonic() - started, 1)
                    if mode == EO and trial.duplicated:
                        trial.passed = False
                    runs.append(trial)
                    print(f"{name} [{mode}] trial {i + 1}/{trials}: lost={trial.lost} "
                          f"duplicated={trial.duplicated} {'pass' if trial.passed else 'FAIL'} {trial.notes} "
                          f"errors={trial.errors}", flush=True)
                results.append({**aggregate(scenario, mode, runs), "seed": seed, "rows": rows})
                (OUT / "results.json").write_text(json.dumps({"scenarios": merged(results, bool(only))}, indent=1))
    finally:
        if "spark" in sessions:
            sessions["spark"].stop()
        for cluster in [kafka, *clusters.values()]:
            cluster.stop()
    print()
    print(table(json.loads((OUT / "results.json").read_text())["scenarios"] if results else results))
    print(f"\nseed {seed}; results in {OUT / 'results.json'}")
    return 0 if all(r["passed"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
