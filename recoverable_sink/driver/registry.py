"""Schema Registry framing on the driver: each framed field's Avro schema is registered (or found, if the subject
already holds it) once per write, before any task runs, and its id goes to every task in the schema plan. A schema
the registry refuses, or a registry that does not answer, fails the write here, not in every task."""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import replace

from pyspark.sql.types import BinaryType, StructType

from recoverable_sink._logging import get_logger
from recoverable_sink.columns import SchemaPlan
from recoverable_sink.driver.avro_schema import avro_schema_for, check_given
from recoverable_sink.errors import OptionError, SchemaError
from recoverable_sink.options import RegistryFraming, SinkOptions

log = get_logger("schema")

MAGIC = b"\x00"


def frame_with_registry(options: SinkOptions, plan: SchemaPlan, schema: StructType) -> SchemaPlan:
    """The plan with each framed field's prefix (magic byte 0, then the schema id in 4 big-endian bytes)."""
    if not options.registry:
        return plan
    frames, encodings = [], []
    for framing in options.registry:
        avro_schema, encode = _avro_schema(framing, schema)
        subject = subject_for(framing, options.topic, avro_schema)
        schema_id = register(framing, avro_schema, subject, options.preflight_timeout_s, options)
        log.info("%s records framed for the Schema Registry%s: subject %s, schema id %d", framing.field,
                 ", encoded as Avro by the sink" if encode else "", subject, schema_id)
        frames.append((framing.field, MAGIC + schema_id.to_bytes(4, "big")))
        if encode:
            encodings.append((framing.field, avro_schema))
    return replace(plan, frames=tuple(frames), encodings=tuple(encodings))


def subject_for(framing: RegistryFraming, topic: str | None, avro_schema: str) -> str:
    """The subject ``avro_schema`` is registered under: the field's subject option, else Confluent's subject name
    strategy (TopicNameStrategy: ``<topic>-<field>``; RecordNameStrategy: the record's full name;
    TopicRecordNameStrategy: both)."""
    if framing.subject:
        return framing.subject
    if framing.strategy == "RecordNameStrategy":
        return record_name(framing, avro_schema)
    if topic is None:
        raise OptionError(f"option {framing.field}.schema.registry.url: the records name their topic in a column, "
                          f"so {framing.strategy} has no topic to name the subject by; set {framing.field}.subject, or "
                          f"{framing.field}.subject.name.strategy=RecordNameStrategy")
    if framing.strategy == "TopicRecordNameStrategy":
        return f"{topic}-{record_name(framing, avro_schema)}"
    return f"{topic}-{framing.field}"


def record_name(framing: RegistryFraming, avro_schema: str) -> str:
    """The full name (namespace.name) of the Avro record ``avro_schema`` describes, for the strategies that name
    subjects by it; an OptionError for a schema that is not a named record."""
    schema = json.loads(avro_schema)
    if not isinstance(schema, dict) or schema.get("type") != "record" or not schema.get("name"):
        raise OptionError(f"option {framing.field}.subject.name.strategy={framing.strategy} names the subject by "
                          f"the record's name, and {framing.field}.avro.schema is not a named record; set "
                          f"{framing.field}.subject, or use TopicNameStrategy")
    name = str(schema["name"])
    namespace = schema.get("namespace")
    return name if "." in name or not namespace else f"{namespace}.{name}"


def _avro_schema(framing: RegistryFraming, schema: StructType) -> tuple[str, bool]:
    """The field's Avro schema (JSON), and whether the sink encodes the column itself: a struct column, by the
    schema derived from its Spark type unless one is given; a binary column holds to_avro's bytes already."""
    names = {f.name: f.dataType for f in schema.fields}
    if framing.field not in names:
        raise SchemaError(f"option {framing.field}.schema.registry.url is set but the DataFrame has no "
                          f"{framing.field} column; add one (a struct, or to_avro(...).alias('{framing.field}')), "
                          "or remove the option")
    dtype = names[framing.field]
    if isinstance(dtype, StructType):
        derived = avro_schema_for(framing.field, dtype)
        if framing.avro_schema is not None:
            check_given(framing.field, json.loads(framing.avro_schema), derived)
            return framing.avro_schema, True
        if framing.strategy != "TopicNameStrategy" and not framing.subject:
            raise SchemaError(f"{framing.field}.subject.name.strategy={framing.strategy} names the subject by the "
                              f"record's name, and the record derived from column {framing.field} is Spark's "
                              f"'{derived['name']}' (every derived record is): set {framing.field}.subject, or give "
                              f"{framing.field}.avro.schema with a record name of yours")
        return json.dumps(derived), True
    if isinstance(dtype, BinaryType):
        if framing.avro_schema is None:
            raise SchemaError(f"column {framing.field} is binary, which the sink takes as to_avro's output: set "
                              f"{framing.field}.avro.schema to the schema (JSON) given to to_avro, or pass the "
                              "struct itself and let the sink encode it")
        return framing.avro_schema, False
    raise SchemaError(f"column {framing.field} has type {dtype.simpleString()}; with "
                      f"{framing.field}.schema.registry.url the sink takes a struct (encoded as Avro by the sink) "
                      f"or Avro binary from to_avro(struct(...), schema) with {framing.field}.avro.schema")


def register(framing: RegistryFraming, avro_schema: str, subject: str, timeout_s: float, options: SinkOptions) -> int:
    """The id of ``avro_schema`` under ``subject``: registered as a new version unless the subject already holds
    it (the registry answers with the existing id then)."""
    url = f"{framing.url}/subjects/{urllib.parse.quote(subject, safe='')}/versions"
    body = json.dumps({"schema": avro_schema}).encode()
    request = urllib.request.Request(url, data=body, method="POST",
                                     headers={"Content-Type": "application/vnd.schemaregistry.v1+json",
                                              "Accept": "application/vnd.schemaregistry.v1+json, application/json"})
    if framing.user_info:
        request.add_header("Authorization", "Basic " + base64.b64encode(framing.user_info.encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=max(1.0, timeout_s)) as response:
            answer = json.loads(response.read())
    except urllib.error.HTTPError as exc:
        reason = _reason(exc)
        which = f"{framing.field}.avro.schema" if framing.avro_schema is not None else \
            f"the schema derived from column {framing.field}"
        if exc.code == 409:
            raise SchemaError(f"the Schema Registry at {framing.url} refused {which} for subject {subject} as "
                              f"incompatible with the versions it holds: {reason}. Make the schema compatible (or "
                              "change the subject's compatibility), then write again") from None
        if exc.code == 422:
            hint = "" if framing.avro_schema is not None else \
                " (a derived record takes the column's field names, which Avro allows only as [A-Za-z_][A-Za-z0-9_]*)"
            raise SchemaError(f"the Schema Registry at {framing.url} refused {which} for subject {subject} as "
                              f"invalid: {reason}{hint}") from None
        if exc.code in (401, 403):
            check = f"check {framing.field}.schema.registry.basic.auth.user.info" if framing.user_info else \
                f"set {framing.field}.schema.registry.basic.auth.user.info to user:password"
            raise OptionError(f"the Schema Registry at {framing.url} refused access to subject {subject} "
                              f"(HTTP {exc.code}: {reason}); {check}") from None
        raise OptionError(options.scrub(f"the Schema Registry at {framing.url} answered HTTP {exc.code} registering "
                                        f"subject {subject}: {reason}")) from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        cause = getattr(exc, "reason", exc)
        what = f"did not answer within {timeout_s:g} s (preflight.timeoutMs)" if isinstance(cause, TimeoutError) \
            else f"could not be reached ({cause})"
        raise OptionError(options.scrub(
            f"the Schema Registry at {framing.url} ({framing.field}.schema.registry.url) {what}; check the URL and "
            "that the registry runs")) from None
    schema_id = answer.get("id") if isinstance(answer, dict) else None
    if not isinstance(schema_id, int) or not 0 <= schema_id < 2**31:
        raise OptionError(f"the Schema Registry at {framing.url} answered {answer!r} registering subject {subject}, "
                          "with no schema id")
    return schema_id


def _reason(exc: urllib.error.HTTPError) -> str:
    try:
        body = json.loads(exc.read())
    except (ValueError, OSError):
        return exc.reason if isinstance(exc.reason, str) else str(exc)
    if isinstance(body, dict):
        return str(body.get("message") or body.get("detail") or body)
    return str(body)
