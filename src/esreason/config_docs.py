"""docs/config.md, the configuration reference, written from the config dataclasses' field docstrings.

Every key a user can set is a field of a frozen dataclass with a docstring under it (an attribute
docstring: the string literal after the field, read from the source by
:mod:`esreason.docstrings`). A field's documentation is the one of the most derived class that
declares it (GRPO's ``generation`` section extends ES's and re-declares ``temperature`` with its own
default and text); inherited fields keep their base class's text.

The reference covers the ES run config (:class:`esreason.config.RunConfig`, ``logging.*`` from
:mod:`esreason.config_logging`), the GRPO run config (:class:`esreason.grpo.config.GRPORunConfig`),
the sequence and experiment files (:mod:`esreason.experiments.file_keys`) and the sweep section
(:class:`esreason.experiments.sweep.SweepSpec`). The flat Python-API config
(:class:`esreason.api.config.ESConfig`, each field beside its YAML key) is in docs/api.md
(:mod:`esreason.api_docs`). ``scripts/config_doc.py`` writes the file; tests/test_config_doc.py
fails when it is stale or a field has no docstring.
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Literal, Sequence

from esreason.docstrings import class_docstring, declared_fields, field_doc

#: Where the reference lives, relative to the repository root.
DOC_PATH = Path("docs") / "config.md"


@dataclass(frozen=True)
class KeyDoc:
    """One documented key: dotted name, type and default as a user writes them, and its docstring."""

    key: str
    type: str
    default: str
    doc: str


# --------------------------------------------------------------------------- reading the source


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _is_section(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def missing_docstrings(cls: type, prefix: str = "") -> list[str]:
    """``Class.field (dotted.key)`` for every field under ``cls`` without a docstring; a section (a
    dataclass-typed field) is documented by its class docstring instead."""
    out: list[str] = []
    hints = _hints(cls)
    for f in dataclasses.fields(cls):
        tp, key = hints[f.name], prefix + f.name
        if _is_section(tp):
            if not class_docstring(tp):
                out.append(f"{tp.__qualname__} (section {key})")
            out += missing_docstrings(tp, key + ".")
        elif not field_doc(cls, f.name):
            owner = next(k for k in cls.__mro__ if dataclasses.is_dataclass(k) and f.name in declared_fields(k))
            out.append(f"{owner.__qualname__}.{f.name} ({key})")
    return out


# --------------------------------------------------------------------------- rendering values


def type_text(tp: Any) -> str:
    """A field annotation as a user reads it: ``int``, ``float | null``, ``'zscore' | 'none'``, ``list of int``."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is type(None):
        return "null"
    if tp is Any:
        return "any"
    if origin is Literal:
        return " | ".join(repr(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_text(a) for a in args)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            inner = type_text(args[0])
            return f"list of ({inner})" if " | " in inner else f"list of {inner}"
        return "[" + ", ".join(type_text(a) for a in args) + "]"
    if origin is not None and isinstance(origin, type) and issubclass(origin, typing.Mapping):  # type: ignore[arg-type]
        return "mapping"
    return getattr(tp, "__name__", str(tp))


def value_text(value: Any) -> str:
    """A default as YAML writes it: ``null``, ``true``, ``1.5e-3`` style numbers, ``[1, 16, 32]``."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return re.sub(r"e([+-])0*(\d)", lambda m: "e" + ("-" if m.group(1) == "-" else "") + m.group(2), repr(value))
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(value_text(v) for v in value) + "]"
    if isinstance(value, str):
        return value if value else '""'
    return str(value)


def default_text(f: dataclasses.Field) -> str:
    """The field's default (``required`` when it has none)."""
    if f.default is not dataclasses.MISSING:
        return f"`{value_text(f.default)}`"
    if f.default_factory is not dataclasses.MISSING:
        return f"`{value_text(f.default_factory())}`"
    return "required"


_ROLE = re.compile(r":[a-z]+:`~?([^`]+)`")


def markdown(text: str, yaml: bool = False) -> str:
    """Docstring text as one Markdown table cell: reST roles and ````code```` to backticks, lines
    joined, ``|`` escaped; outside code spans ``<``, ``>`` and ``*`` escaped and, for a YAML key
    (``yaml``), Python's ``None`` written as YAML's ``null``."""
    text = _ROLE.sub(lambda m: f"`{m.group(1)}`", text).replace("``", "`")
    text = " ".join(text.split())
    parts = text.split("`")
    for i in range(0, len(parts), 2):  # outside code spans
        parts[i] = parts[i].replace("<", "&lt;").replace(">", "&gt;").replace("*", "\\*")
        parts[i] = re.sub(r"\bNone\b", "null", parts[i]) if yaml else parts[i]
    return "`".join(parts).replace("|", "\\|")


def first_paragraph(text: str | None) -> str:
    return "" if not text else markdown(text.split("\n\n")[0], yaml=True)


def slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading (ASCII headings)."""
    return re.sub(r"[^a-z0-9 _-]", "", heading.lower()).replace(" ", "-")


# --------------------------------------------------------------------------- walking a config


def leaf_keys(cls: type, prefix: str = "") -> list[KeyDoc]:
    """The leaf keys directly in ``cls`` (not in its sections)."""
    hints = _hints(cls)
    return [KeyDoc(prefix + f.name, type_text(hints[f.name]), default_text(f), field_doc(cls, f.name) or "")
            for f in dataclasses.fields(cls) if not _is_section(hints[f.name])]


def sections(cls: type, prefix: str = "") -> Iterator[tuple[str, type]]:
    """``(dotted prefix, section class)`` of every section under ``cls`` that has leaf keys, depth first."""
    hints = _hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if _is_section(tp):
            key = prefix + f.name
            if leaf_keys(tp):
                yield key, tp
            yield from sections(tp, key + ".")


def all_keys(cls: type) -> list[str]:
    """Every dotted leaf key of config ``cls``."""
    return [k.key for k in leaf_keys(cls)] + [k.key for p, sec in sections(cls) for k in leaf_keys(sec, p + ".")]


def key_table(keys: Sequence[KeyDoc]) -> list[str]:
    lines = ["| Key | Type | Default | Description |", "| --- | --- | --- | --- |"]
    lines += [f"| `{k.key}` | {markdown(k.type)} | {k.default} | {markdown(k.doc, yaml=True)} |" for k in keys]
    return lines + [""]


# --------------------------------------------------------------------------- the document


@dataclass(frozen=True)
class ConfigFile:
    """One kind of configuration file in the reference."""

    name: str
    """Short name used in headings ("ES", "GRPO")."""
    title: str
    cls: type
    intro: str
    top_level: str = "top level"
    """Heading of the table of the file's own leaf keys."""
    same_as: tuple[str, type] | None = None
    """(name, class) of a file whose identical sections are linked to rather than repeated."""


def documented_files() -> list[ConfigFile]:
    """The configuration files the reference covers, in reading order."""
    from esreason.config import RunConfig
    from esreason.experiments.file_keys import ExperimentFile, SequenceFile
    from esreason.experiments.sweep import SweepSpec
    from esreason.grpo.config import GRPORunConfig

    return [
        ConfigFile("ES", "ES run config", RunConfig,
                   "`esreason train es --config FILE`, the `configs.es` of an experiment file, the `es` stage "
                   "of a sequence file, the base of a sweep. `configs/easy/es-*.yaml` and `configs/demo/es.yaml` "
                   "are examples."),
        ConfigFile("GRPO", "GRPO run config", GRPORunConfig,
                   "`esreason train grpo --config FILE`, the `configs.grpo` of an experiment file, the `grpo` "
                   "stage of a sequence file. Defaults are the paper's Easy GRPO column (see docs/grpo.md).",
                   same_as=("ES", RunConfig)),
        ConfigFile("Sequence", "Sequence file", SequenceFile,
                   "`esreason train sequence --config FILE`: ES->GRPO or GRPO->ES with one update budget "
                   "(`configs/demo/sequence-*.yaml`)."),
        ConfigFile("Experiment", "Experiment file", ExperimentFile,
                   "`esreason experiment run FILE` and `esreason experiment plan FILE`: Base, GRPO, ES and the "
                   "compositions, evaluated alike (`configs/experiments/*.yaml`; docs/experiments.md)."),
        ConfigFile("Sweep", "Sweep section", SweepSpec,
                   "`esreason experiment sweep --config FILE`: an ES run config (above) plus a `sweep:` section "
                   "with these keys; the command-line flags of the same names win (docs/sweeps.md).",
                   top_level="`sweep`"),
    ]


def _prefix(f: ConfigFile) -> str:
    return "sweep." if f.name == "Sweep" else ""


def _file_lines(f: ConfigFile) -> list[str]:
    lines = [f"## {f.title}", "", f.intro, ""]
    base = dict(sections(f.same_as[1])) if f.same_as else {}
    shared = [(p, sec) for p, sec in sections(f.cls) if base.get(p) is sec]
    if f.same_as and leaf_keys(f.cls) == leaf_keys(f.same_as[1]):
        shared.insert(0, ("", f.cls))
    if shared:
        links = [f"[{'top level' if not p else f'`{p}`'}](#{slug(f'{f.same_as[0]}: ' + (p or 'top level'))})"
                 for p, _ in shared]  # type: ignore[index]
        lines += [f"Same keys, types and defaults as the {f.same_as[0]} run config: "  # type: ignore[index]
                  + ", ".join(links) + ".", ""]
    skip = {p for p, _ in shared}
    if "" not in skip and leaf_keys(f.cls):
        lines += [f"### {f.name}: {f.top_level}", ""] + key_table(leaf_keys(f.cls, _prefix(f)))
    for p, sec in sections(f.cls):
        if p in skip:
            continue
        lines += [f"### {f.name}: `{p}`", ""]
        about = first_paragraph(class_docstring(sec))
        lines += [about, ""] if about else []
        lines += key_table(leaf_keys(sec, _prefix(f) + p + "."))
    return lines


def documented_classes() -> list[type]:
    """The root classes whose every field the reference documents."""
    return [f.cls for f in documented_files()]


def render() -> str:
    """The whole of docs/config.md."""
    files = documented_files()
    lines = ["# Configuration reference", "",
             "<!-- Generated by scripts/config_doc.py from the config dataclasses' field docstrings; "
             "edit the docstrings, not this file. -->", "",
             "Every key of every configuration file, with its type, default and meaning. A run config is one "
             "YAML file plus repeatable `--set key=value` overrides with dotted keys (`--set es.sigma=1e-3`, "
             "`--set eval.ks=1,16,32`). Loading is strict: an unknown key, a wrong type or an out-of-range "
             "value stops the command with one line naming the dotted key.", ""]
    lines += [f"- [{f.title}](#{slug(f.title)})" for f in files]
    lines += ["", "The Python API's `esreason.ESConfig` holds every key of the ES run config as a flat field "
              "(`sigma` for `es.sigma`); its fields are listed in [api.md](api.md#esreasonesconfig).", ""]
    for f in files:
        lines += _file_lines(f)
    return "\n".join(lines).rstrip() + "\n"


def write(root: Path) -> Path:
    """Write the reference to ``root / DOC_PATH``; returns the path."""
    path = root / DOC_PATH
    path.write_text(render(), encoding="utf-8")
    return path


__all__ = ["DOC_PATH", "KeyDoc", "all_keys", "class_docstring", "declared_fields", "documented_classes",
           "documented_files", "field_doc", "missing_docstrings", "render", "type_text", "value_text", "write"]
