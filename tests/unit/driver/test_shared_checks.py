"""A stream's driver checks shared between the Python workers of one driver JVM: what one worker's checks found is
read by another (a micro-batch's commit or abort) within the window, with the options' secrets from its own parsing,
none of them in the file."""

from __future__ import annotations

import os
import tempfile

import pytest

from recoverable_sink.columns import SchemaPlan
from recoverable_sink.driver import shared_checks
from recoverable_sink.options import DeadLetterTopic, parse_options

RAW = {"kafka.bootstrap.servers": "b:9092", "topic": "t", "kafka.sasl.password": "s3cret",
       "errors.tolerance": "all", "errors.deadletterqueue.topic.name": "dlq"}


@pytest.fixture
def one_jvm(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(shared_checks, "ancestor_jvm", lambda: 4242)
    return tmp_path


def test_what_one_worker_checked_another_reads_with_its_own_secrets(one_jvm):
    from dataclasses import replace

    checked = parse_options(RAW)
    fitted = dict(checked.producer_items) | {"batch.size": "2000"}
    checked = replace(checked, producer_items=tuple(sorted(fitted.items())), topic_max_message_bytes=2000,
                      errors=DeadLetterTopic("dlq", 5000))
    plan = SchemaPlan(("key", "value"), "t", frames=(("value", b"\x00\x00\x00\x00\x07"),))
    key = shared_checks.key_of(RAW, "{}")
    shared_checks.save(key, checked, plan, "cluster-1")
    (path,) = [os.path.join(d, f) for d, _, files in os.walk(one_jvm) for f in files]
    assert "s3cret" not in open(path).read() and oct(os.stat(os.path.dirname(path)).st_mode)[-3:] == "700"
    options, read_plan, cluster = shared_checks.load(key, parse_options(RAW), within_s=60)
    assert (options, read_plan, cluster) == (checked, plan, "cluster-1")  # the secret from this worker's parsing
    assert shared_checks.load(key, parse_options(RAW), within_s=0) is None  # past the window: checked again
    assert shared_checks.load(shared_checks.key_of({**RAW, "topic": "u"}, "{}"), parse_options(RAW), 60) is None
