"""notebooks/quickstart.ipynb runs top to bottom as it is (nbclient, a python3 kernel on this interpreter, started
outside the repository) against the session's broker: both delivery modes and a stream, every topic read back as a
read_committed consumer. The kernel gets what a user's machine would have: the broker's address
(KAFKA_BOOTSTRAP) and the WAL directory the sink reads from RECOVERABLE_KAFKA_WAL_PATH; no connector, no jars."""

from __future__ import annotations

import json
import sys

import nbformat
import pytest
from nbclient import NotebookClient

from testing.kafka_local import REPO, KafkaCluster

NOTEBOOK = REPO / "notebooks" / "quickstart.ipynb"


@pytest.fixture
def venv_kernel(tmp_path, monkeypatch) -> str:
    """A ``python3`` kernel spec that runs this interpreter (the venv's), found first on JUPYTER_PATH, so that a
    system-wide python3 kernel cannot stand in for it."""
    spec_dir = tmp_path / "jupyter" / "kernels" / "python3"
    spec_dir.mkdir(parents=True)
    (spec_dir / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (recoverable-sink venv)",
        "language": "python",
    }))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    return "python3"


def test_quickstart_notebook_runs(kafka: KafkaCluster, venv_kernel: str, tmp_path, monkeypatch):
    monkeypatch.setenv("KAFKA_BOOTSTRAP", kafka.bootstrap_servers)
    monkeypatch.setenv("RECOVERABLE_KAFKA_WAL_PATH", str(tmp_path / "wal"))
    for name in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "PYTHONPATH"):  # the notebook sets what it needs
        monkeypatch.delenv(name, raising=False)
    work = tmp_path / "work"  # not the repository: the notebook must not need a checkout
    work.mkdir()
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = NotebookClient(nb, kernel_name=venv_kernel, timeout=300, resources={"metadata": {"path": str(work)}})
    client.execute()  # raises CellExecutionError, with the cell's traceback, if any cell fails

    outputs = "".join(o.get("text", "") for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs)
    assert kafka.bootstrap_servers in outputs
    for name in ("at_least_once", "exactly_once", "stream"):
        assert f"{name}: written 1000, found 1000, distinct 1000" in outputs, outputs
    assert "stream: 1000 rows in" in outputs
    assert outputs.rstrip().endswith("OK")
