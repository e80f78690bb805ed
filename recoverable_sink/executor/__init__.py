"""Executor side: one Spark task's write. The task driver, the at-least-once and exactly-once partition writers,
the attempt's WAL entry, re-run judgement, and records normalised and checked from Spark's Arrow batches. It
sends through :mod:`recoverable_sink.producer` and logs through :mod:`recoverable_sink.wal`; it never imports the
driver side."""
