"""Driver side: what runs on the Spark driver before and after the tasks. The DataSource Spark looks up, the
checks of options, schema and cluster made before any task runs, the Spark-facing batch and streaming writers
(whose ``write`` hands each task to :mod:`recoverable_sink.executor`), and the summary of a write's commit
messages. Nothing here talks to Kafka on a task's behalf."""
