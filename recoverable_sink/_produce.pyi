"""The sink's producer loop in C: Arrow arrays straight into librdkafka (the C extension _produce.c)."""

from typing import Protocol

class ArrowArray(Protocol):
    """Anything exporting an Arrow array through the Arrow PyCapsule interface (a pyarrow.Array)."""

    def __arrow_c_array__(self, requested_schema: object | None = None, /) -> tuple[object, object]: ...

def load(path: str, /) -> str:
    """Open librdkafka at ``path`` (once per process); returns its version. Raises OSError."""

class Producer:
    """A librdkafka producer fed from Arrow arrays. Failure reports are kept by record position
    (:meth:`take_failures`); with ``offsets``, success reports are folded per topic-partition in C
    (:meth:`take_written`). Errors from librdkafka are raised as confluent_kafka.KafkaException."""

    def __init__(self, config: dict[str, str], offsets: bool = False) -> None: ...
    def __len__(self) -> int:
        """Records in librdkafka's queue."""
    def send(self, topic: str | None, slot: int, value: ArrowArray, key: ArrowArray | None,
             topics: ArrowArray | None, partitions: ArrowArray | None, timestamps: ArrowArray | None,
             headers: ArrowArray | None, /) -> tuple[int, int, str]:
        """Hand every row over in order, each with the opaque (slot << 32) | row: (rows handed, error code,
        text). value, key and topics are binary or string; partitions int32; timestamps int64 (milliseconds);
        headers list<struct<key, value>>; all of the value's length."""
    def poll(self, timeout: float = 0, /) -> int: ...
    def flush(self, timeout: float = -1, /) -> int:
        """Wait up to ``timeout`` seconds (negative: no limit) for the queue to empty; returns what is left."""
    def purge(self) -> None: ...
    def close(self) -> None: ...
    def take_failures(self) -> list[tuple[int, int, int, str | None]]:
        """Failure reports since the last call: (opaque, error code, partition, topic or None)."""
    def take_logs(self) -> list[tuple[int, str]]:
        """librdkafka's log lines since the last call: (syslog level 0-7, text)."""
    def take_written(self) -> tuple[list[tuple[str, int, int, int, int]], bool]:
        """Per topic-partition, what was acknowledged since the last call: ([(topic, partition, first offset, last
        offset, records)], whether that is all of it). Empty unless made with ``offsets=True``; what is not taken
        before close() is lost with the handle."""
    def partition_count(self, topic: str, timeout: float, /) -> tuple[int, int, str]:
        """(count, error code, text); count -1 when the topic has an error."""
    def connect(self, timeout: float, /) -> tuple[int, str]:
        """Wait until a broker answers a metadata request: (error code, text)."""
    def init_transactions(self, timeout: float, /) -> None: ...
    def begin_transaction(self) -> None: ...
    def commit_transaction(self, timeout: float, /) -> None: ...
    def abort_transaction(self, timeout: float, /) -> None: ...
    def send_marker(self, group: str, topic: str, partition: int, offset: int, metadata: str, timeout: float,
                    /) -> None:
        """One consumer-group offset into the open transaction (the commit marker)."""
