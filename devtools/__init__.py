"""Development tooling: a local Apache Kafka (KRaft) launcher and an independent topic reader."""
