"""notebooks/quickstart.ipynb runs top to bottom (nbclient, a python3 kernel on this interpreter) against the
session's broker and asserts that every record it wrote came back."""

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
    monkeypatch.setenv("QUICKSTART_WAL", str(tmp_path / "wal"))
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = NotebookClient(nb, kernel_name=venv_kernel, timeout=300,
                            resources={"metadata": {"path": str(NOTEBOOK.parent)}})
    client.execute()  # raises CellExecutionError, with the cell's traceback, if any cell fails

    outputs = "".join(o.get("text", "") for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs)
    assert kafka.bootstrap_servers in outputs
    assert "written 1000, found 1000" in outputs
    assert outputs.rstrip().endswith("OK")
