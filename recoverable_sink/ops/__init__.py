"""Operator tools, without Spark: the ``recoverable-kafka-wal`` command line, replay of a failed write from a
host's WAL, and the lingering transactions a dead exactly_once job left open."""
