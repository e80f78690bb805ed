"""A write's options as its driver hands them to the tasks, for tests that drive the partition writer without Spark:
parsed, and the proof topic made (and its partition count known), as the driver's checks leave them."""

from __future__ import annotations

from collections.abc import Mapping

from recoverable_sink.driver.preflight import check_proof_topic
from recoverable_sink.options import SinkOptions, parse_options


def task_options(options: Mapping[str, str]) -> SinkOptions:
    return check_proof_topic(parse_options(options))
