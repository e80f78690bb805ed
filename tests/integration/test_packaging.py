"""Shipping the sink as ``make dist`` builds it: spark-submit with no register call (auto-registration
through the pyspark_recoverable_kafka module), from the --py-files zip (pure Python: record digests by hashlib,
confluent-kafka's produce()) and from the x86_64 manylinux abi3 wheel installed, with no compiler, in a fresh
virtualenv of another Python outside the repository (with the C digest and produce extensions) that already holds
pyspark 4.3, which the install keeps, and which runs the README's Quickstart as pasted against the broker
`make kafka-up` starts; the same install keeps a pyspark 4.0; the aarch64 wheel is checked by auditwheel, and the
sdist built by the host's C compiler."""

import json
import os
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from testing.kafka_check import read_topic
from testing.kafka_local import REPO, free_port
from tools.dist import ARCHES, NATIVE, Wheel, audit, build_pyfiles_zip, build_sdist, build_wheel, ensure_tools
from tools.matrix import interpreter

APP = '''
import json, sys
from pyspark.sql import SparkSession
spark = SparkSession.builder.getOrCreate()
spark.sparkContext.setLogLevel("ERROR")

def origin(_):
    import recoverable_sink
    from recoverable_sink import identity
    from recoverable_sink.producer import native as native_producer
    yield (recoverable_sink.__file__, identity._native is not None, native_producer.native_module() is not None,
           "%d.%d" % sys.version_info[:2])

(file, native, producer, python), = spark.sparkContext.parallelize([0], 1).mapPartitions(origin).collect()
bootstrap, topic, wal, out = sys.argv[1:5]
# No spark.dataSource.register(...): Spark finds the format through pyspark_recoverable_kafka.DefaultSource.
(spark.range(500).selectExpr("CAST(id AS STRING) AS value").write.format("recoverable_kafka")
    .option("kafka.bootstrap.servers", bootstrap).option("topic", topic).option("wal.path", wal)
    .mode("append").save())
open(out, "w").write(json.dumps({"task_import": file, "native_digests": native, "native_producer": producer,
                                 "task_python": python}))
spark.stop()
'''


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, Wheel]]]:
    """make dist's sdist and wheels, built once for the module (the build tools are installed if missing)."""
    ensure_tools()
    out = tmp_path_factory.mktemp("dist")
    sdist = build_sdist(out)
    yield sdist, {arch: build_wheel(sdist, arch, out) for arch in ARCHES}


def other_python() -> str:
    """A supported Python other than the one that built the wheels (the abi3 tag's claim); this one if none."""
    this = f"{sys.version_info.major}.{sys.version_info.minor}"
    for version in ("3.12", "3.13", "3.10", "3.11"):
        if version != this:
            try:
                return interpreter(version)
            except SystemExit:
                continue
    return sys.executable


# The pyspark a user already has, installed before the sink: the newest (which the repository's own suite, tied to
# Spark's Kafka connector 4.2, does not run on) and the oldest supported.
NEWEST_PYSPARK, OLDEST_PYSPARK = "4.3.0", "4.0.5"


def installed(python: Path, *names: str) -> dict[str, str]:
    code = "import sys; from importlib.metadata import version; print(' '.join(version(n) for n in sys.argv[1:]))"
    out = subprocess.run([str(python), "-c", code, *names], capture_output=True, text=True, check=True).stdout
    return dict(zip(names, out.split(), strict=True))


def user_venv(python: str, venv: Path, pyspark: str) -> dict[str, str]:
    """A fresh virtualenv of ``python`` holding ``pyspark`` (installed by pip on its own, as a user's Spark is), and
    the environment of a user's shell for it: nothing of the repository's (no PYTHONPATH: pip would take a path
    entry holding the sources for an installed copy and skip the wheel), the PYSPARK_* variables at the venv."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PYSPARK_", "VIRTUAL_ENV"))}
    env |= {"PYSPARK_PYTHON": str(venv / "bin/python"), "PYSPARK_DRIVER_PYTHON": str(venv / "bin/python")}
    subprocess.run([python, "-m", "venv", str(venv)], check=True, timeout=120, env=env)
    spark = subprocess.run([str(venv / "bin/pip"), "install", "-q", f"pyspark=={pyspark}"], timeout=900, env=env,
                           capture_output=True, text=True)
    assert spark.returncode == 0, spark.stderr[-3000:]
    return env


def install_wheel(venv: Path, wheel: Path, env: dict[str, str]) -> None:
    """pip install of the wheel alone (its dependencies resolved by pip, from its cache when warm). No compiler for
    the sink: pip may only take it as a binary, and a compiler it would call does not exist."""
    install = subprocess.run([str(venv / "bin/pip"), "install", "-q", "--only-binary", "recoverable-sink", str(wheel)],
                             timeout=900, env=env | {"CC": "/nonexistent/cc"}, capture_output=True, text=True)
    assert install.returncode == 0, install.stderr[-3000:]


def submit(spark_submit: Path, python: Path, tmp_path: Path, kafka, topic: str, *extra: str,
           env: dict[str, str] | None = None) -> dict[str, str]:
    (tmp_path / "app.py").write_text(APP)
    out = tmp_path / "out.json"
    run = subprocess.run(
        [str(spark_submit), "--master", "local[2]", *extra,
         "--conf", f"spark.pyspark.python={python}", "--conf", "spark.ui.enabled=false",
         "--conf", f"spark.driver.extraJavaOptions=-Dlog4j2.configurationFile={REPO / 'spark_conf/log4j2.properties'}",
         str(tmp_path / "app.py"), kafka.bootstrap_servers, topic, str(tmp_path / "wal"), str(out)],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    assert len(read_topic(kafka.bootstrap_servers, topic, 60, expected=500)) == 500
    return json.loads(out.read_text())


def test_spark_submit_with_py_files_and_no_register_call(kafka, new_topic, tmp_path):
    bundle = build_pyfiles_zip(tmp_path / "dist")
    out = submit(Path(sys.executable).parent / "spark-submit", Path(sys.executable), tmp_path, kafka, new_topic(),
                 "--py-files", str(bundle))
    assert ".zip" in out["task_import"]
    assert out["native_digests"] is False  # the zip holds no C extension: hashlib's digests delivered every record
    assert out["native_producer"] is False  # and confluent-kafka's produce() sent every record


def readme_quickstart(bootstrap: str, checkpoint: Path) -> str:
    """The README's Quickstart code as a user pastes it (the first python block of its Quickstart section), aimed at
    ``bootstrap`` instead of 127.0.0.1:9092 and with its checkpoint under ``checkpoint``."""
    readme = (REPO / "README.md").read_text()
    section = readme.split("\n## Quickstart\n", 1)[1].split("\n## ", 1)[0]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    assert "127.0.0.1:9092" in code and "/tmp/events-checkpoint" in code
    return code.replace("127.0.0.1:9092", bootstrap).replace("/tmp/events-checkpoint", str(checkpoint))


@pytest.fixture
def kafka_up(tmp_path: Path) -> Iterator[str]:
    """The broker the README tells a user to start: `make kafka-up`, on a free port chosen as the README says
    (KAFKA_PORT), its data in a directory of the test's own; `make kafka-down` afterwards."""
    env = {**os.environ, "KAFKA_PORT": str(free_port()), "KAFKA_LOCAL_DIR": str(tmp_path / "kafka-up")}
    up = subprocess.run(["make", "-C", str(REPO), "kafka-up"], env=env, capture_output=True, text=True, timeout=300)
    try:
        assert up.returncode == 0, up.stdout[-2000:] + up.stderr[-3000:]
        said = up.stdout + up.stderr
        bootstrap = f"127.0.0.1:{env['KAFKA_PORT']}"
        # It says which broker it started and how to choose another port.
        assert f"Kafka up on {bootstrap} with Apache Kafka's default settings" in said and "KAFKA_PORT=" in said, said
        yield bootstrap
    finally:
        subprocess.run(["make", "-C", str(REPO), "kafka-down"], env=env, capture_output=True, timeout=120)


def test_the_wheel_in_a_fresh_virtualenv_outside_the_repo_registers_the_format(dist, kafka, kafka_up, new_topic,
                                                                               tmp_path):
    """pip install of the x86_64 manylinux abi3 wheel alone, into another Python than the one that built it, that
    already holds pyspark 4.3, keeps that pyspark (the sink caps none of its dependencies) and is enough:
    spark-submit finds format("recoverable_kafka"), and the tasks import the sink, with its C extensions, from that
    virtualenv, on pyspark 4.3 and the pandas pip resolved (3.x)."""
    wheel = dist[1]["x86_64"].path
    assert "-cp310-abi3-" in wheel.name and wheel.name.endswith("manylinux_2_17_x86_64.whl"), wheel.name
    python = other_python()
    version = subprocess.run([python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    # pyspark 4.3 installs on Python 3.11 and newer; on 3.10 the user's Spark is the oldest supported.
    pyspark = NEWEST_PYSPARK if tuple(map(int, version.split("."))) >= (3, 11) else OLDEST_PYSPARK
    venv = tmp_path / "venv"
    env = user_venv(python, venv, pyspark)
    install_wheel(venv, wheel, env)
    versions = installed(venv / "bin/python", "pyspark", "pandas", "recoverable-sink")
    assert versions["pyspark"] == pyspark, versions
    if pyspark == NEWEST_PYSPARK:
        assert int(versions["pandas"].split(".")[0]) >= 3, versions  # pandas 3 is not capped away either
    out = submit(venv / "bin/spark-submit", venv / "bin/python", tmp_path, kafka, new_topic(), env=env)
    assert out["task_import"].startswith(str(venv / "lib")), out
    assert out["task_python"] == version, out
    assert out["native_digests"] is True  # the wheel carries the digest extension
    assert out["native_producer"] is True  # and the produce loop, on confluent-kafka's own librdkafka
    cli = subprocess.run([str(venv / "bin/recoverable-kafka-wal"), "list", "--path", str(tmp_path / "wal"), "--json"],
                         capture_output=True, text=True, timeout=60, env=env)
    assert cli.returncode == 0, cli.stderr
    # The README's Quickstart, as pasted, by that Python outside the repository (no PYSPARK_* set: it sets its own),
    # on the broker `make kafka-up` starts (Kafka's default settings), where its topic does not exist yet.
    (tmp_path / "quickstart.py").write_text(readme_quickstart(kafka_up, tmp_path / "checkpoint"))
    pasted = subprocess.run([str(venv / "bin/python"), "quickstart.py"], cwd=tmp_path, capture_output=True, text=True,
                            timeout=600, env={k: v for k, v in env.items() if not k.startswith("PYSPARK_")})
    assert pasted.returncode == 0, pasted.stderr[-4000:]
    read_back = [line for line in pasted.stdout.splitlines() if line.endswith("records read back")]
    assert read_back and int(read_back[-1].split()[0]) >= 2000, pasted.stdout[-2000:]


def test_the_wheel_installed_beside_pyspark_4_0_keeps_it(dist, tmp_path):
    """No broker: into a virtualenv (this Python) that already holds the oldest supported pyspark, the wheel
    installs without replacing it."""
    venv = tmp_path / "venv"
    env = user_venv(sys.executable, venv, OLDEST_PYSPARK)
    install_wheel(venv, dist[1]["x86_64"].path, env)
    assert installed(venv / "bin/python", "pyspark")["pyspark"] == OLDEST_PYSPARK


def test_the_aarch64_wheel_is_manylinux2014_abi3_for_aarch64(dist):
    """No broker: auditwheel finds the cross-compiled wheel consistent with manylinux_2_17_aarch64, and both
    extensions are in it (build_wheel also checked that they are aarch64 ELF objects)."""
    wheel = dist[1]["aarch64"]
    assert wheel.path.name.endswith("-cp310-abi3-manylinux2014_aarch64.manylinux_2_17_aarch64.whl"), wheel.path
    assert '"manylinux_2_17_aarch64"' in " ".join(audit(wheel.path, "aarch64").split())
    with zipfile.ZipFile(wheel.path) as z:
        assert set(NATIVE) <= set(z.namelist())
        assert any(name.endswith(".dist-info/WHEEL") and b"Tag: cp310-abi3-manylinux_2_17_aarch64" in z.read(name)
                   for name in z.namelist())


def test_the_sdist_builds_with_the_host_c_compiler(dist, tmp_path):
    """No broker: the sdist alone (headers included) builds a wheel with both extensions where there is a C compiler."""
    sdist = dist[0]
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path), str(sdist)],
                   check=True, capture_output=True, timeout=600)
    (wheel,) = tmp_path.glob("recoverable_sink-*.whl")
    with zipfile.ZipFile(wheel) as z:
        assert set(NATIVE) <= set(z.namelist()), z.namelist()
