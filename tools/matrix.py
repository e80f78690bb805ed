"""``make matrix``: the supported Python and pyspark versions, each proven in a fresh virtualenv by a real write
and a killed-worker retry in both delivery modes, and a streaming one (tools/matrix_job.py), against one local
broker.

    make matrix                                   # every cell
    MATRIX="3.12:4.2.1" make matrix               # some cells: python:pyspark, comma-separated

Python interpreters come from pyenv (``~/.pyenv/versions/<x.y>*``) or the PATH (``pythonX.Y``); pyspark from
PyPI. Results go to build/matrix/results.json (a run of some cells replaces only theirs); exit 0 only if every
cell run held.
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
PYSPARKS = ("4.0.5", "4.1.1", "4.2.1")
DEFAULT = [f"{py}:{ps}" for py in PYTHONS for ps in PYSPARKS]


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
    subprocess.run([*pip, f"pyspark=={pyspark}", *map(str, wheels.glob("*.whl"))], check=True)
    work = OUT / f"work-py{python}-pyspark{pyspark}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PYSPARK_", "VIRTUAL_ENV"))}
    env |= {"PYSPARK_PYTHON": str(venv / "bin/python"), "PYSPARK_DRIVER_PYTHON": str(venv / "bin/python")}
    job = subprocess.run([str(venv / "bin/python"), str(REPO / "tools/matrix_job.py"), bootstrap,
                          f"matrix-{uuid.uuid4().hex[:8]}", str(work)], cwd=work, env=env, capture_output=True,
                         text=True, timeout=900)
    (work / "job.log").write_text(job.stdout + job.stderr)
    lines = [line for line in job.stdout.splitlines() if line.startswith("{")]
    result = json.loads(lines[-1]) if lines else {"ok": False, "error": job.stderr[-1500:]}
    return {"cell": f"{python}:{pyspark}", **result}


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
    return 0 if results and all(r.get("ok") for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
