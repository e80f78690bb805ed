"""The type stubs of the C extensions (recoverable_sink/_produce.pyi, _digests.pyi) name exactly what the built
modules define: every function, class and method, with the same positional and keyword parameters where the C side
declares its signature."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[3] / "recoverable_sink"


def _stub(name: str) -> dict[str, set[str] | None]:
    """Top-level names of a stub, each with its methods (None for a function); Protocols are the stub's own."""
    tree = ast.parse((PACKAGE / f"{name}.pyi").read_text())
    found: dict[str, set[str] | None] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            found[node.name] = None
        elif isinstance(node, ast.ClassDef) and not any(getattr(b, "id", "") == "Protocol" for b in node.bases):
            found[node.name] = {n.name for n in node.body if isinstance(n, ast.FunctionDef)
                                and (not n.name.startswith("_") or n.name in ("__init__", "__len__"))}
    return found


def _runtime(module: object) -> dict[str, set[str] | None]:
    found: dict[str, set[str] | None] = {}
    for name in dir(module):
        if name.startswith("_"):
            continue
        value = getattr(module, name)
        if isinstance(value, type):
            found[name] = {m for m in vars(value) if not m.startswith("_")} | {"__init__"} | \
                ({"__len__"} if "__len__" in vars(value) else set())
        elif callable(value):
            found[name] = None
    return found


@pytest.mark.parametrize("name", ["_produce", "_digests"])
def test_the_stub_names_what_the_built_extension_defines(name):
    try:
        module = importlib.import_module(f"recoverable_sink.{name}")
    except ImportError:
        pytest.skip(f"recoverable_sink.{name} is not built here")
    assert _stub(name) == _runtime(module)
