"""Schema Registry framing on the driver: each framed field's schema (Avro, Protobuf or JSON Schema) is registered
(or found, if the subject already holds it) once per write, before any task runs, and its id (and, for Protobuf,
the message's index list) goes to every task in the schema plan. A schema the registry refuses, or a registry that
does not answer, fails the write here, not in every task."""

from __future__ import annotations

import base64
import json
import re
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import replace

from pyspark.sql.types import BinaryType, DataType, StringType, StructType

from recoverable_sink._logging import get_logger
from recoverable_sink.columns import SchemaPlan
from recoverable_sink.driver.avro_schema import avro_schema_for, check_given
from recoverable_sink.errors import OptionError, SchemaError
from recoverable_sink.options import JsonWire, ProtobufWire, RegistryFraming, SinkOptions

log = get_logger("schema")

MAGIC = b"\x00"


def frame_with_registry(options: SinkOptions, plan: SchemaPlan, schema: StructType) -> SchemaPlan:
    """The plan with each framed field's prefix: magic byte 0, the schema id in 4 big-endian bytes, and for
    Protobuf the message's index list."""
    if not options.registry:
        return plan
    frames, encodings, as_json = [], [], []
    for framing in options.registry:
        wire = framing.wire
        suffix = b""
        if isinstance(wire, ProtobufWire):
            text, encode = wire.schema, False
            _check_binary(framing, schema, "serialised Protobuf messages (to_protobuf's output)")
            _, indexes = protobuf_message(wire.schema, wire.message, framing.field)
            suffix = encode_indexes(indexes)
        elif isinstance(wire, JsonWire):
            text = wire.schema
            encode = _json_column(framing, schema)
            if encode:
                as_json.append(framing.field)
        else:
            text, encode = _avro_schema(framing, schema)
            if encode:
                encodings.append((framing.field, text))
        subject = subject_for(framing, options.topic, text)
        schema_id = register(framing, text, subject, options.preflight_timeout_s, options)
        log.info("%s records framed for the Schema Registry (%s)%s: subject %s, schema id %d", framing.field,
                 _type_of(framing).lower(), ", encoded by the sink" if encode else "", subject, schema_id)
        frames.append((framing.field, MAGIC + schema_id.to_bytes(4, "big") + suffix))
    return replace(plan, frames=tuple(frames), encodings=tuple(encodings), json_encoded=tuple(as_json))


def _type_of(framing: RegistryFraming) -> str:
    """The registry's schemaType for the field's wire format."""
    wire = framing.wire
    return "PROTOBUF" if isinstance(wire, ProtobufWire) else "JSON" if isinstance(wire, JsonWire) else "AVRO"


def _column_type(framing: RegistryFraming, schema: StructType) -> DataType:
    names = {f.name: f.dataType for f in schema.fields}
    if framing.field not in names:
        raise SchemaError(f"option {framing.field}.schema.registry.url is set but the DataFrame has no "
                          f"{framing.field} column; add one, or remove the option")
    return names[framing.field]


def _check_binary(framing: RegistryFraming, schema: StructType, what: str) -> None:
    dtype = _column_type(framing, schema)
    if not isinstance(dtype, BinaryType):
        raise SchemaError(f"column {framing.field} has type {dtype.simpleString()}; with "
                          f"{framing.field}.schema.type=protobuf the sink takes a binary column of {what}")


def _json_column(framing: RegistryFraming, schema: StructType) -> bool:
    """Whether the sink writes the JSON itself (a struct column); a string or binary column holds JSON already."""
    dtype = _column_type(framing, schema)
    if isinstance(dtype, StructType):
        return True
    if isinstance(dtype, StringType | BinaryType):
        return False
    raise SchemaError(f"column {framing.field} has type {dtype.simpleString()}; with "
                      f"{framing.field}.schema.type=json the sink takes a struct (written as JSON by the sink) or "
                      "JSON text (to_json's output, a string or binary column)")


def protobuf_message(proto: str, message: str | None, field: str = "value") -> tuple[str, list[int]]:
    """The full name of ``message`` (None: the file's first) in a ``.proto`` source, and its index list as
    Confluent's wire format carries it: the message's position among its file's (or its enclosing message's)
    messages, from the top.

    >>> src = 'syntax = "proto3"; package a.b; message X { message Y {} message Z {} } message W {}'
    >>> protobuf_message(src, None), protobuf_message(src, "X.Z"), protobuf_message(src, "a.b.W")
    (('a.b.X', [0]), ('a.b.X.Z', [0, 1]), ('a.b.W', [1]))
    """
    text = re.sub(r"//[^\n]*|/\*.*?\*/", " ", proto, flags=re.S)
    text = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'', '""', text)
    package = m.group(1) if (m := re.search(r"\bpackage\s+([\w.]+)\s*;", text)) else ""
    found: dict[str, list[int]] = {}
    order: list[str] = []
    stack: list[tuple[str | None, list[int], int]] = [(None, [], 0)]  # (message name or None, path, children)
    tokens = re.findall(r"[A-Za-z_][\w.]*|[{};]", text)
    i = 0
    while i < len(tokens):
        token = tokens[i]
        starts = i == 0 or tokens[i - 1] in ("{", "}", ";")  # a declaration, not a field named "message"
        if token == "message" and starts and i + 2 < len(tokens) and tokens[i + 2] == "{":
            name, (parent, path, children) = tokens[i + 1], stack[-1]
            stack[-1] = (parent, path, children + 1)
            full = ".".join(n for n in [*(s[0] for s in stack[1:] if s[0]), name] if n)
            found[full] = [*path, children]
            order.append(full)
            stack.append((name, [*path, children], 0))
            i += 3
            continue
        if token == "{":
            stack.append((None, stack[-1][1], 0) if stack[-1][0] is None else ("", stack[-1][1], 0))
        elif token == "}" and len(stack) > 1:
            stack.pop()
        i += 1
    if not order:
        raise OptionError(f"option {field}.protobuf.schema declares no message")
    if message is None:
        chosen = order[0]
    else:
        wanted = message[len(package) + 1:] if package and message.startswith(package + ".") else message
        if wanted not in found:
            raise OptionError(f"option {field}.protobuf.message={message!r} is not a message of "
                              f"{field}.protobuf.schema (it declares {', '.join(order)})")
        chosen = wanted
    return (f"{package}.{chosen}" if package else chosen), found[chosen]


def encode_indexes(indexes: list[int]) -> bytes:
    """Confluent's encoding of a Protobuf message's index list: [0] (the first message, the common case) as one 0
    byte; otherwise the count, then each index, as zigzag varints.

    >>> encode_indexes([0]).hex(), encode_indexes([1]).hex(), encode_indexes([0, 1]).hex()
    ('00', '0202', '040002')
    """
    if indexes == [0]:
        return b"\x00"
    return b"".join(_varint(2 * n) for n in [len(indexes), *indexes])


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def subject_for(framing: RegistryFraming, topic: str | None, avro_schema: str) -> str:
    """The subject the field's schema is registered under: the field's subject option, else Confluent's subject
    name strategy (TopicNameStrategy: ``<topic>-<field>``; RecordNameStrategy: the record's full name, the
    Protobuf message's or the JSON Schema's title; TopicRecordNameStrategy: both)."""
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
    """The full name (namespace.name) of the Avro record ``avro_schema`` describes (the Protobuf message's full name,
    the JSON Schema's title), for the strategies that name subjects by it; an OptionError where there is none."""
    wire = framing.wire
    if isinstance(wire, ProtobufWire):
        return protobuf_message(wire.schema, wire.message, framing.field)[0]
    if isinstance(wire, JsonWire):
        title = json.loads(wire.schema).get("title") if isinstance(json.loads(wire.schema), dict) else None
        if not title:
            raise OptionError(f"option {framing.field}.subject.name.strategy={framing.strategy} names the subject by "
                              f"the schema's title, and {framing.field}.json.schema has none; set "
                              f"{framing.field}.subject, or use TopicNameStrategy")
        return str(title)
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
    kind = _type_of(framing)
    body = json.dumps({"schema": avro_schema, **({"schemaType": kind} if kind != "AVRO" else {})}).encode()
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
            f"{framing.field}.{kind.lower()}.schema" if kind != "AVRO" else \
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
