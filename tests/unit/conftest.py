"""Unit tier: no JVM, no Kafka. Each test gets its own WAL directory, closed afterwards."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from recoverable_sink.producer.pool import producers
from recoverable_sink.wal import close_wals


@pytest.fixture
def wal_dir(tmp_path) -> Iterator[str]:
    yield str(tmp_path / "wal")
    close_wals()
    producers.close()
