"""A stream's micro-batch on the driver: its commit says one INFO line naming the query, and its summary carries the
write id its tasks used; its abort (a stopped query's included) says what is where at INFO with the real ids, and
never raises."""

from __future__ import annotations

import json
import logging

from recoverable_sink.columns import SchemaPlan
from recoverable_sink.contract import SinkCommitMessage, stream_write_id
from recoverable_sink.driver.stream_write import RecoverableKafkaStreamWriter
from recoverable_sink.options import parse_options

QUERY = "5b2f7c1e-0000-4000-8000-000000000001"


def _writer(tmp_path, summary: str | None = None, checkpoint: str | None = None) -> RecoverableKafkaStreamWriter:
    options = {"kafka.bootstrap.servers": "127.0.0.1:9092", "topic": "t", "summary.path": summary or
               str(tmp_path / "summary.jsonl")}
    return RecoverableKafkaStreamWriter(parse_options(options), SchemaPlan(("value",), "t"), "cluster",
                                        checkpoint_location=checkpoint)


def _done(partition: int) -> SinkCommitMessage:
    return SinkCommitMessage(write_id=stream_write_id(QUERY, 7), partition=partition, attempt=0, host="h",
                             wal_path="/wal", received=10, published=10, acknowledged=10, query_id=QUERY)


def _lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_micro_batch_commit_logs_one_info_line_and_keeps_its_tasks_write_id(tmp_path, caplog):
    with caplog.at_level(logging.DEBUG, logger="recoverable_sink"):
        _writer(tmp_path).commit([_done(0), _done(1)], 7)
    said = [r for r in caplog.records if r.name.startswith("recoverable_sink")]
    assert [(r.levelno, r.getMessage().split(":")[0]) for r in said] == [
        (logging.INFO, f"micro-batch 7 of query {QUERY} committed")]
    (line,) = _lines(tmp_path / "summary.jsonl")
    assert (line["event"], line["write_id"], line["query_id"]) == ("commit", stream_write_id(QUERY, 7), QUERY)


def test_an_abort_with_every_task_killed_names_the_real_ids_from_the_checkpoint_at_info(tmp_path, caplog):
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    (checkpoint / "metadata").write_text(json.dumps({"id": QUERY}) + "\n")
    with caplog.at_level(logging.DEBUG, logger="recoverable_sink"):
        _writer(tmp_path, checkpoint=f"file://{checkpoint}").abort([None, None], 7)
    said = [r for r in caplog.records if r.name.startswith("recoverable_sink")]
    assert len(said) == 1 and said[0].levelno == logging.INFO, [(r.levelname, r.getMessage()) for r in said]
    text = said[0].getMessage()
    assert f"--write-id {stream_write_id(QUERY, 7)}" in text and "query.id" not in text and "this query" not in text
    assert _lines(tmp_path / "summary.jsonl")[0]["write_id"] == stream_write_id(QUERY, 7)


def test_an_abort_whose_record_cannot_be_kept_says_so_and_does_not_raise(tmp_path, caplog):
    (tmp_path / "a-directory").mkdir()
    with caplog.at_level(logging.WARNING, logger="recoverable_sink"):
        _writer(tmp_path, summary=str(tmp_path / "a-directory")).abort([_done(0), None], 7)
    assert "micro-batch 7: could not record its abort" in caplog.text
