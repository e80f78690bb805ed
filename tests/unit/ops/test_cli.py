"""recoverable-kafka-wal, the operator's command line: its commands, flags, output and independence from Spark."""

import io
import json
import logging
import subprocess
import sys

import pyarrow as pa
import pytest

from recoverable_sink.identity import record_digests
from recoverable_sink.ops.cli import Progress, _parser, main, producer_settings
from recoverable_sink.wal import open_wal


def test_the_wal_cli_never_imports_pyspark():
    code = "import sys, recoverable_sink.ops.cli; sys.exit('pyspark' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_replay_takes_producer_settings_from_a_file_and_the_environment_and_warns_of_secrets_in_argv(
        tmp_path, caplog):
    config = tmp_path / "client.properties"
    config.write_text("# a Kafka client's file\nbootstrap.servers=b1:9092\nsasl.mechanism = PLAIN\n"
                      "sasl.password=from-file\nlinger.ms=5\n")
    args = _parser().parse_args(["replay", "--path", "p", "--write-id", "w", "--kafka-config", str(config),
                                 "--kafka", "linger.ms=20", "--kafka", "sasl.username=alice"])
    env = {"RECOVERABLE_KAFKA_PRODUCER_SASL_PASSWORD": "from-env", "OTHER": "x"}
    with caplog.at_level(logging.WARNING, logger="recoverable_sink.cli"):
        settings = producer_settings(args, env)
    assert settings == {"kafka.bootstrap.servers": "b1:9092", "kafka.sasl.mechanism": "PLAIN",
                        "kafka.sasl.password": "from-env", "kafka.linger.ms": "20", "kafka.sasl.username": "alice"}
    assert "--kafka sasl.username=... puts a secret in this command line" in caplog.text
    assert "alice" not in caplog.text


def test_replay_without_brokers_anywhere_says_where_to_give_them(tmp_path, caplog):
    _two_writes(str(tmp_path / "wal"))
    with caplog.at_level(logging.ERROR, logger="recoverable_sink.cli"):
        assert main(["replay", "--path", str(tmp_path / "wal"), "--write-id", "w-one"]) == 1
    assert "--bootstrap-servers, bootstrap.servers in --kafka-config, or RECOVERABLE_KAFKA_PRODUCER_BOOTSTRAP_SERVERS" \
        in caplog.text


def _two_writes(path: str) -> None:
    wal = open_wal(path)
    for write_id, partitions in (("w-one", 2), ("w-two", 1)):
        for p in range(partitions):
            key = wal.begin_attempt(write_id, p, 0, {"kind": "batch", "topic": "t"})
            b = pa.RecordBatch.from_pydict({"value": [b"x" * 10] * 5})
            wal.append(key, 0, b, record_digests(b, "t", "c"), 1 << 20, {})


def test_list_shows_per_write_totals_and_json_for_scripts(tmp_path, capsys):
    path = str(tmp_path / "wal")
    _two_writes(path)
    assert main(["list", "--path", path]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:6] == ["write_id", "kind", "topic", "attempts", "partitions", "states"]
    assert [line.split()[:5] for line in table[1:]] == [["w-one", "batch", "t", "2", "2"],
                                                        ["w-two", "batch", "t", "1", "1"]]
    assert main(["list", "--path", path, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [(w["write_id"], w["records"], w["unacknowledged"]) for w in report["writes"]] == \
        [("w-one", 10, 10), ("w-two", 5, 5)]
    assert len(report["attempts"]) == 3


def _attempt(wal, run: str, partition: int, attempt: int, values: list[bytes], acked: set[bytes]) -> None:
    """An attempt of write w's ``run`` that logged ``values`` (in one segment) and got those in ``acked``
    acknowledged."""
    key = wal.begin_attempt("w", partition, attempt, {"kind": "batch", "topic": "t", "run": run})
    b = pa.RecordBatch.from_pydict({"value": values})
    wal.append(key, 0, b, record_digests(b, "t", "c"), 1 << 30, {})
    wal.save_acks(key, {0: bytearray(v in acked for v in values)})


def test_list_counts_a_record_once_across_retries_and_shows_what_no_attempt_got_acknowledged(tmp_path, capsys):
    """The issue's case in small: a retry logs again what the attempt before it logged and never got acknowledged,
    so adding the attempts up counted those records twice, and their unacknowledged copies as well."""
    path = str(tmp_path / "wal")
    wal = open_wal(path)
    rows = [b"r%03d" % i for i in range(20)]
    _attempt(wal, "run1", 0, 0, rows, set(rows[:8]))  # 8 acknowledged, 12 not
    _attempt(wal, "run1", 0, 1, rows[8:], set(rows[8:13]))  # the 12 again: 5 more acknowledged
    _attempt(wal, "run1", 0, 2, rows[13:], set())  # the last 7 again: none acknowledged
    # Another partition of the same run holding equal rows: records of their own, none acknowledged.
    _attempt(wal, "run1", 1, 0, rows[:2], set())
    # A re-run split otherwise: its partition 1 holds 3 of the 7 and 4 rows of its own, all acknowledged.
    _attempt(wal, "run2", 1, 0, rows[13:16] + [b"new0", b"new1", b"new2", b"new3"],
             {*rows[13:16], b"new0", b"new1", b"new2", b"new3"})
    assert main(["list", "--path", path, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    (write,) = report["writes"]
    assert (write["records"], write["unacknowledged"], write["attempts"]) == (26, 6, 5)
    # The attempts' own rows still say what each logged.
    assert sorted((a["partition"], a["attempt"], a["records"], a["unacknowledged"]) for a in report["attempts"]) == \
        [(0, 0, 20, 12), (0, 1, 12, 7), (0, 2, 7, 7), (1, 0, 2, 2), (1, 0, 7, 0)]
    assert main(["list", "--path", path]) == 0
    header, line = capsys.readouterr().out.splitlines()
    columns = dict(zip(header.split(), line.split(), strict=False))
    assert (columns["records"], columns["unacknowledged"]) == ("26", "6")


def test_replay_progress_is_a_bar_on_a_terminal_and_lines_otherwise(caplog):
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    tty = Tty()
    bar = Progress("partition 3", tty)
    bar(50, 100)
    bar(100, 100)
    assert "\rpartition 3 [###############               ] 50/100 records" in tty.getvalue()
    assert tty.getvalue().endswith("100/100 records\n")
    plain = io.StringIO()
    with caplog.at_level(logging.INFO, logger="recoverable_sink.cli"):
        lines = Progress("partition 3", plain)
        lines(50, 100)
        lines(60, 100)  # within 10 s of the last line: not repeated
        lines(100, 100)
    assert plain.getvalue() == ""
    assert [r.getMessage() for r in caplog.records] == ["partition 3: 50 of 100 records (50%)",
                                                        "partition 3: 100 of 100 records (100%)"]


def test_a_path_without_a_wal_is_refused_and_not_created(tmp_path, caplog):
    missing = tmp_path / "typo"
    with caplog.at_level(logging.ERROR, logger="recoverable_sink.cli"):
        assert main(["list", "--path", str(missing)]) == 1
    assert "holds no WAL" in caplog.text and not missing.exists()


@pytest.mark.parametrize("command", [["purge"], ["replay", "--bootstrap-servers", "b:9092"], ["list"]])
def test_an_unknown_write_id_exits_non_zero(tmp_path, caplog, command):
    _two_writes(str(tmp_path / "wal"))
    with caplog.at_level(logging.ERROR, logger="recoverable_sink.cli"):
        assert main([command[0], "--path", str(tmp_path / "wal"), "--write-id", "nope", *command[1:]]) == 1
    assert "write nope is not in" in caplog.text
    assert len(open_wal(str(tmp_path / "wal")).attempts()) == 3  # nothing purged or changed


def test_flags_that_do_not_apply_are_refused_and_every_command_has_help(tmp_path, capsys):
    with pytest.raises(SystemExit) as refused:
        main(["stats", "--path", str(tmp_path), "--write-id", "w"])
    assert refused.value.code == 2
    for command in ("list", "stats", "replay", "purge", "transactions"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        text = " ".join(capsys.readouterr().out.split())  # argparse wraps the description
        assert "Exit status: 0 done, 1 an error or a refusal" in text or command in ("list", "stats")
    with pytest.raises(SystemExit):
        main(["--version"])
    assert capsys.readouterr().out.startswith("recoverable-kafka-wal ")


def test_purge_json_reports_what_it_removed(tmp_path, capsys):
    _two_writes(str(tmp_path / "wal"))
    assert main(["purge", "--path", str(tmp_path / "wal"), "--write-id", "w-one", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["write_id"], report["attempts"]) == ("w-one", 2)
