"""``make dist``: the wheel (for ``pip install`` on every node, or a Spark Connect server) and the zip for
``spark-submit --py-files`` (the sink's pure-Python sources; its dependencies must be installed on the nodes).

    python -m tools.dist [--out build/dist]      # prints the two paths, one per line
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SRC = REPO


def version() -> str:
    from importlib.metadata import version as installed

    return installed("recoverable-sink")  # make dist runs in the project's virtualenv, where it is installed


def build_wheel(out: Path) -> Path:
    """The wheel (pip builds it in an isolated environment with the setuptools pyproject.toml asks for)."""
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("recoverable_sink-*.whl"):
        old.unlink()
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out),
                    str(REPO)], check=True)
    (wheel,) = out.glob("recoverable_sink-*.whl")
    return wheel


def build_pyfiles_zip(out: Path) -> Path:
    """recoverable_sink/*.py and pyspark_recoverable_kafka.py at the zip's root, as --py-files wants them."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"recoverable_sink-{version()}-py-files.zip"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for f in sorted((SRC / "recoverable_sink").glob("*.py")):
            z.write(f, f"recoverable_sink/{f.name}")
        z.write(SRC / "pyspark_recoverable_kafka.py", "pyspark_recoverable_kafka.py")
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=REPO / "build" / "dist")
    args = p.parse_args(argv)
    sys.stdout.write(f"{build_wheel(args.out)}\n{build_pyfiles_zip(args.out)}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
