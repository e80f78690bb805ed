"""The driver's probes (no broker needed: an address nothing listens on)."""

from __future__ import annotations

import pytest

from recoverable_sink.driver.preflight import check_cluster
from recoverable_sink.errors import OptionError
from recoverable_sink.options import parse_options, short_lived
from testing.kafka_local import free_port


def test_unreachable_brokers_give_one_error_and_no_librdkafka_line_per_attempt(capfd):
    options = parse_options({"kafka.bootstrap.servers": f"127.0.0.1:{free_port()}", "topic": "t",
                             "preflight.timeoutMs": "1000"})
    with pytest.raises(OptionError, match=r"cannot reach kafka\.bootstrap\.servers=127\.0\.0\.1:\d+ within 1s"):
        check_cluster(options)
    assert "Connection refused" not in capfd.readouterr().err


def test_the_topic_questions_sent_ahead_print_nothing_and_wait_no_longer_when_brokers_are_unreachable(capfd):
    # The data source sends its questions about the topic before the probe producer's metadata request: against
    # brokers that cannot be reached they must neither print librdkafka's lines nor hold the error back.
    import time

    from pyspark.sql.types import BinaryType, StructField, StructType

    from recoverable_sink.driver.source import RecoverableKafkaDataSource

    source = RecoverableKafkaDataSource({"kafka.bootstrap.servers": f"127.0.0.1:{free_port()}", "topic": "t",
                                         "preflight.timeoutMs": "1000"})
    started = time.monotonic()
    with pytest.raises(OptionError, match=r"cannot reach kafka\.bootstrap\.servers=127\.0\.0\.1:\d+ within 1s"):
        source._writer_args(StructType([StructField("value", BinaryType())]))
    assert time.monotonic() - started < 5
    assert "Connection refused" not in capfd.readouterr().err


def test_short_lived_clients_connect_to_every_broker_unless_the_user_says_otherwise():
    assert short_lived(parse_options({"kafka.bootstrap.servers": "b:9092"}).producer_config())[
        "enable.sparse.connections"] == "false"
    mine = parse_options({"kafka.bootstrap.servers": "b:9092", "kafka.enable.sparse.connections": "true"})
    assert short_lived(mine.producer_config())["enable.sparse.connections"] == "true"
