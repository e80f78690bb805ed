"""Test harnesses (not shipped in the wheel): a local Apache Kafka (KRaft) launcher, an independent topic
reader, the one SparkSession helper, driver programs for kill-and-restart tests, and the fault campaign."""
