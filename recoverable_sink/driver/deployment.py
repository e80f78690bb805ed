"""Whether a Python can run the sink: the one importing it, and the one Spark starts for its workers (driver).

Spark runs a Python data source in Python processes of its own, started with ``PYSPARK_PYTHON`` (which
spark-submit sets from ``spark.pyspark.python``), else ``python3`` from the PATH. A script run from a
virtualenv that is not activated therefore has its workers run another Python, without the sink or its
dependencies, and Spark reports only that it found no data source or could not import a module; these checks
say which Python that was and what to set.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# The dependencies every part of the sink imports (pyproject's), by module name.
DEPENDENCIES = ("confluent_kafka", "lmdb", "pyarrow", "numpy")

POINT_WORKERS = ("point PYSPARK_PYTHON (in the environment, before the session starts) or spark.pyspark.python "
                 "(spark-submit) at a Python that has recoverable-sink (with --py-files: its dependencies) installed")

# The sink is looked for, not imported (its package refuses to import without its dependencies, listed anyway).
_PROBE = """
import importlib, importlib.util, sys
missing = [] if importlib.util.find_spec("recoverable_sink") else ["recoverable_sink"]
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except Exception as exc:
        missing.append(name if isinstance(exc, ModuleNotFoundError) else f"{name} ({type(exc).__name__}: {exc})")
print(", ".join(missing))
"""
_checked: dict[str, str] = {}


def missing_here() -> list[str]:
    """The dependencies this Python cannot find (without importing them)."""
    return [name for name in DEPENDENCIES if importlib.util.find_spec(name) is None]


def _local(master: str | None) -> bool:
    # local[...] and local-cluster[...] run their workers on this host, so their Python can be asked here.
    return master is not None and (master == "local" or master.startswith(("local[", "local-cluster[")))


def _probe(python: str, pythonpath: list[str]) -> str:
    """What keeps ``python``, started as Spark would start it, from running the sink; empty when nothing does."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([*pythonpath, *filter(None, [env.get("PYTHONPATH")])])
    try:
        run = subprocess.run([python, "-c", _PROBE, *DEPENDENCIES], env=env,
                             capture_output=True, text=True, timeout=120)
    except OSError as exc:
        return f"cannot be started ({exc})"
    if run.returncode != 0:
        return f"fails to start ({(run.stderr.strip().splitlines() or ['no output'])[-1]})"
    missing = run.stdout.strip()
    return f"cannot import {missing}" if missing else ""


def check_worker_python(spark: SparkSession) -> None:
    """Raise :class:`~recoverable_sink.errors.RecoverableSinkError` if the Python Spark starts for this session's
    workers cannot import the sink and its dependencies. Asked only of a local master (the workers' Python is on
    this host) and only when it is not this very interpreter; once per interpreter."""
    from recoverable_sink.errors import RecoverableSinkError

    sc = spark.sparkContext
    python = sc.pythonExec
    if not _local(sc.master) or os.path.abspath(shutil.which(python) or python) == os.path.abspath(sys.executable):
        return
    if python not in _checked:
        from pyspark import SparkFiles

        # --py-files archives, which Spark puts on its workers' path.
        shipped = [os.path.join(SparkFiles.getRootDirectory(), name) for name in sc._python_includes or []]
        _checked[python] = _probe(python, shipped)
    problem = _checked[python]
    if problem:
        found = shutil.which(python)
        where = "" if found == python else f" ({found or 'not found on the PATH'})"
        raise RecoverableSinkError(
            f"recoverable_kafka cannot run in Spark's Python workers: they start {python}{where}, the Python that "
            f"PYSPARK_PYTHON or spark.pyspark.python names (python3 when neither is set), and it {problem}. "
            f"To fix it, {POINT_WORKERS}, e.g. PYSPARK_PYTHON={sys.executable} (this driver's)")
