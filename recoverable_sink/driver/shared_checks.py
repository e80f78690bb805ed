"""A stream's driver checks shared by the Python workers of one driver JVM (driver), for as long as they are reused.

Spark makes a stream's writer in one Python worker to plan a micro-batch and in another to commit or abort it. The
second made every check again (brokers, topic, limits, transactions: two to three seconds under exactly_once) before
it could say anything, and an abort is where the time matters: a ``query.stop()`` interrupts the query's thread, and
an abort still waiting on its Python worker then fails ("failed to abort"). So the worker that checked writes what the
checks found to a small file named for its JVM, and the others of that JVM read it instead of asking the brokers
again. The file holds no secret: only what the checks derived (the cluster id, the fitted producer settings that are
not secrets, the topics' limits, the schema plan); the options themselves, secrets included, are parsed again from
the data source's own. It lives in the user's own temporary directory, as :mod:`.last_write`'s does.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import tempfile
import time
from dataclasses import replace
from typing import Any

from recoverable_sink._logging import get_logger
from recoverable_sink.columns import SchemaPlan
from recoverable_sink.driver.last_write import ancestor_jvm
from recoverable_sink.options import DeadLetterTopic, SinkOptions, is_sensitive

log = get_logger("driver")


def key_of(options: dict[str, str], schema_json: str) -> str:
    """The checks' key: the options (secret values left out: a changed secret is met by the brokers) and schema.

    >>> a, b = ({"topic": "t", "kafka.sasl.password": p} for p in "ab")
    >>> key_of(a, "{}") == key_of(b, "{}") != key_of({**a, "topic": "u"}, "{}")
    True
    """
    shown = sorted((k.lower(), "***" if is_sensitive(k.lower().removeprefix("kafka.")) else v) for k, v in
                   options.items())
    return hashlib.sha256(json.dumps([shown, schema_json]).encode()).hexdigest()


def _path() -> str | None:
    jvm = ancestor_jvm()
    if jvm is None:
        return None
    return os.path.join(tempfile.gettempdir(), f"recoverable_kafka-{os.getuid()}", f"checks-{jvm}.json")


def _own_folder(folder: str) -> bool:
    """Whether ``folder`` is a directory of this user's alone (a shared temporary directory holds it)."""
    os.makedirs(folder, mode=0o700, exist_ok=True)
    info = os.lstat(folder)
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid() and not info.st_mode & 0o077


def save(key: str, options: SinkOptions, plan: SchemaPlan, cluster_id: str) -> None:
    """Keep what the checks of ``key`` found for the other Python workers of this JVM. Best effort."""
    path = _path()
    if path is None:
        return
    record = {"time": time.time(), "cluster_id": cluster_id,
              "producer": {k: v for k, v in options.producer_items if not is_sensitive(k)},
              "topic_max_message_bytes": options.topic_max_message_bytes,
              "dead_letter_max_bytes": options.errors.max_message_bytes
              if isinstance(options.errors, DeadLetterTopic) else None,
              "plan": {"columns": list(plan.columns), "topic_option": plan.topic_option,
                       "frames": [[c, f.hex()] for c, f in plan.frames],
                       "encodings": [list(e) for e in plan.encodings], "json_encoded": list(plan.json_encoded)}}
    try:
        if not _own_folder(os.path.dirname(path)):
            return
        kept = _read(path)
        kept[key] = record
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".checks-")
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump({k: v for k, v in kept.items() if time.time() - v["time"] < 3600}, out)
        os.replace(tmp, path)
    except OSError as exc:
        log.debug("could not share the driver's checks in %s: %s", path, exc)


def _read(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            found = json.load(f)
        return found if isinstance(found, dict) else {}
    except (OSError, ValueError):
        return {}


def load(key: str, parsed: SinkOptions, within_s: float) -> tuple[SinkOptions, SchemaPlan, str] | None:
    """What another worker of this JVM's checks of ``key`` found less than ``within_s`` ago, applied to ``parsed``
    (the options parsed again, secrets included); None when there is none."""
    path = _path()
    if path is None:
        return None
    found = _read(path).get(key)
    try:
        if not found or time.time() - float(found["time"]) >= within_s:
            return None
        producer = dict(parsed.producer_items) | found["producer"]
        options = replace(parsed, producer_items=tuple(sorted(producer.items())),
                          topic_max_message_bytes=found["topic_max_message_bytes"])
        if isinstance(parsed.errors, DeadLetterTopic):
            options = replace(options, errors=DeadLetterTopic(parsed.errors.topic, found["dead_letter_max_bytes"]))
        p = found["plan"]
        plan = SchemaPlan(columns=tuple(p["columns"]), topic_option=p["topic_option"],
                          frames=tuple((c, bytes.fromhex(f)) for c, f in p["frames"]),
                          encodings=tuple((c, s) for c, s in p["encodings"]), json_encoded=tuple(p["json_encoded"]))
        return options, plan, str(found["cluster_id"])
    except (KeyError, TypeError, ValueError) as exc:
        log.debug("the driver's shared checks in %s could not be read: %s", path, exc)
        return None
