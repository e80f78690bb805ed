"""The type stubs of the C extensions (recoverable_sink/_produce.pyi, _digests.pyi) name exactly what the built
modules define (every function, class and method) and give each the parameters the C side takes: the names, kinds
(positional-only, positional-or-keyword, keyword-only) and which have defaults.

Where a function declares its signature in its doc (CPython's ``__text_signature__``, read by inspect.signature),
the stub is checked against that, and that against the PyArg_ParseTuple format of the C function behind it (a doc
is only a doc: the format is what the call accepts). Where it declares none (a type's ``tp_init``), the stub is
checked against the keyword list and format its PyArg_ParseTupleAndKeywords parses, read from
recoverable_sink/native/*.c. A function with neither is reported too."""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

PACKAGE = Path(__file__).resolve().parents[3] / "recoverable_sink"
NATIVE = PACKAGE / "native"
EXTENSIONS = ["_produce", "_digests"]


def _import(name: str) -> ModuleType:
    try:
        return importlib.import_module(f"recoverable_sink.{name}")
    except ImportError:
        pytest.skip(f"recoverable_sink.{name} is not built here")


def _sources(name: str) -> list[Path]:
    """The C files an extension is built from: _produce.c, _produce_producer.c, ... (pyproject.toml)."""
    return sorted(NATIVE.glob(f"{name}*.c"))


# ---- names ------------------------------------------------------------------------------------------------------

def _stub_defs(path: Path) -> dict[str, ast.FunctionDef | dict[str, ast.FunctionDef]]:
    """Top-level functions of a stub, and its classes' methods (public ones, __init__ and __len__); Protocols are
    the stub's own and left out."""
    found: dict[str, ast.FunctionDef | dict[str, ast.FunctionDef]] = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef):
            found[node.name] = node
        elif isinstance(node, ast.ClassDef) and not any(getattr(b, "id", "") == "Protocol" for b in node.bases):
            found[node.name] = {n.name: n for n in node.body if isinstance(n, ast.FunctionDef)
                                and (not n.name.startswith("_") or n.name in ("__init__", "__len__"))}
    return found


def _stub(path: Path) -> dict[str, set[str] | None]:
    """Top-level names of a stub, each with its methods (None for a function)."""
    return {name: None if isinstance(d, ast.FunctionDef) else set(d) for name, d in _stub_defs(path).items()}


def _runtime(module: object) -> dict[str, set[str] | None]:
    found: dict[str, set[str] | None] = {}
    for name in dir(module):
        if name.startswith("_"):
            continue
        value = getattr(module, name)
        if isinstance(value, type):
            found[name] = {m for m in vars(value) if not m.startswith("_")} | {"__init__"} | \
                ({"__len__"} if "__len__" in vars(value) else set())
        elif callable(value):
            found[name] = None
    return found


@pytest.mark.parametrize("name", EXTENSIONS)
def test_the_stub_names_what_the_built_extension_defines(name):
    module = _import(name)
    assert _stub(PACKAGE / f"{name}.pyi") == _runtime(module)


# ---- signatures -------------------------------------------------------------------------------------------------

POSITIONAL_ONLY, POSITIONAL_OR_KEYWORD, KEYWORD_ONLY = "positional-only", "positional-or-keyword", "keyword-only"
VAR_POSITIONAL, VAR_KEYWORD = "*args", "**kwargs"
_NONE, _UNKNOWN = object(), object()  # no default; a default whose value is not given (`...`, a C variable)
_SLOTS = {"__len__"}  # type slots, whose signatures CPython fixes, not the C code


@dataclass(frozen=True)
class Param:
    """One parameter, as the stub, the runtime or the C parser has it."""

    name: str  # "" where the C side names none (a positional-only entry of a keyword list)
    kind: str
    default: object = _NONE

    def matches(self, other: Param) -> bool:
        if self.kind != other.kind or (self.default is _NONE) != (other.default is _NONE):
            return False
        if self.name and other.name and self.name != other.name:
            return False
        known = self.default not in (_NONE, _UNKNOWN) and other.default not in (_NONE, _UNKNOWN)
        return not known or self.default == other.default


def _render(params: list[Param]) -> str:
    parts: list[str] = []
    for i, p in enumerate(params):
        if p.kind == KEYWORD_ONLY and (i == 0 or params[i - 1].kind not in (KEYWORD_ONLY, VAR_POSITIONAL)):
            parts.append("*")
        prefix = {VAR_POSITIONAL: "*", VAR_KEYWORD: "**"}.get(p.kind, "")
        default = "" if p.default is _NONE else "=..." if p.default is _UNKNOWN else f"={p.default!r}"
        parts.append(f"{prefix}{p.name or '?'}{default}")
        if p.kind == POSITIONAL_ONLY and (i + 1 == len(params) or params[i + 1].kind != POSITIONAL_ONLY):
            parts.append("/")
    return f"({', '.join(parts)})"


def _same(a: list[Param], b: list[Param]) -> bool:
    return len(a) == len(b) and all(x.matches(y) for x, y in zip(a, b, strict=True))


def _stub_params(node: ast.FunctionDef, method: bool) -> list[Param]:
    """The stub's parameters, without a method's ``self``."""
    args = node.args

    def default(expr: ast.expr | None) -> object:
        if expr is None:
            return _NONE
        try:
            value = ast.literal_eval(expr)
        except (ValueError, TypeError, SyntaxError):  # not a literal: a name, a call
            return _UNKNOWN
        return _UNKNOWN if value is Ellipsis else value

    positional = [*args.posonlyargs, *args.args]
    defaults = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    params = [Param(a.arg, POSITIONAL_ONLY if i < len(args.posonlyargs) else POSITIONAL_OR_KEYWORD, default(d))
              for i, (a, d) in enumerate(zip(positional, defaults, strict=True))]
    if args.vararg is not None:
        params.append(Param(args.vararg.arg, VAR_POSITIONAL))
    params += [Param(a.arg, KEYWORD_ONLY, default(d)) for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True)]
    if args.kwarg is not None:
        params.append(Param(args.kwarg.arg, VAR_KEYWORD))
    return params[1:] if method else params


_KINDS = {inspect.Parameter.POSITIONAL_ONLY: POSITIONAL_ONLY,
          inspect.Parameter.POSITIONAL_OR_KEYWORD: POSITIONAL_OR_KEYWORD,
          inspect.Parameter.KEYWORD_ONLY: KEYWORD_ONLY, inspect.Parameter.VAR_POSITIONAL: VAR_POSITIONAL,
          inspect.Parameter.VAR_KEYWORD: VAR_KEYWORD}


def _runtime_params(obj: Any, method: bool) -> list[Param] | None:
    """The parameters the runtime declares (its text signature), without a method's ``self``; None where it
    declares none, or only a slot wrapper's catch-all ``(self, /, *args, **kwargs)``."""
    try:
        signature = inspect.signature(obj)
    except ValueError:
        return None
    params = [Param(p.name, _KINDS[p.kind], _NONE if p.default is p.empty else p.default)
              for p in signature.parameters.values()]
    params = params[1:] if method else params
    if [p.kind for p in params] == [VAR_POSITIONAL, VAR_KEYWORD]:
        return None
    return params


@dataclass(frozen=True)
class Parser:
    """How a C function takes its arguments: its METH_ flags (None: a type slot) and the format and keyword list
    of its PyArg_Parse* call (None: it parses none)."""

    flags: str | None
    fmt: str | None
    keywords: list[str] | None

    def params(self) -> list[Param] | None:
        """The parameters the parser takes: names from the keyword list (else ""), kinds from the flags and the
        format's "|" (optional from there) and "$" (keyword-only from there); None for a format it cannot read."""
        if self.flags is not None and "METH_NOARGS" in self.flags:
            return []
        if self.flags is not None and "METH_O" in self.flags.split("|"):
            return [Param("", POSITIONAL_ONLY)]
        if self.fmt is None:
            return None
        count, optional, keyword_only = _format_units(self.fmt)
        names = self.keywords if self.keywords is not None else [""] * count
        if len(names) != count:
            return None
        return [Param(name, KEYWORD_ONLY if keyword_only is not None and i >= keyword_only
                      else POSITIONAL_ONLY if not name else POSITIONAL_OR_KEYWORD,
                      _UNKNOWN if optional is not None and i >= optional else _NONE)
                for i, name in enumerate(names)]


def _format_units(fmt: str) -> tuple[int, int | None, int | None]:
    """(arguments, index of the first optional one, of the first keyword-only one) of a PyArg_Parse* format."""
    count, optional, keyword_only, i = 0, None, None, 0
    while i < len(fmt) and fmt[i] not in ":;":
        c = fmt[i]
        i += 1
        if c == "|":
            optional = count
        elif c == "$":
            keyword_only = count
        elif c == "(":  # a tuple is one argument
            depth = 1
            while depth:
                depth += {"(": 1, ")": -1}.get(fmt[i], 0)
                i += 1
            count += 1
        else:
            i += 1 if c == "e" else 0  # es, et: two letters
            while i < len(fmt) and fmt[i] in "#!&*":
                i += 1
            count += 1
    return count, optional, keyword_only


def _strip_comments(text: str) -> str:
    return re.sub(r"/\*.*?\*/|//[^\n]*", " ", text, flags=re.S)


def _body(text: str, function: str) -> str | None:
    """The body of a C function: its definition, or the #define that makes it (``Producer_##method`` in
    ``TXN_TIMED(init_transactions, ...)``)."""
    found = re.search(rf"\b{function}\s*\((?:[^;{{}}()]|\([^()]*\))*\)\s*\{{", text)  # Py_UNUSED(self) too
    if found is not None:
        depth, i = 1, found.end()
        while depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        return text[found.end():i]
    for macro, param, body in re.findall(r"#define (\w+)\((\w+)[^)]*\)((?:[^\n]*\\\n)*[^\n]*)", text):
        made = re.search(rf"(\w*)##{param}\s*\(", body)
        if made and function.startswith(made.group(1)) and \
                re.search(rf"\b{macro}\(\s*{function[len(made.group(1)):]}\s*,", text):
            return body.replace("\\\n", "\n")
    return None


def _parser(text: str, function: str, flags: str | None) -> Parser:
    body = _body(text, function) or ""
    call = re.search(r'PyArg_ParseTupleAndKeywords\(\s*\w+\s*,\s*\w+\s*,\s*"([^"]*)"\s*,\s*(\w+)', body)
    if call is not None:
        listed = re.search(rf"\*\s*{call.group(2)}\s*\[\]\s*=\s*\{{([^}}]*)\}}", body)
        names = re.findall(r'"(\w*)"', listed.group(1)) if listed else None
        return Parser(flags, call.group(1), names)
    call = re.search(r'PyArg_ParseTuple\(\s*\w+\s*,\s*"([^"]*)"', body)
    return Parser(flags, call.group(1) if call else None, None)


def c_parsers(sources: list[Path]) -> dict[str, Parser]:
    """Each function and method the C sources define, by its Python name ("load", "Producer.send",
    "Producer.__init__"), with how it parses its arguments."""
    text = _strip_comments("\n".join(p.read_text() for p in sources))
    tables = {name: re.findall(r'\{\s*"(\w+)"\s*,\s*(?:\(\w+\)\s*)?(\w+)\s*,\s*([\w| ]+?)\s*,', body)
              for name, body in re.findall(r"PyMethodDef\s+(\w+)\s*\[\]\s*=\s*\{(.*?)\n\};", text, re.S)}
    owners: dict[str, str] = {}  # method table -> "Class." or "" (the module's)
    inits: dict[str, str] = {}  # class -> its tp_init function
    slots = {name: dict(re.findall(r"\{\s*(Py_\w+)\s*,\s*(?:\(\w+\)\s*)?(\w+)\s*\}", body))
             for name, body in re.findall(r"PyType_Slot\s+(\w+)\s*\[\]\s*=\s*\{(.*?)\n\};", text, re.S)}
    for spec in re.findall(r"PyType_Spec\s+\w+\s*=\s*\{(.*?)\};", text, re.S):
        cls = re.search(r'\.name\s*=\s*"[\w.]*?(\w+)"', spec)
        uses = re.search(r"\.slots\s*=\s*(\w+)", spec)
        if cls and uses and uses.group(1) in slots:
            type_slots = slots[uses.group(1)]
            if "Py_tp_methods" in type_slots:
                owners[type_slots["Py_tp_methods"]] = f"{cls.group(1)}."
            if "Py_tp_init" in type_slots:
                inits[cls.group(1)] = type_slots["Py_tp_init"]
    for module_def in re.findall(r"PyModuleDef\s+\w+\s*=\s*\{(.*?)\};", text, re.S):
        listed = re.search(r"\.m_methods\s*=\s*(\w+)", module_def)
        if listed:
            owners[listed.group(1)] = ""
    found = {f"{owners[table]}{name}": _parser(text, function, flags.replace(" ", ""))
             for table, entries in tables.items() if table in owners for name, function, flags in entries}
    found |= {f"{cls}.__init__": _parser(text, function, None) for cls, function in inits.items()}
    return found


def signature_mismatches(stub: Path, module: ModuleType, sources: list[Path]) -> list[str]:
    """Where the stub's parameters differ from what the built module and its C sources take, one line each."""
    parsers = c_parsers(sources)
    problems: list[str] = []
    for name, found in _stub_defs(stub).items():
        defs = {name: (found, getattr(module, name, None), False)} if isinstance(found, ast.FunctionDef) else \
            {f"{name}.{m}": (node, getattr(getattr(module, name, None), m, None), True) for m, node in found.items()}
        for qualname, (node, obj, method) in defs.items():
            ours = _stub_params(node, method)
            parser = parsers.get(qualname)
            parsed = parser.params() if parser is not None else None
            if qualname.endswith(".__init__"):  # a type's text signature is its own (tp_doc), not __init__'s
                obj = getattr(module, name)
                method = False
            theirs = _runtime_params(obj, method) if obj is not None else None
            where, slot = f"{module.__name__}.{qualname}", qualname.split(".")[-1] in _SLOTS
            if theirs is not None:
                if not _same(ours, theirs):
                    problems.append(f"{where}: the stub has {_render(ours)}, the runtime {_render(theirs)}")
                if parsed is None and not slot:
                    problems.append(f"{where}: no C function that parses its arguments found in the sources")
                elif parsed is not None and not _same(theirs, parsed):
                    problems.append(f"{where}: its text signature {_render(theirs)} is not what its C parser takes "
                                    f"{_render(parsed)}")
            elif parser is not None and parsed is not None and (parser.keywords is not None or not parsed):
                if not _same(ours, parsed):
                    problems.append(f"{where}: the stub has {_render(ours)}, the C parser {_render(parsed)}")
            elif not slot:
                problems.append(f"{where}: the C side declares no signature (no text signature in its doc, no "
                                "keyword list): add one, as recoverable_sink/native/_produce.c's docs do")
    return problems


@pytest.mark.parametrize("name", EXTENSIONS)
def test_the_stub_gives_each_function_the_parameters_the_extension_takes(name):
    module = _import(name)
    assert signature_mismatches(PACKAGE / f"{name}.pyi", module, _sources(name)) == []


def test_the_c_sources_are_read_for_every_function_and_method():
    parsers = c_parsers(_sources("_produce")) | c_parsers(_sources("_digests"))
    assert parsers["Producer.__init__"] == Parser(None, "O!|p", ["config", "offsets"])
    assert parsers["Producer.init_transactions"].fmt == "d"  # made by the TXN_TIMED macro
    assert parsers["Producer.purge"].params() == []
    assert {n for n, p in parsers.items() if p.params() is None} == set()


# A stub or a C source changed in one place, and the line the checker must then report.
@pytest.mark.parametrize(("file", "old", "new", "reported"), [
    ("_produce.pyi", "def poll(self, timeout: float = 0, /)", "def poll(self, wait: float = 0, /)",
     "_produce.Producer.poll: the stub has (wait=0, /), the runtime (timeout=0, /)"),
    ("_produce.pyi", "def load(path: str, /)", "def load(path: str)",
     "_produce.load: the stub has (path), the runtime (path, /)"),
    ("_produce.pyi", "def flush(self, timeout: float = -1, /)", "def flush(self, timeout: float, /)",
     "_produce.Producer.flush: the stub has (timeout, /), the runtime (timeout=-1, /)"),
    ("_produce.pyi", "def poll(self, timeout: float = 0, /)", "def poll(self, timeout: float = 1, /)",
     "_produce.Producer.poll: the stub has (timeout=1, /), the runtime (timeout=0, /)"),
    ("_digests.pyi", "def records(prefix: bytes, count: int, fields: tuple[Field, ...], /)",
     "def records(prefix: bytes, count: int, /)",
     "_digests.records: the stub has (prefix, count, /), the runtime (prefix, count, fields, /)"),
    # Producer.__init__ has no text signature: it is checked against its keyword list.
    ("_produce.pyi", "def __init__(self, config: dict[str, str], offsets",
     "def __init__(self, conf: dict[str, str], offsets",
     "_produce.Producer.__init__: the stub has (conf, offsets=False), the C parser (config, offsets=...)"),
    ("_produce.pyi", "offsets: bool = False) -> None", "*, offsets: bool = False) -> None",
     "_produce.Producer.__init__: the stub has (config, *, offsets=False), the C parser (config, offsets=...)"),
    ("_produce_producer.c", '{"config", "offsets", NULL}', '{"config", "offset", NULL}',
     "_produce.Producer.__init__: the stub has (config, offsets=False), the C parser (config, offset=...)"),
    # A doc's signature that the C function's own parsing does not take.
    ("_produce_producer.c", 'int served;\n    if (!PyArg_ParseTuple(args, "|d"',
     'int served;\n    if (!PyArg_ParseTuple(args, "d"',
     "_produce.Producer.poll: its text signature (timeout=0, /) is not what its C parser takes (?, /)"),
])
def test_a_stub_or_c_source_that_differs_is_reported(tmp_path, file, old, new, reported):
    name = "_digests" if file.startswith("_digests") else "_produce"
    module = _import(name)
    stub, sources = tmp_path / f"{name}.pyi", []
    shutil.copy(PACKAGE / f"{name}.pyi", stub)
    for source in _sources(name):
        sources.append(tmp_path / source.name)
        shutil.copy(source, sources[-1])
    changed = stub if file.endswith(".pyi") else tmp_path / file
    text = changed.read_text()
    assert text.count(old) == 1
    changed.write_text(text.replace(old, new))
    assert signature_mismatches(stub, module, sources) == [f"recoverable_sink.{reported}"]


class _Unsigned:
    """A callable whose signature inspect cannot find, as a C function's without a text signature."""

    @property
    def __signature__(self) -> inspect.Signature:
        raise ValueError("no signature found")

    def __call__(self, *args: object) -> None:
        return None


def test_a_function_that_declares_no_signature_is_reported(tmp_path):
    stub = tmp_path / "plain.pyi"
    stub.write_text("def opaque(a: int, /) -> None: ...\n")
    module = ModuleType("plain")
    module.opaque = _Unsigned()  # type: ignore[attr-defined]
    assert signature_mismatches(stub, module, []) == [
        "plain.opaque: the C side declares no signature (no text signature in its doc, no keyword list): add one, "
        "as recoverable_sink/native/_produce.c's docs do"]
