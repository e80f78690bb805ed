"""The exactly_once commit marker (executor, and the operator tools that read it): what a committed transaction
of one partition says about itself, as the metadata of an offset committed inside that transaction.

A marker names the write (for a stream, the micro-batch) and the run that committed, the WAL attempts whose
transactions hold the partition's records and how many records those hold, and the fingerprint of the committing
attempt's whole input, so that a re-run on another host can tell, without any log, whether its partition holds
exactly the rows that were committed. Markers without a version field were written by earlier releases; every
field they lack reads as unknown.
"""

from __future__ import annotations

import json
import socket
import time
from dataclasses import dataclass

from recoverable_sink.contract import stream_batch_of
from recoverable_sink.identity import Fingerprint

MARKER_VERSION = 2


@dataclass(frozen=True)
class Marker:
    """One committed marker."""

    write_id: str | None
    topic: str | None
    records: int  # records the committed transactions of the partition hold in all
    attempts: tuple[str, ...] | None  # WAL attempt names (see attempt_log.attempt_name); None: not recorded
    run: str | None = None  # the run that committed last (see contract.new_run_id)
    fingerprint: Fingerprint | None = None  # of the last committing attempt's whole input
    partition: int | None = None
    host: str | None = None
    wal: str | None = None
    committed_at: float | None = None

    @property
    def batch(self) -> int | None:
        """The micro-batch a stream's marker commits (None for a batch write's)."""
        return stream_batch_of(self.write_id) if self.write_id else None

    @classmethod
    def parse(cls, metadata: str | None) -> Marker:
        """A marker from an offset's metadata; unreadable metadata gives a marker that names nothing."""
        try:
            raw = json.loads(metadata or "{}")
        except ValueError:
            raw = {}
        if not isinstance(raw, dict):
            raw = {}
        records = raw.get("records")
        attempts = raw.get("attempts")

        def text(name: str) -> str | None:
            value = raw.get(name)
            return value if isinstance(value, str) else None

        return cls(write_id=text("write_id"), topic=text("topic"),
                   records=records if isinstance(records, int) else 0,
                   attempts=tuple(str(a) for a in attempts) if isinstance(attempts, list) else None,
                   run=text("run"), fingerprint=Fingerprint.decode(raw.get("fingerprint")),
                   partition=raw.get("partition") if isinstance(raw.get("partition"), int) else None,
                   host=text("host"), wal=text("wal"),
                   committed_at=raw.get("committed_at") if isinstance(raw.get("committed_at"), float) else None)

    def encode(self) -> str:
        """The offset metadata (JSON) of this marker, stamped with this host and the time."""
        return json.dumps({"version": MARKER_VERSION, "write_id": self.write_id, "partition": self.partition,
                           "topic": self.topic, "records": self.records, "attempts": list(self.attempts or ()),
                           "run": self.run, "fingerprint": self.fingerprint.encode() if self.fingerprint else None,
                           "host": socket.gethostname(), "wal": self.wal, "committed_at": round(time.time(), 3)})
