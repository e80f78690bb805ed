"""How ``confluent_producer.produce`` calls ``Producer.produce``: only as many positional arguments as the records set,
each record's own values in the right place, librdkafka's defaults for the rest."""

from __future__ import annotations

from typing import Any

import pytest

from recoverable_sink.errors import RecordError
from recoverable_sink.producer.arguments import KafkaRecords
from recoverable_sink.producer.confluent import produce
from recoverable_sink.producer.ledger import Ledger
from tests.unit.fakes import FakeProducer, Sent


class _Counting(FakeProducer):
    """Records how many positional arguments each call had."""

    def __init__(self) -> None:
        super().__init__()
        self.arities: list[int] = []

    def produce(self, *args: Any) -> None:  # type: ignore[override]
        self.arities.append(len(args))
        super().produce(*args)


def _records(**columns: list[Any] | None) -> KafkaRecords:
    values = [b"v0", b"v1"]
    return KafkaRecords(values=values, keys=columns.get("keys"), topics=columns.get("topics"),
                        partitions=columns.get("partitions"), headers=columns.get("headers"),
                        timestamps=columns.get("timestamps"))


HEADERS = [[("h", b"1")], None]


@pytest.mark.parametrize(("columns", "arity", "expected"), [
    ({}, 2, [Sent("t", b"v0", None, -1, 0, None), Sent("t", b"v1", None, -1, 0, None)]),
    ({"keys": [b"k", None]}, 3, [Sent("t", b"v0", b"k", -1, 0, None), Sent("t", b"v1", None, -1, 0, None)]),
    ({"partitions": [2, None]}, 4, [Sent("t", b"v0", None, 2, 0, None), Sent("t", b"v1", None, -1, 0, None)]),
    ({"timestamps": [None, 7]}, 7, [Sent("t", b"v0", None, -1, 0, None), Sent("t", b"v1", None, -1, 7, None)]),
    ({"headers": HEADERS, "topics": ["a", "b"]}, 8,
     [Sent("a", b"v0", None, -1, 0, HEADERS[0]), Sent("b", b"v1", None, -1, 0, None)]),
])
def test_produce_passes_the_arguments_the_records_set_and_leaves_out_the_defaults_after_them(
        columns: dict[str, list[Any]], arity: int, expected: list[Sent]) -> None:
    producer = _Counting()
    handed = produce(producer, _records(**columns), "t", 0, None, Ledger(), str)
    assert handed == 2
    assert producer.delivered + producer.queue == expected
    assert producer.arities == [arity, arity]


def test_a_refused_record_without_a_partition_column_is_named_by_position_and_topic() -> None:
    producer = FakeProducer(refuse=b"v1")
    with pytest.raises(RecordError, match="^record 11 to topic t was refused") as info:
        produce(producer, _records(keys=[b"k", b"k"]), "t", 10, None, Ledger(), str)
    assert "partition" not in str(info.value)
