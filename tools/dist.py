"""``make dist``: the release artifacts in build/dist/: an sdist (builds wherever there is a C compiler), manylinux2014
stable-ABI wheels for x86_64 and aarch64 (one wheel per architecture serves every Python from 3.10; pip installs it
with no compiler), and the zip for ``spark-submit --py-files`` (the sink's pure-Python sources).

The wheels are built from the sdist, cross-compiled by zig (PyPI's ``ziglang``) against glibc 2.17, checked by
``abi3audit`` (the stable-ABI claim) and ``auditwheel show`` (manylinux2014), then given that platform tag; the
build tools are installed into this virtualenv on first use (``make dist`` makes one of its own, build/dist-venv,
holding only them: no JDK, Maven, jars or test packages are needed to build a wheel).

    python -m tools.dist [--out build/dist] [--arch x86_64 --arch aarch64]   # prints the artifact paths
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SRC = REPO
ARCHES = ("x86_64", "aarch64")
GLIBC = "2.17"  # manylinux2014's glibc: every Linux from CentOS 7 on
LIMITED_API = "cp310"  # the Py_LIMITED_API the C sources declare (0x030A0000), and requires-python's floor
NATIVE = ("recoverable_sink/_digests.abi3.so", "recoverable_sink/_produce.abi3.so")
ELF_MACHINE = {"x86_64": 62, "aarch64": 183}  # e_machine of each architecture's ELF header
# Installed on demand, not with the test extra, so that `make test`'s set-up stays lean.
TOOLS = {"build": "build>=1.2", "ziglang": "ziglang>=0.13,<0.18", "auditwheel": "auditwheel>=6.1",
         "abi3audit": "abi3audit>=0.0.20", "wheel": "wheel>=0.40"}


@dataclass(frozen=True)
class Wheel:
    path: Path
    arch: str
    audit: str  # auditwheel show's report


def version() -> str:
    """The project's version, from pyproject.toml: make dist needs the sink neither installed nor importable."""
    import tomllib

    return str(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"])


def ensure_tools() -> None:
    """pip-installs into this interpreter's environment the build tools it lacks. Asked by distribution, not by
    module: run from the repository, ``import build`` would find the build/ directory."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    def lacks(name: str) -> bool:
        try:
            installed(name)
        except PackageNotFoundError:
            return True
        return False

    missing = [spec for name, spec in TOOLS.items() if lacks(name)]
    if missing:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", *missing], check=True)


def _build_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of ``python -m build``, without the two warnings a clean build otherwise prints per
    backend call: setuptools' note that ``[tool.setuptools.ext-modules]`` is experimental (this project uses it
    on purpose, see pyproject.toml), and, under PYTHONDONTWRITEBYTECODE, build_py's and install_lib's "byte-compiling
    is disabled" (a wheel holds no bytecode either way). Any other warning still shows."""
    env = dict(os.environ if base is None else base)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    quiet = "ignore:`[tool.setuptools.ext-modules]` in `pyproject.toml` is still *experimental*"
    env["PYTHONWARNINGS"] = ",".join(w for w in (env.get("PYTHONWARNINGS"), quiet) if w)
    return env


def build_sdist(out: Path) -> Path:
    """The sdist, by PEP 517 in an isolated environment with the setuptools pyproject.toml asks for."""
    ensure_tools()
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("recoverable_sink-*.tar.gz"):
        old.unlink()
    subprocess.run([sys.executable, "-m", "build", "--sdist", "--outdir", str(out), str(REPO)], check=True,
                   stdout=subprocess.DEVNULL, env=_build_env())
    (sdist,) = out.glob("recoverable_sink-*.tar.gz")
    return sdist


def _zig_env(arch: str) -> dict[str, str]:
    """setuptools compiles and links with these in place of the host's gcc (and its rpath-laden LDSHARED)."""
    zig = f"{shlex.quote(sys.executable)} -m ziglang cc -target {arch}-linux-gnu.{GLIBC}"
    # CFLAGS replaces the build Python's (which may hold host-only flags such as -march) by CPython's portable
    # release flags; -s keeps debug symbols out of a released .so.
    return os.environ | {"CC": zig, "LDSHARED": f"{zig} -shared -s", "CFLAGS": "-DNDEBUG -fwrapv -O2 -Wall",
                         "LDFLAGS": "", "CPPFLAGS": ""}


def check_wheel(wheel: Path, arch: str) -> None:
    """Fails unless the wheel holds both extensions, built for ``arch`` (they are optional in a source install,
    where setuptools only warns when one does not compile; a released wheel without them is wrong)."""
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        absent = [n for n in NATIVE if n not in names]
        if absent:
            raise SystemExit(f"{wheel.name} lacks {absent}: an extension failed to compile (see the build log)")
        for name in NATIVE:
            header = z.read(name)[:20]
            machine = int.from_bytes(header[18:20], "little")
            if header[:4] != b"\x7fELF" or machine != ELF_MACHINE[arch]:
                raise SystemExit(f"{wheel.name}: {name} is not an {arch} ELF object (e_machine {machine})")


def audit(wheel: Path, arch: str) -> str:
    """auditwheel show's report; fails unless the wheel fits manylinux2014 for ``arch``."""
    show = subprocess.run([sys.executable, "-m", "auditwheel", "show", str(wheel)], capture_output=True, text=True)
    report = " ".join(show.stdout.split())
    if show.returncode != 0 or f'"manylinux_2_17_{arch}"' not in report:
        raise SystemExit(f"auditwheel show {wheel.name}: not manylinux_2_17_{arch}\n{show.stdout}{show.stderr}")
    return show.stdout.strip()


def check_abi3(wheel: Path) -> None:
    """abi3audit: every symbol the extensions import belongs to the stable ABI of the wheel's tag (cp310)."""
    run = subprocess.run([sys.executable, "-m", "abi3audit", "--strict", "--verbose", str(wheel)],
                         capture_output=True, text=True, env=os.environ | {"COLUMNS": "120"})
    if run.returncode != 0:
        raise SystemExit(f"abi3audit {wheel.name}: not stable-ABI clean\n{run.stdout}{run.stderr}")


def build_wheel(sdist: Path, arch: str, out: Path) -> Wheel:
    """One manylinux_2_17 (manylinux2014) cp310-abi3 wheel for ``arch``, built from the sdist."""
    ensure_tools()
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob(f"recoverable_sink-*_{arch}.whl"):
        old.unlink()
    with tempfile.TemporaryDirectory(prefix=f"rk-dist-{arch}-") as tmp:
        with tarfile.open(sdist) as tar:
            tar.extractall(tmp, filter="data")
        (src,) = Path(tmp).glob("recoverable_sink-*")
        raw = Path(tmp) / "raw"
        options = f"--py-limited-api {LIMITED_API} --plat-name linux_{arch}"
        subprocess.run([sys.executable, "-m", "build", "--wheel", "--outdir", str(raw),
                        f"--config-setting=--build-option={options}", str(src)], check=True,
                       stdout=subprocess.DEVNULL, env=_build_env(_zig_env(arch)))
        (built,) = raw.glob("*.whl")
        check_wheel(built, arch)
        check_abi3(built)
        audit(built, arch)
        # The tag that show confirmed, set by `wheel tags`: auditwheel repair would graft nothing (the extensions
        # link only libc and open librdkafka at run time) and runs only for the host's architecture.
        tags = subprocess.run([sys.executable, "-m", "wheel", "tags", "--remove", "--platform-tag",
                               f"manylinux_2_17_{arch}.manylinux2014_{arch}", str(built)],
                              check=True, capture_output=True, text=True)
        wheel = out / tags.stdout.split()[-1]
        shutil.move(raw / wheel.name, wheel)
    check_wheel(wheel, arch)
    return Wheel(wheel, arch, audit(wheel, arch))


def build_pyfiles_zip(out: Path) -> Path:
    """recoverable_sink/**/*.py and pyspark_recoverable_kafka.py at the zip's root, as --py-files wants them."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"recoverable_sink-{version()}-py-files.zip"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for f in sorted((SRC / "recoverable_sink").rglob("*.py")):
            z.write(f, f.relative_to(SRC).as_posix())
        z.write(SRC / "pyspark_recoverable_kafka.py", "pyspark_recoverable_kafka.py")
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=REPO / "build" / "dist")
    p.add_argument("--arch", action="append", choices=ARCHES, help="repeatable; default: every architecture")
    args = p.parse_args(argv)
    sdist = build_sdist(args.out)
    wheels = [build_wheel(sdist, arch, args.out) for arch in args.arch or ARCHES]
    for wheel in wheels:
        sys.stderr.write(f"auditwheel show {wheel.path.name}:\n{wheel.audit}\n")
    paths = [sdist, *(w.path for w in wheels), build_pyfiles_zip(args.out)]
    sys.stdout.write("".join(f"{path}\n" for path in paths))
    return 0


if __name__ == "__main__":
    sys.exit(main())
