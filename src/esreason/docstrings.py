"""Docstrings as the single source of the reference: read them from the source, compose ``help()``'s text.

Two conventions, each written once in the source and read here:

- a config field is documented by an *attribute docstring*, the string literal right after the
  field. Python keeps no such string at runtime, so :func:`declared_fields` reads the class
  source with :mod:`ast`.
- a parameter of a function or class is documented by an *entry* in its docstring: a line
  ``name: text`` (``a / b: text`` for several), continued on the lines below it; a blank line and
  unindented prose end the entries. A line ``Example::`` starts the example, a literal block of
  runnable code.

:func:`compose` builds the text ``help()`` shows from them: the docstring's prose, a
"Parameters" section (numpydoc's layout) giving each parameter's type and default from the
signature or the dataclass field and its meaning from the entry or attribute docstring, then the
example. docs/config.md (:mod:`esreason.config_docs`) and docs/api.md (:mod:`esreason.api_docs`)
are written from the same strings. Standard library only: :mod:`esreason.api` calls
:func:`document` at import time.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
import textwrap
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable, Sequence

#: ``name: text`` or ``a / b: text`` at the start of a line (the names are checked against the signature).
_ENTRY = re.compile(r"^(?P<names>[A-Za-z_]\w*(?:\s*/\s*[A-Za-z_]\w*)*):\s+(?P<text>\S.*)$")
#: The line that starts an example (reST's literal-block marker).
EXAMPLE_MARK = "Example::"


# --------------------------------------------------------------------------- reading the source


def _class_node(cls: type) -> ast.ClassDef:
    node = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0]
    assert isinstance(node, ast.ClassDef), cls
    return node


@lru_cache(maxsize=None)
def declared_fields(cls: type) -> dict[str, str | None]:
    """The fields ``cls`` itself declares (annotated assignments in its body, in order), each with the
    docstring right after it (None when there is none)."""
    out: dict[str, str | None] = {}
    body = _class_node(cls).body
    for i, stmt in enumerate(body):
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            nxt = body[i + 1] if i + 1 < len(body) else None
            is_doc = (isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
                      and isinstance(nxt.value.value, str))
            out[stmt.target.id] = inspect.cleandoc(nxt.value.value) if is_doc else None  # type: ignore[union-attr]
    return out


@lru_cache(maxsize=None)
def class_docstring(cls: type) -> str | None:
    """The docstring written in ``cls``'s source (not the signature dataclasses puts in ``__doc__``,
    nor the text :func:`document` composed)."""
    return ast.get_docstring(_class_node(cls))


def source_docstring(obj: Any) -> str | None:
    """The docstring written in the source of class or function ``obj``."""
    if isinstance(obj, type):
        return class_docstring(obj)
    node = ast.parse(textwrap.dedent(inspect.getsource(obj))).body[0]
    assert isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)), obj
    return ast.get_docstring(node)


def field_doc(cls: type, name: str) -> str | None:
    """The docstring of field ``name`` from the most derived class in ``cls``'s MRO that declares it."""
    for klass in cls.__mro__:
        if dataclasses.is_dataclass(klass) and name in declared_fields(klass):
            return declared_fields(klass)[name]
    return None


# --------------------------------------------------------------------------- parameter entries


@dataclass(frozen=True)
class Param:
    """One parameter as the reference shows it: name, type and default as Python writes them, meaning."""

    name: str
    type: str
    default: str
    """``repr`` of the default, or ``required``."""
    doc: str
    key: str | None = None
    """The YAML key a config field stands for (``es.sigma``), if any."""


@dataclass(frozen=True)
class Doc:
    """A docstring taken apart: prose before and after the parameter entries, the entries, the example."""

    before: str
    entries: dict[str, str]
    after: str
    example: str | None
    unknown: tuple[str, ...] = ()
    """Entries naming no parameter of the signature."""


def _names(match: re.Match) -> list[str]:
    return [n.strip() for n in match.group("names").split("/")]


def parse(doc: str | None, names: Sequence[str]) -> Doc:
    """Split docstring ``doc`` into prose, entries for the parameters ``names`` and the example.

    The entries are one block: from the first line ``name: text`` whose names are all parameters to
    the first unindented line after a blank line that is no entry. An entry continues on the lines
    below it (indented or not). Inside the block an entry naming something else is recorded in
    ``unknown``.
    """
    lines = inspect.cleandoc(doc or "").splitlines()
    example = None
    stripped = [line.strip() for line in lines]
    if EXAMPLE_MARK in stripped:
        at = stripped.index(EXAMPLE_MARK)
        example = textwrap.dedent("\n".join(lines[at + 1:])).strip("\n") or None
        lines = lines[:at]
    known = set(names)
    start = next((i for i, line in enumerate(lines)
                  if (m := _ENTRY.match(line)) and set(_names(m)) <= known), None)
    if start is None:
        return Doc("\n".join(lines).strip(), {}, "", example)
    texts: dict[str, list[str]] = {}
    unknown: list[str] = []
    current: list[str] = []
    end = len(lines)
    for i in range(start, len(lines)):
        line = lines[i]
        match = _ENTRY.match(line)
        if match:
            current = [match.group("text")]
            for name in _names(match):
                texts[name] = current  # ``a / b: text``: both share the text
                if name not in known:
                    unknown.append(name)
        elif line.strip() and not line.startswith((" ", "\t")) and not lines[i - 1].strip():
            end = i  # unindented prose after a blank line: the entries are over
            break
        else:  # a continuation line (indented, or right below the entry), or a blank line
            current.append(line.strip())
    entries = {name: _join(text) for name, text in texts.items() if name in known}
    return Doc("\n".join(lines[:start]).strip(), entries, "\n".join(lines[end:]).strip(), example,
               tuple(unknown))


def _join(text: list[str]) -> str:
    """An entry's lines as paragraphs (a blank line separates them)."""
    paragraphs = "\n".join(text).strip().split("\n\n")
    return "\n\n".join(" ".join(p.split()) for p in paragraphs)


# --------------------------------------------------------------------------- an object's parameters


def _annotation(annotation: Any) -> str:
    if annotation is inspect.Parameter.empty:
        return "Any"
    return annotation if isinstance(annotation, str) else inspect.formatannotation(annotation)


def _default(value: Any) -> str:
    return "required" if value is inspect.Parameter.empty or value is dataclasses.MISSING else repr(value)


def signature_names(obj: Any) -> list[str]:
    """The parameters of function ``obj`` or of class ``obj``'s constructor (``self`` left out;
    ``**changes`` is a parameter too)."""
    return list(inspect.signature(obj).parameters)


def params(obj: Any, keys: dict[str, str] | None = None) -> tuple[list[Param], Doc]:
    """(each parameter of ``obj`` with its type, default and meaning, the parsed docstring).

    A dataclass's parameters are its fields, documented by their attribute docstrings (``keys``:
    field -> the YAML key it stands for); anything else's are its signature's, documented by the
    entries of its docstring. A parameter without documentation has ``doc == ""``.
    """
    keys = keys or {}
    if dataclasses.is_dataclass(obj) and isinstance(obj, type):
        doc = parse(source_docstring(obj), [])
        out = [Param(f.name, _annotation(f.type),
                     _default(f.default if f.default_factory is dataclasses.MISSING else f.default_factory()),
                     field_doc(obj, f.name) or "", keys.get(f.name))
               for f in dataclasses.fields(obj)]
        return out, doc
    sig = inspect.signature(obj)
    doc = parse(source_docstring(obj), list(sig.parameters))
    out = []
    for name, p in sig.parameters.items():
        shown = {p.VAR_KEYWORD: f"**{name}", p.VAR_POSITIONAL: f"*{name}"}.get(p.kind, name)
        default = "" if p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL) else _default(p.default)
        out.append(Param(shown, _annotation(p.annotation), default, doc.entries.get(name, "")))
    return out, doc


def undocumented(obj: Any, keys: dict[str, str] | None = None) -> list[str]:
    """``Object.name`` for every parameter of ``obj`` without documentation, and for every docstring
    entry naming no parameter (a stale entry)."""
    where = getattr(obj, "__qualname__", repr(obj))
    found, doc = params(obj, keys)
    out = [f"{where}: parameter {p.name!r} has no documentation" for p in found if not p.doc]
    out += [f"{where}: the docstring documents {name!r}, which is not a parameter" for name in doc.unknown]
    return out


# --------------------------------------------------------------------------- help()'s text


def _param_lines(p: Param) -> list[str]:
    head = f"{p.name} : {p.type}"
    if p.default:
        head += f", default {p.default}" if p.default != "required" else ", required"
    if p.key:
        head += f"  (YAML key {p.key})"
    body = [textwrap.fill(par, 96, initial_indent="    ", subsequent_indent="    ")
            for par in p.doc.split("\n\n")] if p.doc else ["    (undocumented)"]
    return [head] + "\n\n".join(body).splitlines()


def compose(obj: Any, keys: dict[str, str] | None = None) -> str:
    """The text ``help(obj)`` shows: the prose of its docstring, a Parameters section with each
    parameter's type, default and meaning, the prose after the entries, and the example."""
    found, doc = params(obj, keys)
    out = [doc.before, "", "Parameters", "----------"]
    for p in found:
        out += _param_lines(p)
    if doc.after:
        out += ["", doc.after]
    if doc.example:
        out += ["", "Example", "-------", "", textwrap.indent(doc.example, "    ")]
    return "\n".join(out).strip() + "\n"


def document(*objects: Any, keys: Callable[[Any], dict[str, str] | None] = lambda obj: None) -> None:
    """Set each object's ``__doc__`` to :func:`compose`'s text (``keys(obj)``: its fields' YAML keys).

    Where the source cannot be read (a frozen application without ``.py`` files) the docstring is
    left as written: ``help()`` then shows the entries without types and defaults.
    """
    for obj in objects:
        try:
            obj.__doc__ = compose(obj, keys(obj))
        except (OSError, TypeError):
            continue


__all__ = ["EXAMPLE_MARK", "Doc", "Param", "class_docstring", "compose", "declared_fields", "document",
           "field_doc", "params", "parse", "signature_names", "source_docstring", "undocumented"]
