"""The sink's runtime dependencies carry floors only: installing it must leave the pyspark (or pandas) a user has in
place. A ceiling is allowed only for a measured break, listed in MEASURED_CAPS with that break; the test
harness's own constraints (the Kafka connector's version) belong to the test extra."""

import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

if sys.version_info < (3, 11):
    pytest.skip("tomllib", allow_module_level=True)
import tomllib

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"
CEILINGS = {"<", "<=", "==", "===", "~="}
# name -> the measured incompatibility that justifies its ceiling (none today).
MEASURED_CAPS: dict[str, str] = {}


def project() -> dict:
    return tomllib.loads(PYPROJECT.read_text())["project"]


def test_no_runtime_dependency_has_a_ceiling_without_a_measured_reason():
    capped = {}
    for line in project()["dependencies"]:
        req = Requirement(line)
        ops = {spec.operator for spec in req.specifier}
        if ops & CEILINGS and req.name not in MEASURED_CAPS:
            capped[req.name] = str(req.specifier)
    assert not capped, f"runtime dependencies capped without a measured break: {capped}"


def test_pyspark_and_pandas_accept_the_current_releases():
    deps = {Requirement(line).name: Requirement(line).specifier for line in project()["dependencies"]}
    for name, versions in {"pyspark": ("4.0.5", "4.2.1", "4.3.0"), "pandas": ("2.2.3", "3.1.1")}.items():
        assert all(deps[name].contains(v) for v in versions), (name, deps[name])
    assert not deps["pyspark"].contains("3.5.6")  # the Python DataSource write API is Spark 4's


def test_requires_python_has_a_floor_and_no_ceiling():
    spec = project()["requires-python"]
    assert spec.startswith(">=3.10") and "<" not in spec
