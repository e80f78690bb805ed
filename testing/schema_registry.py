"""A real Schema Registry for the tests and benchmarks, started like the broker: Apicurio Registry 2.4.2 with its
Confluent-compatible API (``/apis/ccompat/v7``) and in-memory storage, on 127.0.0.1.

Maven Central holds the registry only as a Quarkus application module, so :func:`build` makes it runnable
(once, into build/registry): it installs our build-time half of one Quarkus extension the mirror lacks
(testing/registry_build/config-index-deployment), takes the registry's own application.properties and web.xml
from its jar, and packages testing/registry_build/app with quarkus-maven-plugin. About a minute and 210 MB of
Maven downloads the first time.

    .venv/bin/python -m testing.schema_registry        # build, start, register a schema, stop
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
import zipfile
from pathlib import Path

from testing.kafka_local import REPO, free_port

log = logging.getLogger(__name__)

SOURCES = REPO / "testing" / "registry_build"
OUT = REPO / "build" / "registry"
APP = "io.apicurio:apicurio-registry-app:2.4.2.Final"
CCOMPAT = "/apis/ccompat/v7"


def _mvn(*args: str, cwd: Path) -> None:
    subprocess.run(["mvn", "-q", "-B", *args], cwd=cwd, check=True)


def runner_jar() -> Path | None:
    found = sorted((OUT / "app" / "target").glob("*-runner.jar")) if (OUT / "app" / "target").exists() else []
    return found[0] if found else None


def build() -> Path:
    """The registry's runnable jar, built first if it is not there yet."""
    jar = runner_jar()
    if jar is not None:
        return jar
    shutil.rmtree(OUT, ignore_errors=True)
    OUT.mkdir(parents=True)
    shutil.copytree(SOURCES / "config-index-deployment", OUT / "config-index-deployment")
    _mvn("install", cwd=OUT / "config-index-deployment")
    shutil.copytree(SOURCES / "app", OUT / "app")
    _mvn("dependency:copy", f"-Dartifact={APP}", f"-DoutputDirectory={OUT / 'jar'}", cwd=OUT / "app")
    [app_jar] = (OUT / "jar").glob("*.jar")
    resources = OUT / "app" / "src" / "main" / "resources"
    (resources / "META-INF").mkdir(parents=True)
    with zipfile.ZipFile(app_jar) as z:
        properties = z.read("application.properties").decode()
        (resources / "META-INF" / "web.xml").write_bytes(z.read("META-INF/web.xml"))
    # The registry's beans are in its jar, which carries no index: Quarkus is told to index it.
    properties += ("\nquarkus.index-dependency.registry-app.group-id=io.apicurio\n"
                   "quarkus.index-dependency.registry-app.artifact-id=apicurio-registry-app\n")
    (resources / "application.properties").write_text(properties)
    _mvn("package", "-DskipTests", cwd=OUT / "app")
    jar = runner_jar()
    if jar is None:
        raise RuntimeError(f"the registry build made no runner jar under {OUT / 'app' / 'target'}")
    return jar


class SchemaRegistry:
    """One registry process on 127.0.0.1 (a free port unless given); ``url`` is its Confluent-compatible API."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_file = OUT / f"registry-{self.port}.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}{CCOMPAT}"

    def start(self, timeout_s: float = 120) -> SchemaRegistry:
        jar = build()
        java = shutil.which("java") or "java"
        with open(self.log_file, "wb") as out:
            self.proc = subprocess.Popen(
                [java, "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Dquarkus.http.host=127.0.0.1",
                 f"-Dquarkus.http.port={self.port}", "-jar", str(jar)],
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the schema registry exited {self.proc.returncode}: "
                                   f"{self.log_file.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health/ready", timeout=2) as r:
                    if r.status == 200:
                        return self
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.2)
        self.stop()
        raise TimeoutError(f"the schema registry did not answer within {timeout_s} s: "
                           f"{self.log_file.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None

    def request(self, method: str, path: str, body: object | None = None) -> object:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/vnd.schemaregistry.v1+json"})
        with urllib.request.urlopen(req, timeout=10) as r:
            return json.loads(r.read())


def main() -> int:
    logging.basicConfig(level=logging.INFO)
    started = time.monotonic()
    registry = SchemaRegistry().start()
    try:
        schema = {"type": "record", "name": "T", "fields": [{"name": "id", "type": "long"}]}
        answer = registry.request("POST", "/subjects/t-value/versions", {"schema": json.dumps(schema)})
        sys.stdout.write(f"registry at {registry.url} in {time.monotonic() - started:.1f} s; registered: {answer}\n")
    finally:
        registry.stop()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
