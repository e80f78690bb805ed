"""Proof of delivery kept in Kafka, beside the data: a topic the sink owns, in which each task writes the digests of
what Kafka acknowledged to it (at_least_once, as its drains checkpoint) or committed (exactly_once, inside its
transaction), so that a retry or a re-run on any host, on any partitioning, any day within the topic's retention,
skips exactly what Kafka holds. The executor's WAL is the first tier (same-host retries, the payload ``replay``
sends); this is the second.

Modules: :mod:`.format` the records (pure), :mod:`.view` what one write's proof holds as a task sees it (pure),
:mod:`.read` the two passes that fill a view, :mod:`.io` the reads and writes behind one interface, :mod:`.reader` the
consumers and the directory of where each write's live proof starts, :mod:`.claims` the claims of a re-run's
partitions, :mod:`.topic` the topic's settings and creation. Imports go one way: everything here may import
``format``; nothing imports the executor or the driver.
"""
