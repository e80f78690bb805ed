"""The project's librdkafka declarations (_rdkafka_api.h) against the library's own: struct layouts against a
system rdkafka.h where one is installed (or RDKAFKA_INCLUDE names its folder), constants against
confluent-kafka's, which come from the library it ships."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from confluent_kafka import KafkaError

import recoverable_sink

OURS = Path(recoverable_sink.__file__).parent / "native" / "_rdkafka_api.h"

# Every field _produce.c reads or fills, and the size of every struct it uses as an array.
_PROBES = [
    "sizeof(rd_kafka_message_t)", "offsetof(rd_kafka_message_t, err)", "offsetof(rd_kafka_message_t, rkt)",
    "offsetof(rd_kafka_message_t, partition)", "offsetof(rd_kafka_message_t, _private)",
    "sizeof(rd_kafka_vu_t)", "offsetof(rd_kafka_vu_t, u)", "sizeof(rd_kafka_resp_err_t)",
    "sizeof(rd_kafka_metadata_topic_t)", "offsetof(rd_kafka_metadata_topic_t, partition_cnt)",
    "offsetof(rd_kafka_metadata_topic_t, err)", "offsetof(rd_kafka_metadata_t, topic_cnt)",
    "offsetof(rd_kafka_metadata_t, topics)", "offsetof(rd_kafka_topic_partition_t, offset)",
    "offsetof(rd_kafka_topic_partition_t, metadata)", "offsetof(rd_kafka_topic_partition_t, metadata_size)",
    "RD_KAFKA_VTYPE_TOPIC", "RD_KAFKA_VTYPE_RKT", "RD_KAFKA_VTYPE_PARTITION", "RD_KAFKA_VTYPE_VALUE",
    "RD_KAFKA_VTYPE_KEY", "RD_KAFKA_VTYPE_OPAQUE", "RD_KAFKA_VTYPE_MSGFLAGS", "RD_KAFKA_VTYPE_TIMESTAMP",
    "RD_KAFKA_VTYPE_HEADERS", "RD_KAFKA_MSG_F_COPY", "RD_KAFKA_PURGE_F_QUEUE", "RD_KAFKA_PURGE_F_INFLIGHT",
    "RD_KAFKA_PURGE_F_NON_BLOCKING", "RD_KAFKA_CONF_OK", "RD_KAFKA_PRODUCER",
    "RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC", "RD_KAFKA_RESP_ERR__INVALID_ARG", "RD_KAFKA_RESP_ERR__QUEUE_FULL",
]


def _probe(include: str, tmp_path: Path, name: str) -> list[int]:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    source = tmp_path / f"{name}.c"
    lines = "\n".join(f'    printf("%lld\\n", (long long)({p}));' for p in _PROBES)
    source.write_text(f"#include <stddef.h>\n#include <stdio.h>\n{include}\nint main(void) {{\n{lines}\n"
                      "    return 0;\n}\n")
    binary = tmp_path / name
    subprocess.run([cc, "-o", str(binary), str(source)], check=True, capture_output=True)
    out = subprocess.run([str(binary)], check=True, capture_output=True, text=True).stdout
    return [int(v) for v in out.split()]


def test_layouts_match_the_system_header(tmp_path):
    folder = Path(os.environ.get("RDKAFKA_INCLUDE", "/usr/include"))
    if not (folder / "librdkafka" / "rdkafka.h").exists():
        pytest.skip(f"no librdkafka/rdkafka.h under {folder} to compare with")
    theirs = _probe(f'#include "{folder}/librdkafka/rdkafka.h"', tmp_path, "theirs")
    ours = _probe(f'#include "{OURS}"', tmp_path, "ours")
    assert dict(zip(_PROBES, ours, strict=True)) == dict(zip(_PROBES, theirs, strict=True))


def test_error_codes_match_confluent_kafka(tmp_path):
    values = dict(zip(_PROBES, _probe(f'#include "{OURS}"', tmp_path, "ours"), strict=True))
    assert values["RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC"] == KafkaError._UNKNOWN_TOPIC
    assert values["RD_KAFKA_RESP_ERR__INVALID_ARG"] == KafkaError._INVALID_ARG
    assert values["RD_KAFKA_RESP_ERR__QUEUE_FULL"] == KafkaError._QUEUE_FULL
