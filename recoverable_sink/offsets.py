"""Written offsets: where records went, per Kafka topic-partition, as the first and last offset and the count. An
attempt folds its delivery reports into one (producer/ledger.py); the driver folds its tasks' (driver/summary.py)."""

from __future__ import annotations

OffsetRange = tuple[str, int, int, int, int]  # (topic, partition, first offset, last offset, records)


class WrittenOffsets:
    """Ranges folded per topic-partition: the lowest first offset, the highest last, the records summed."""

    def __init__(self) -> None:
        self._by_partition: dict[tuple[str, int], list[int]] = {}

    def add(self, topic: str, partition: int, first: int, last: int, count: int) -> None:
        seen = self._by_partition.get((topic, partition))
        if seen is None:
            self._by_partition[(topic, partition)] = [first, last, count]
        else:
            seen[0], seen[1], seen[2] = min(seen[0], first), max(seen[1], last), seen[2] + count

    def ranges(self) -> tuple[OffsetRange, ...]:
        """The folded ranges, sorted by topic and partition."""
        return tuple(sorted((t, p, f, last, n) for (t, p), (f, last, n) in self._by_partition.items()))
