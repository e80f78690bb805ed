"""``make matrix``: the supported Python and pyspark versions, each proven in a fresh virtualenv (tools/matrix_job.py)
against one local broker, every record counted by an independent read_committed consumer:

- the sink's own cells: a real write in both delivery modes and a stream, each with its first attempts' Python
  workers killed mid-partition and retried; they never need Spark's Kafka connector;
- Spark's Kafka connector beside it: the exactly_once topic read back through ``format("kafka")`` (read_committed,
  and the connector's default, read_uncommitted), and the same DataFrame written by ``format("kafka")``. Where
  Maven Central here serves no connector at the pyspark version, the nearest one it serves is used (CONNECTORS);
  if that one does not load, these cells are skipped with the reason printed;
- from pyspark 4.2 on, a Spark Connect client writing through a Connect server of the same version.

pyspark is installed first and the sink's wheel after it, as into a user's environment: a cell fails if that
install replaced the pyspark. pandas is whatever pip resolves for the sink (3.x where Python >= 3.11).

    make matrix                                   # every cell
    MATRIX="3.12:4.2.1" make matrix               # some cells: python:pyspark, comma-separated

Python interpreters come from pyenv (``~/.pyenv/versions/<x.y>*``) or the PATH (``pythonX.Y``); pyspark from
PyPI. Results go to build/matrix/results.json (a run of some cells replaces only theirs) and a table is printed;
exit 0 only if every cell run held.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

from testing.kafka_local import REPO, KafkaCluster

OUT = REPO / "build" / "matrix"
PYTHONS = ("3.10", "3.11", "3.12", "3.13")
PYSPARKS = ("4.0.5", "4.1.1", "4.2.1", "4.3.0")
# The oldest Python each pyspark installs on (its Requires-Python), where it is newer than the oldest above.
MIN_PYTHON = {"4.3.0": "3.11"}
DEFAULT = [f"{py}:{ps}" for ps in PYSPARKS for py in PYTHONS
           if tuple(map(int, py.split("."))) >= tuple(map(int, MIN_PYTHON.get(ps, "3.10").split(".")))]
# Spark's Kafka connector (spark-sql-kafka-0-10_2.13) for each pyspark: the same version where Maven Central here
# serves it, else the nearest it serves (it serves no 4.0.5, 4.2.1 or 4.3.0). A version not listed: its own.
CONNECTORS = {"4.0.5": "4.0.4", "4.2.1": "4.2.0", "4.3.0": "4.2.0"}
CONNECT_FROM = (4, 2)  # cells from this pyspark on also write from a Spark Connect client


def interpreter(version: str) -> str:
    for candidate in sorted(Path.home().glob(f".pyenv/versions/{version}.*/bin/python{version}")):
        return str(candidate)
    found = shutil.which(f"python{version}")
    if found is None:
        raise SystemExit(f"no Python {version}: install it (pyenv install {version}) or put python{version} on PATH")
    return found


def source_copy() -> Path:
    """The working tree without build outputs, to build the wheels from: setuptools stages a wheel in the tree's
    build/, where an extension built earlier under another name (before the stable ABI: _produce.cpython-3XX-...so)
    would ride along into the wheel and be imported ahead of the fresh one."""
    src = OUT / "src"
    shutil.rmtree(src, ignore_errors=True)
    shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(".git", ".venv", "build", "*.egg-info", "__pycache__",
                                                             "*.so", ".pytest_cache", ".ruff_cache"))
    return src


def connector(pyspark: str) -> tuple[str, list[Path] | str]:
    """The connector version for ``pyspark`` and its jars (resolved by Maven with jars/spark-kafka-pom.xml, once per
    version), or the reason there are none."""
    wanted = CONNECTORS.get(pyspark, pyspark)
    out = OUT / f"connector-{wanted}"
    if not any(out.glob("spark-sql-kafka-*.jar")):
        shutil.rmtree(out, ignore_errors=True)
        mvn = subprocess.run(["mvn", "-q", "-B", "-f", str(REPO / "jars/spark-kafka-pom.xml"), "package",
                              f"-Dspark.version={wanted}", f"-Dout.dir={out}"], capture_output=True, text=True)
        if mvn.returncode != 0:
            return wanted, f"Maven could not resolve spark-sql-kafka-0-10_2.13:{wanted}: {mvn.stdout[-300:]}"
    return wanted, sorted(out.glob("*.jar"))


def cell(python: str, pyspark: str, bootstrap: str, src: Path) -> dict[str, object]:
    venv = OUT / f"py{python}-pyspark{pyspark}"
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([interpreter(python), "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin/python"), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, "--upgrade", "pip"], check=True)
    # The package from a wheel built by that Python (its C extensions included), as a user installs it.
    wheels = OUT / f"wheels-py{python}"
    shutil.rmtree(wheels, ignore_errors=True)
    subprocess.run([str(venv / "bin/python"), "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels), str(src)],
                   check=True)
    connect = tuple(map(int, pyspark.split(".")[:2])) >= CONNECT_FROM
    # PyPI serves pyspark as an sdist, whose (pure-Python) wheel pip would build once per Python: built once here.
    spark_wheels = OUT / "pyspark-wheels"
    if not any(spark_wheels.glob(f"pyspark-{pyspark}-*.whl")):
        subprocess.run([str(venv / "bin/python"), "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(spark_wheels),
                        f"pyspark=={pyspark}"], check=True)
    # pyspark first (with the Connect client's dependencies where the cell uses it), the sink after it, each by
    # pip on its own: the sink's install must leave the user's pyspark as it found it (the job reports it).
    subprocess.run([*pip, "--find-links", str(spark_wheels),
                    f"pyspark[connect]=={pyspark}" if connect else f"pyspark=={pyspark}"], check=True)
    subprocess.run([*pip, *map(str, wheels.glob("*.whl"))], check=True)
    work = OUT / f"work-py{python}-pyspark{pyspark}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PYSPARK_", "VIRTUAL_ENV", "RK_"))}
    env |= {"PYSPARK_PYTHON": str(venv / "bin/python"), "PYSPARK_DRIVER_PYTHON": str(venv / "bin/python")}
    version, jars = connector(pyspark)
    if isinstance(jars, str):
        env["RK_MATRIX_NO_CONNECTOR"] = jars
    else:
        env |= {"RK_MATRIX_CONNECTOR": version, "RK_MATRIX_CONNECTOR_JARS": ",".join(map(str, jars))}
    if connect:
        env["RK_MATRIX_CONNECT"] = "1"
    job = subprocess.run([str(venv / "bin/python"), str(REPO / "tools/matrix_job.py"), bootstrap,
                          f"matrix-{uuid.uuid4().hex[:8]}", str(work)], cwd=work, env=env, capture_output=True,
                         text=True, timeout=1500)
    (work / "job.log").write_text(job.stdout + job.stderr)
    lines = [line for line in job.stdout.splitlines() if line.startswith("{")]
    result = json.loads(lines[-1]) if lines else {"ok": False, "error": job.stderr[-1500:]}
    if result.get("pyspark") not in (None, pyspark):
        result |= {"ok": False, "error": f"installing the sink replaced pyspark {pyspark} by {result['pyspark']}"}
    return {"cell": f"{python}:{pyspark}", **result}


def _mode(result: object) -> str:
    if not isinstance(result, dict):
        return "-"
    if "skipped" in result or "error" in result:
        return "skipped" if "skipped" in result else "FAILED"
    return f"retried {result.get('retried_partitions')}, lost {result.get('lost')}, dup {result.get('duplicated')}"


def table(results: list[dict[str, object]]) -> str:
    """One line per cell: versions, then each check's counts (lost and duplicated records), then held or not."""
    head = ("cell", "pandas", "at_least_once", "exactly_once", "stream", "format(kafka) connector", "connect", "held")
    rows = [head]
    for r in results:
        source = r.get("kafka_source")
        if not isinstance(source, dict):
            kafka = "-"
        elif "skipped" in source or "error" in source:
            kafka = f"{'skipped' if 'skipped' in source else 'FAILED'} ({source.get('connector', '?')})"
        else:
            kafka = (f"{source['connector']}: read_committed {source['read_committed']}/{source['expected']}, "
                     f"uncommitted {source['read_uncommitted']}, format(kafka) wrote {source['format_kafka']}")
        rows.append((str(r["cell"]), str(r.get("pandas", "?")), _mode(r.get("at_least_once")),
                     _mode(r.get("exactly_once")), _mode(r.get("stream")), kafka, _mode(r.get("connect")),
                     "yes" if r.get("ok") else f"NO {str(r.get('error', ''))[:200]}"))
    return "\n".join(" | ".join(row) for row in rows) + "\n"


def main() -> int:
    cells = [c.strip() for c in os.environ.get("MATRIX", "").split(",") if c.strip()] or DEFAULT
    OUT.mkdir(parents=True, exist_ok=True)
    src = source_copy()
    cluster = KafkaCluster(OUT / "kafka", 1)
    cluster.wipe()
    cluster.start()
    results = []
    try:
        for spec in cells:
            python, pyspark = spec.split(":")
            result = cell(python, pyspark, cluster.bootstrap_servers, src)
            results.append(result)
            sys.stdout.write(json.dumps(result) + "\n")
            sys.stdout.flush()
    finally:
        cluster.stop()
    # A run of some cells replaces their entries in the last results and keeps the others.
    path = OUT / "results.json"
    earlier = json.loads(path.read_text()) if path.exists() else []
    ran = {r["cell"] for r in results}
    merged = sorted([r for r in earlier if r.get("cell") not in ran] + results, key=lambda r: str(r["cell"]))
    path.write_text(json.dumps(merged, indent=2) + "\n")
    sys.stdout.write(table(results))
    for r in results:  # the reasons a connector cell was skipped
        source = r.get("kafka_source")
        if isinstance(source, dict) and "skipped" in source:
            sys.stdout.write(f"{r['cell']}: format(kafka) cells skipped: {source['skipped']}\n")
    return 0 if results and all(r.get("ok") for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
