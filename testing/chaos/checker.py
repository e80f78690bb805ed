"""Counts what landed by the unique id every chaos record carries as its key, with a consumer that has
nothing to do with the sink: Debian's kcat when installed, else a plain confluent-kafka consumer."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections import Counter
from collections.abc import Iterable

from testing.kafka_check import end_offsets, read_topic


def ids_in_topic(bootstrap: str, topic: str, expected: int | None = None, timeout_s: float = 120,
                 isolation: str = "read_committed") -> Counter[str]:
    """How many times each key is in ``topic`` (read to the end offsets), as a consumer with ``isolation``
    (``read_committed``, librdkafka's default, or ``read_uncommitted``) sees it."""
    if shutil.which("kcat") is None:
        return Counter(r["key"].decode() for r in read_topic(bootstrap, topic, timeout_s, expected=expected,
                                                             isolation=isolation))
    # Wait on the offsets only (kcat -e reads every partition to its end). Past the deadline, count what is
    # there: fewer records than expected is a result (lost), not an error.
    deadline = time.monotonic() + timeout_s
    while expected is not None and sum(end_offsets(bootstrap, topic).values()) < expected \
            and time.monotonic() < deadline:
        time.sleep(0.2)
    out = subprocess.run(["kcat", "-C", "-b", bootstrap, "-X", f"isolation.level={isolation}", "-t", topic,
                          "-o", "beginning", "-e", "-q",
                          "-f", "%k\\n"], capture_output=True, text=True, timeout=timeout_s, check=True).stdout
    return Counter(line for line in out.splitlines() if line)


def verdict(expected_ids: Iterable[str], found: Counter[str]) -> tuple[int, int, int]:
    """(lost, duplicated, unexpected): ids never found, extra copies, ids that were never written."""
    expected = set(expected_ids)
    lost = sum(1 for i in expected if found[i] == 0)
    duplicated = sum(count - 1 for i, count in found.items() if count > 1)
    unexpected = sum(count for i, count in found.items() if i not in expected)
    return lost, duplicated, unexpected
