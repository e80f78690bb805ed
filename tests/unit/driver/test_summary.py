"""The driver's summary of a write: counts over its tasks' commit messages, and the lines logged at commit and
abort."""

import logging

from recoverable_sink.contract import SinkCommitMessage
from recoverable_sink.driver.summary import log_abort, log_commit, summarize


def message(partition: int, attempt: int = 0, **counts: int) -> SinkCommitMessage:
    return SinkCommitMessage(write_id="w", partition=partition, attempt=attempt, host="h", wal_path="/wal", **counts)


def test_summary_counts_finished_unfinished_and_retried_partitions():
    summary = summarize([message(0, received=5, skipped=2), None, message(2, attempt=1, received=3)])
    assert (summary["received"], summary["skipped"], summary["partitions"]) == (8, 2, 3)
    assert (summary["finished"], summary["unfinished"], summary["retried_partitions"]) == ([0, 2], [1], 1)


def test_abort_line_names_partitions_write_id_and_how_to_finish(caplog):
    logging.getLogger("recoverable_sink").addHandler(caplog.handler)
    try:
        finished = SinkCommitMessage(write_id="w", partition=0, attempt=0, host="h", wal_path="/wal", received=80,
                                     acknowledged=80, dead_lettered={"NullTopic": 10}, dead_letter_topic="dlq")
        log_abort("write w", summarize([finished, None]), "/wal", "w", "re-run it with wal.writeId=w")
    finally:
        logging.getLogger("recoverable_sink").removeHandler(caplog.handler)
    text = caplog.text
    assert "1 of 2 partitions did not finish ([1])" in text and "finished: [0], with 80 records, 80 acknowledged by " \
        "Kafka and 10 sent to the dead-letter topic dlq (NullTopic 10)" in text
    assert "--write-id w" in text and "re-run it with wal.writeId=w" in text


def test_records_a_retry_sent_without_an_earlier_log_are_counted_and_warned_of(caplog):
    retry = SinkCommitMessage(write_id="w", partition=0, attempt=1, host="h", wal_path="/w", received=10,
                              published=10, acknowledged=10, unproven=10)
    summary = summarize([retry])
    assert summary["unproven"] == 10
    with caplog.at_level(logging.WARNING, logger="recoverable_sink.summary"):
        log_commit("write w", summary)
    assert "10 records were sent by retries that found no earlier attempt's log" in caplog.text


def test_dead_letters_are_summed_per_refusal_said_where_they_went_and_kept_as_json(caplog):
    import json

    done = [SinkCommitMessage(write_id="w", partition=p, attempt=0, host="h", wal_path="/w",
                              dead_lettered={"RecordTooLarge": 2, "NullTopic": p}, dead_letter_topic="dlq")
            for p in (0, 1)]
    summary = summarize(done)
    assert summary["dead_lettered"] == {"NullTopic": 1, "RecordTooLarge": 4}
    assert json.loads(json.dumps(summary))["tasks"][1]["dead_lettered"] == {"RecordTooLarge": 2, "NullTopic": 1}
    with caplog.at_level(logging.WARNING, logger="recoverable_sink.summary"):
        log_commit("write w", summary)
    assert "5 records Kafka would refuse went to the dead-letter topic dlq instead (NullTopic 1, RecordTooLarge 4)" \
        in caplog.text
