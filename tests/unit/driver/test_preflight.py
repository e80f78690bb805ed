"""The driver's probes (no broker needed: an address nothing listens on)."""

from __future__ import annotations

import pytest

from recoverable_sink.driver.preflight import check_cluster
from recoverable_sink.errors import OptionError
from recoverable_sink.options import parse_options, short_lived
from testing.kafka_local import free_port

REFUSED = r"kafka\.bootstrap\.servers=[0-9.:,]+: every address refused the connection"


def test_unreachable_brokers_give_one_error_and_no_librdkafka_line_per_attempt(capfd):
    options = parse_options({"kafka.bootstrap.servers": f"127.0.0.1:{free_port()}", "topic": "t",
                             "preflight.timeoutMs": "1000"})
    with pytest.raises(OptionError, match=REFUSED):
        check_cluster(options)
    assert "Connection refused" not in capfd.readouterr().err


def test_addresses_that_all_refuse_fail_within_seconds_naming_each_while_one_that_does_not_answer_waits():
    import socket
    import time

    ports = [free_port(), free_port()]
    options = parse_options({"kafka.bootstrap.servers": ",".join(f"127.0.0.1:{p}" for p in ports), "topic": "t",
                             "preflight.timeoutMs": "30000"})
    started = time.monotonic()
    with pytest.raises(OptionError, match=REFUSED) as raised:
        check_cluster(options)
    assert time.monotonic() - started < 5 and all(f"127.0.0.1:{p}" in str(raised.value) for p in ports)
    # One address that accepts and never answers (a listener nobody serves): the wait is preflight.timeoutMs.
    with socket.create_server(("127.0.0.1", 0)) as silent:
        waiting = parse_options({"kafka.bootstrap.servers": f"127.0.0.1:{ports[0]},127.0.0.1:"
                                 f"{silent.getsockname()[1]}", "topic": "t", "preflight.timeoutMs": "2000"})
        with pytest.raises(OptionError, match=r"cannot reach .* within 2s"):
            check_cluster(waiting)


def test_the_topic_questions_sent_ahead_print_nothing_and_wait_no_longer_when_brokers_are_unreachable(capfd):
    # The data source sends its questions about the topic before the probe producer's metadata request: against
    # brokers that cannot be reached they must neither print librdkafka's lines nor hold the error back.
    import time

    from pyspark.sql.types import BinaryType, StructField, StructType

    from recoverable_sink.driver.source import RecoverableKafkaDataSource

    source = RecoverableKafkaDataSource({"kafka.bootstrap.servers": f"127.0.0.1:{free_port()}", "topic": "t",
                                         "preflight.timeoutMs": "1000"})
    started = time.monotonic()
    with pytest.raises(OptionError, match=REFUSED):
        source._writer_args(StructType([StructField("value", BinaryType())]))
    assert time.monotonic() - started < 5
    assert "Connection refused" not in capfd.readouterr().err


def test_short_lived_clients_connect_to_every_broker_unless_the_user_says_otherwise():
    assert short_lived(parse_options({"kafka.bootstrap.servers": "b:9092"}).producer_config())[
        "enable.sparse.connections"] == "false"
    mine = parse_options({"kafka.bootstrap.servers": "b:9092", "kafka.enable.sparse.connections": "true"})
    assert short_lived(mine.producer_config())["enable.sparse.connections"] == "true"


def test_a_producer_setting_librdkafka_does_not_know_is_named_with_the_nearest_one():
    options = parse_options({"kafka.bootstrap.servers": f"127.0.0.1:{free_port()}", "topic": "t",
                             "kafka.linger.msec": "5"})
    with pytest.raises(OptionError, match=r"^kafka\.linger\.msec is not valid for the producer .*; did you mean "
                                          r"kafka\.linger\.ms\?$"):
        check_cluster(options)
