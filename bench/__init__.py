"""Side-by-side throughput benchmark of the Kafka sinks (``make bench``): Spark's ``format("kafka")``, the
``recoverable_kafka`` sink with its WAL on and off, and a plain confluent-kafka producer."""
