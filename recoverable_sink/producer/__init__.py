"""The producer wing (executor): the producer interface, its native (C, from Arrow buffers) and confluent-kafka
implementations, the pool that keeps them across tasks, exactly_once's transactions and commit marker, and the
books of what Kafka acknowledged. It knows nothing of Spark or of the WAL."""
