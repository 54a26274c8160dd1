"""docs/api.md, the Python API reference, written from the same docstrings ``help()`` shows.

:func:`esreason.docstrings.document` composes the ``__doc__`` of ``ESConfig``, ``ESTrainer``,
``GRPOComparator`` and ``evaluate`` when :mod:`esreason.api` is imported; this module writes the
same parts (prose, each parameter's type, default and meaning, the example) as Markdown, plus the
public methods. A config field that stands for a YAML key is listed with its key, linked to the key's
entry in docs/config.md, and its default (its meaning is stated there, once). ``scripts/api_doc.py`` writes the file; tests/test_api_doc.py fails when it is
stale or a parameter has no documentation.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

from esreason.config_docs import markdown, slug
from esreason.docstrings import Param, params, source_docstring, undocumented

#: Where the reference lives, relative to the repository root.
DOC_PATH = Path("docs") / "api.md"


def api_objects() -> list[tuple[str, Any]]:
    """(public name, object) of every documented entry point, in reading order."""
    from esreason.api import ESConfig, ESTrainer, GRPOComparator, evaluate

    return [("esreason.ESConfig", ESConfig), ("esreason.ESTrainer", ESTrainer),
            ("esreason.GRPOComparator", GRPOComparator), ("esreason.evaluate", evaluate)]


def yaml_keys(obj: Any) -> dict[str, str] | None:
    """Field -> YAML key for ``ESConfig`` (the fields that stand for a key of the run config)."""
    from esreason.api.config import FIELD_KEYS, ESConfig

    return FIELD_KEYS if obj is ESConfig else None


def missing() -> list[str]:
    """Every undocumented parameter (and stale entry) of the entry points."""
    return [m for _, obj in api_objects() for m in undocumented(obj, yaml_keys(obj))]


def public_methods(cls: type) -> list[tuple[str, Any]]:
    """(name, function) of the public methods ``cls`` defines itself, in source order."""
    out = []
    for name, member in vars(cls).items():
        func = member.__func__ if isinstance(member, (classmethod, staticmethod)) else member
        if not name.startswith("_") and inspect.isfunction(func):
            out.append((name, func))
    return out


def _code(text: str) -> str:
    return "`" + text.replace("|", "\\|") + "`"


def _default(p: Param) -> str:
    return _code(p.default) if p.default not in ("", "required") else p.default


def _entries(found: list[Param], defaults: bool = False) -> list[str]:
    """Parameters in full: name, type (``Any`` left out) and meaning; the defaults are in the signature
    shown above the list, or, with ``defaults``, here."""
    lines = []
    for p in found:
        about = [_code(p.type)] if p.type not in ("", "Any") else []
        if defaults:
            about.append(f"default {_default(p)}")
        lines.append(f"- {_code(p.name)}" + (f" ({', '.join(about)})" if about else "") + f": {markdown(p.doc)}")
    return lines + [""]


def key_anchor(key: str) -> str:
    """``config.md#...``: the docs/config.md section that documents the ES run-config key ``key``
    (its headings are ``ES: top level`` and ``ES: `section```)."""
    return "config.md#" + slug("ES: " + (key.rpartition(".")[0] or "top level"))


def _key_lines(found: list[Param]) -> list[str]:
    """Flat fields that stand for a YAML key, one line per config section: each field with its default,
    and the key's last part where the field's name differs (the meaning is stated once, in config.md)."""
    by_section: dict[str, list[str]] = {}
    for p in found:
        section, _, leaf = p.key.rpartition(".")
        name = _code(p.name) + ("" if leaf == p.name else f" ({_code(leaf)})")
        by_section.setdefault(section, []).append(f"{name} {_default(p)}")
    return [f"- [{_code(s) if s else 'top level'}]({key_anchor(s + '.x' if s else 'x')}): " + ", ".join(items)
            for s, items in by_section.items()] + [""]


def _signature(name: str, obj: Any, method: bool = False) -> str:
    """``name(a, b=1, *, c=None)``: the call as a user writes it (the types are in the table); a
    method's ``self`` / ``cls`` left out."""
    sig = inspect.signature(obj)
    shown = [p.replace(annotation=inspect.Parameter.empty) for p in sig.parameters.values()]
    if method and shown and shown[0].name in ("self", "cls"):
        shown = shown[1:]
    return f"{name}{sig.replace(parameters=shown, return_annotation=inspect.Signature.empty)}"


def _methods(cls: type) -> list[str]:
    lines: list[str] = []
    for name, func in public_methods(cls):
        found, doc = params(func)
        lines += [f"### `{cls.__name__}.{name}`", "", f"`{_signature(f'{cls.__name__}.{name}', func, method=True)}`",
                  "", _paragraphs(doc.before), ""]
        if doc.entries:
            lines += _entries([p for p in found if p.name not in ("self", "cls")])
        if doc.after:
            lines += [_paragraphs(doc.after), ""]
    return lines


def _object_lines(public: str, obj: Any) -> list[str]:
    keys = yaml_keys(obj)
    found, doc = params(obj, keys)
    lines = [f"## `{public}`", ""]
    if keys is None:  # a config's signature is its table
        lines += [f"`{_signature(public, obj)}`", ""]
    lines += [_paragraphs(doc.before), ""]
    lines += _entries([p for p in found if not p.key], defaults=keys is not None)
    if keys is not None:
        lines += ["The other fields and their defaults, by the run-config section that gives each key's meaning "
                  "(the key in brackets where it is not the field's name):", ""]
        lines += _key_lines([p for p in found if p.key])
    if doc.after:
        lines += [_paragraphs(doc.after), ""]
    if doc.example:
        lines += ["Example:", "", "```python", doc.example, "```", ""]
    return lines + (_methods(obj) if isinstance(obj, type) else [])


def _paragraphs(text: str) -> str:
    """Docstring prose as Markdown paragraphs (each joined to one line; code spans kept)."""
    return "\n\n".join(markdown(p) for p in text.split("\n\n") if p.strip())


def render() -> str:
    """The whole of docs/api.md."""
    objects = api_objects()
    lines = ["# Python API reference", "",
             "<!-- Generated by scripts/api_doc.py from the docstrings of esreason.api; edit the docstrings, "
             "not this file. -->", "",
             "`from esreason import ESConfig, ESTrainer, GRPOComparator, evaluate`. `help()` on each shows the "
             "same text. Walk-through: [custom-tasks.md](custom-tasks.md); the YAML keys the config fields stand "
             "for: [config.md](config.md).", ""]
    lines += [f"- [`{public}`](#{slug(public)})" for public, _ in objects] + [""]
    for public, obj in objects:
        lines += _object_lines(public, obj)
    text = "\n".join(lines)
    while "\n\n\n" in text:
        text = text.replace("\n\n\n", "\n\n")
    return text.rstrip() + "\n"


def write(root: Path) -> Path:
    """Write the reference to ``root / DOC_PATH``; returns the path."""
    path = root / DOC_PATH
    path.write_text(render(), encoding="utf-8")
    return path


__all__ = ["DOC_PATH", "api_objects", "key_anchor", "missing", "public_methods", "render", "source_docstring", "write"]
