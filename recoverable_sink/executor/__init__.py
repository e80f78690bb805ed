"""Executor side: one Spark task's write. The task, the partition writer and its two delivery modes, the evidence of
earlier attempts (the host's WAL, the markers, the proof topic) and the pure resume plan over it, the attempt's WAL
entry, and records normalised and checked from Spark's Arrow batches. It sends through :mod:`recoverable_sink.producer`,
logs through :mod:`recoverable_sink.wal` and keeps proof through :mod:`recoverable_sink.proof`; it never imports the
driver side."""
