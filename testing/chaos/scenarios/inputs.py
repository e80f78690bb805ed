"""Fault family: the caller's mistakes and secrets: each bad input (schema, topic, partition, record size,
options, save mode) fails with its own clear message, driver-side ones before any task runs (10); SASL/SSL
secrets appear in no log line, exception or commit message, and the WAL is 0700/0600 (11).

No record count is asked of a read_committed reader here: these scenarios judge errors, logs and file modes.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable

from testing.chaos.lab import Lab, Trial, python_subprocess, short_error
from testing.spark import sink_writer

# ---- 10. Bad inputs --------------------------------------------------------------------------------------

def bad_inputs(lab: Lab, rng: random.Random, n: int) -> Trial:
    """Each bad input fails with its own clear message; driver-side ones before any task runs."""
    spark, bs = lab.spark, lab.kafka.bootstrap_servers
    d = lab.dir("bad-inputs")
    topic2 = lab.topic(2)
    long_value = "repeat('x', 20000)"
    cases: list[tuple[str, Callable[[], object], str]] = []

    def case(name: str, select: list[str], match: str, topic: str | None = topic2, mode: str = "append",
             bootstrap: str = bs, **options: str) -> None:
        def run() -> object:
            df = spark.range(5, numPartitions=1).selectExpr(*select)
            return sink_writer(df, bootstrap, topic, d / name, **{"delivery.guarantee": lab.guarantee, **options}) \
                .mode(mode).save()
        cases.append((name, run, match))

    value = "CAST(id AS STRING) AS value"
    case("no value column", ["CAST(id AS STRING) AS key"], "needs a value column")
    case("value of wrong type", ["id AS value"], "column value has type bigint")
    case("key of wrong type", ["id AS key", value], "column key has type bigint")
    case("headers of wrong shape", [value, "array('h') AS headers"], "column headers has type array<string>")
    case("null topic in a row", [value, "CASE WHEN id = 3 THEN NULL ELSE 'x' END AS topic"], "record 3: topic is null",
         topic=None)
    case("topic that does not exist", [value], "topic=missing-topic: the topic does not exist", topic="missing-topic")
    case("partition out of range", [value, "CAST(id AS INT) AS partition"], "record 2: partition 2 is out of range")
    case("record larger than message.max.bytes", [f"CASE WHEN id = 4 THEN {long_value} ELSE 'v' END AS value"],
         r"record 4: key+value with the record framing is 20036 bytes", **{"kafka.message.max.bytes": "10000"})
    case("unreachable bootstrap servers", [value], "kafka.bootstrap.servers=127.0.0.1:1: every address refused",
         bootstrap="127.0.0.1:1", **{"preflight.timeoutMs": "2000"})
    case("malformed kafka.* option", [value], "kafka.linger.ms is not valid", **{"kafka.linger.ms": "soon"})
    (d / "file").write_text("x")
    case("wal.path not writable", [value], "cannot be created", **{"wal.path": str(d / "file" / "wal")})
    case("Overwrite save mode", [value], "save mode Overwrite is not supported", mode="overwrite")
    case("Ignore save mode", [value], "Ignore", mode="ignore")
    trial = Trial(records_expected=0)
    for name, run, match in cases:
        try:
            run()
            trial.errors.append(f"{name}: NO ERROR")
            trial.passed = False
        except Exception as exc:  # noqa: BLE001
            message = short_error(exc)
            ok = match in str(exc)
            trial.errors.append(f"{name}: {message}" + ("" if ok else f"  (expected: {match})"))
            trial.passed = trial.passed and ok
    return trial


# ---- 11. Security ----------------------------------------------------------------------------------------

def security(lab: Lab, rng: random.Random, n: int) -> Trial:
    """WAL directory 0700 and files 0600; SASL/SSL secrets given as kafka.* options appear in no log line, no
    exception and no commit message, in a write that succeeds and one that fails."""
    d, topic = lab.dir("security"), lab.topic(2)
    secret, key_secret = f"Pw-{os.urandom(6).hex()}", f"Kp-{os.urandom(6).hex()}"
    trial = Trial(records_expected=0)
    common = ["--rows", "2000", "--prefix", "sec", "--topic", topic, "--summary", str(d / "summary.jsonl")]
    ok = python_subprocess(["-m", "testing.chaos.jobs", *common, "--bootstrap", lab.kafka.bootstrap_servers,
                            "--wal", str(d / "wal"), "--option", f"kafka.sasl.password={secret}",
                            "--option", f"kafka.ssl.key.password={key_secret}",
                            "--option", "kafka.sasl.username=alice", *lab.job_args()], d / "ok.log",
                           RECOVERABLE_KAFKA_LOG_LEVEL="DEBUG")
    failing = python_subprocess(["-m", "testing.chaos.jobs", *common, "--bootstrap", lab.kafka.bootstrap_servers,
                                 "--wal", str(d / "wal2"), "--option", "kafka.security.protocol=SASL_SSL",
                                 "--option", "kafka.sasl.mechanism=PLAIN", "--option", "kafka.sasl.username=alice",
                                 "--option", f"kafka.sasl.password={secret}",
                                 "--option", "preflight.timeoutMs=3000", *lab.job_args()], d / "fail.log")
    ok_code, fail_code = ok.wait(300), failing.wait(300)
    trial.notes.update(successful_write_exit=ok_code, failing_write_exit=fail_code)
    if ok_code != 0:
        trial.errors.append("the write with SASL settings on a PLAINTEXT listener failed: "
                            + (d / "ok.log").read_text()[-400:])
        trial.passed = False
    if fail_code == 0:
        trial.errors.append("the SASL_SSL write to a PLAINTEXT listener succeeded")
        trial.passed = False
    for name in ("ok.log", "fail.log", "summary.jsonl"):
        path = d / name
        text = path.read_text(errors="replace") if path.exists() else ""
        for s in (secret, key_secret):
            if s in text:
                trial.errors.append(f"a secret appears in {name}")
                trial.passed = False
    for root, dirs, files in os.walk(d / "wal"):
        for name in dirs + [""]:
            mode = os.stat(os.path.join(root, name)).st_mode & 0o777
            if mode != 0o700:
                trial.errors.append(f"{root}/{name} has mode {oct(mode)}")
                trial.passed = False
        for name in files:
            mode = os.stat(os.path.join(root, name)).st_mode & 0o777
            if mode != 0o600:
                trial.errors.append(f"{root}/{name} has mode {oct(mode)}")
                trial.passed = False
    if trial.passed:
        trial.errors.append("no secret in logs, exceptions or commit messages; WAL modes 0700/0600")
    return trial
