# Two commands do all set-up on a fresh machine: `make demo` and `make test` (see README.md).
SHELL := /bin/bash
PY ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PYTHON := $(VENV)/bin/python
STAMP_PY := build/.stamp-python
STAMP_JARS := build/.stamp-jars

.PHONY: FORCE setup kafka-up kafka-down demo typecheck unit integration test chaos mutants bench soak matrix dist lint clean

setup: $(STAMP_PY) $(STAMP_JARS)

# The stamps live in build/; redo a step whose output was deleted even if its stamp survived.
ifeq ($(wildcard $(PYTHON)),)
$(STAMP_PY): FORCE
endif
ifeq ($(and $(wildcard build/kafka/libs/kafka_2.13-*.jar),$(wildcard build/spark-jars/spark-sql-kafka-*.jar)),)
$(STAMP_JARS): FORCE
endif
FORCE:

$(STAMP_PY): pyproject.toml $(wildcard recoverable_sink/native/*.c recoverable_sink/native/*.h)
	@test -x $(PYTHON) || $(PY) -m venv $(VENV)
	$(PYTHON) -m pip install -q --upgrade pip
	@# The editable install is a plain path entry to the repository, which pkgutil.iter_modules() (Spark's
	@# auto-registration scan, run in workers) sees, so pyspark_recoverable_kafka is found as from a wheel.
	@# Earlier in-place builds of the C extensions go first: one named for a version tag (.cpython-311-...so)
	@# would be imported before the fresh .abi3.so.
	rm -f recoverable_sink/*.so
	$(PYTHON) -m pip install -q -e '.[test]'
	@mkdir -p build && touch $@

# The broker and Spark's Kafka connector, resolved from Maven Central (no Docker, no tarball).
$(STAMP_JARS): jars/broker-pom.xml jars/spark-kafka-pom.xml
	rm -rf build/kafka/libs build/spark-jars
	mvn -q -B -f jars/broker-pom.xml package
	mvn -q -B -f jars/spark-kafka-pom.xml package
	@mkdir -p build && touch $@

# The broker needs only Java and its jars: no virtualenv (the launcher probes the broker without a Kafka client).
kafka-up: $(STAMP_JARS)
	$(PY) -m testing.kafka_local up

kafka-down:
	$(PY) -m testing.kafka_local down

demo: setup
	$(PYTHON) -m demo.demo

# mypy over the package, as pyproject.toml's [tool.mypy] sets it (strict, but for the modules its overrides name);
# seconds, so make test runs it first.
typecheck: setup
	$(PYTHON) -m mypy

# The fast tier: no JVM, no broker (options, schema, records, WAL, identity rules, CLI replay, doctests).
unit: setup
	$(PYTHON) -m pytest -q tests/unit --doctest-modules recoverable_sink

# Real Spark and real Kafka brokers; the 15 slowest tests and the slowest files (tests/conftest.py) are listed at
# the end, to keep the suite short.
integration: setup
	$(PYTHON) -m testing.spark --class-archive
	$(PYTHON) -m pytest -q --durations=15 -m "not campaign" tests/integration

test: typecheck unit integration

# The suite's tests marked campaign (longer forms of cases it covers), the fault campaign, then the partition writer's long model profile (WRITER_MODEL_EXAMPLES sequences; its seed
# printed, WRITER_MODEL_SEED replays one; the plans it saw in build/chaos/writer-model.json).
chaos: setup
	$(PYTHON) -m testing.spark --class-archive
	$(PYTHON) -m pytest -q -m campaign tests/integration
	$(PYTHON) -m testing.chaos.run
	@seed=$${WRITER_MODEL_SEED:-$$RANDOM$$RANDOM}; echo "writer model: $${WRITER_MODEL_EXAMPLES:-5000} sequences, seed $$seed"; \
	WRITER_MODEL_SEED=$$seed WRITER_MODEL_EXAMPLES=$${WRITER_MODEL_EXAMPLES:-5000} $(PYTHON) -m pytest -q \
	  -p no:cacheprovider -p no:logging tests/unit/executor/test_writer_model.py --hypothesis-seed=$$seed \
	  --hypothesis-show-statistics
	@cat build/chaos/writer-model.json

# The mutants of the writer's rules the model must catch (also part of make unit).
mutants: setup
	$(PYTHON) -m pytest -q tests/unit/executor/test_writer_model_mutants.py

bench: setup
	$(PYTHON) -m bench.run

# The sink over time and size: two streams (one per delivery mode) for SOAK_MINUTES (30) under random faults,
# sampled every minute; then batch writes of 1M, 10M and 50M rows. build/soak/results.json and results.png.
soak: setup
	$(PYTHON) -m testing.spark --class-archive
	$(PYTHON) -m bench.soak
	$(PYTHON) -m bench.sizes

# Every supported Python and pyspark (4.0 to 4.3), each in a fresh virtualenv: both modes and a stream with killed
# workers retried, Spark's Kafka source and format("kafka") beside the sink, a Spark Connect client; a table at the end.
matrix: setup
	$(PYTHON) -m tools.matrix

# In build/dist/: the sdist, manylinux2014 abi3 wheels for x86_64 and aarch64 (zig from PyPI cross-compiles them),
# and the spark-submit --py-files zip.
# Needs only Python, a C compiler and the build tools (installed into build/dist-venv on first use): not make setup.
DIST_VENV := build/dist-venv
dist:
	@test -x $(DIST_VENV)/bin/python || $(PY) -m venv $(DIST_VENV)
	$(DIST_VENV)/bin/python -m tools.dist

lint: setup
	$(PYTHON) -m ruff check .

clean:
	-$(PY) -m testing.kafka_local down
	rm -rf build
