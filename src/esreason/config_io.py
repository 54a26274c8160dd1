"""Loading run configs from YAML and ``--set`` overrides: typed building, strict checking, merging.

Generic over the frozen config dataclasses (:mod:`esreason.config`, :mod:`esreason.grpo.config`,
the experiment and sweep files): :func:`build` turns a nested mapping into a dataclass and raises
:class:`ConfigError` naming the dotted key for unknown keys and wrong types.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path
from typing import Any, Literal, Mapping, Sequence

import yaml

from esreason.errors import UserError


class ConfigError(UserError):
    """Invalid configuration: the message names the dotted key."""

# --------------------------------------------------------------------------- building from dicts


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in typing.get_args(tp))
    if origin is tuple:
        return f"list of {_type_name(typing.get_args(tp)[0])}"
    return getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check ``value`` against the annotation ``tp``; convert lists to tuples and ints to floats."""
    origin = typing.get_origin(tp)
    if origin is Literal:
        allowed = typing.get_args(tp)
        if value not in allowed:
            raise ConfigError(f"config key '{key}': got {value!r}; allowed values: "
                              + ", ".join(repr(a) for a in allowed))
        return value
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        for a in args:
            if a is type(None):
                continue
            try:
                return _coerce(value, a, key)
            except ConfigError:
                continue
        raise ConfigError(f"config key '{key}': expected {_type_name(tp)}, got {value!r}")
    if origin is tuple:
        (inner, *_rest) = typing.get_args(tp)
        if isinstance(value, str):  # "1,16,32" from --set
            value = [v.strip() for v in value.split(",") if v.strip()]
            if inner is int:
                try:
                    value = [int(v) for v in value]
                except ValueError:
                    raise ConfigError(f"config key '{key}': expected a list of int, got {value!r}") from None
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"config key '{key}': expected a list, got {value!r}")
        return tuple(_coerce(v, inner, f"{key}[{i}]") for i, v in enumerate(value))
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"config key '{key}': expected true/false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"config key '{key}': expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, str):
            # PyYAML reads "1e-3" (no dot) as a string; accept any float literal.
            try:
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"config key '{key}': expected a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"config key '{key}': expected a string, got {value!r}")
        return value
    if dataclasses.is_dataclass(tp):
        return build(tp, value, prefix=key)
    raise TypeError(f"unsupported config annotation {tp!r} for {key}")


def build(cls: type, data: Mapping[str, Any] | None, prefix: str = "") -> Any:
    """Build dataclass ``cls`` from a nested mapping; unknown keys are errors."""
    data = {} if data is None else data
    where = prefix or "top level"
    if not isinstance(data, Mapping):
        raise ConfigError(f"config key '{where}': expected a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(data) - set(names))
    if unknown:
        key = f"{prefix}.{unknown[0]}" if prefix else unknown[0]
        raise ConfigError(f"unknown config key '{key}'; known keys under {where}: {', '.join(names)}")
    kwargs = {}
    for name in names:
        if name in data:
            key = f"{prefix}.{name}" if prefix else name
            kwargs[name] = _coerce(data[name], hints[name], key)
    return cls(**kwargs)


class Replace(dict):
    """A ``--set`` value that is a mapping: :func:`merge` puts it in place of the section, not into it."""


def parse_overrides(items: Sequence[str]) -> dict[str, Any]:
    """``["es.sigma=1e-3", "model=demo"]`` -> nested dict of YAML values; a mapping value replaces its section."""
    out: dict[str, Any] = {}
    for item in items:
        key, raw = item.split("=", 1) if "=" in item else ("", "")
        key = key.strip()
        if not key:
            raise ConfigError(f"--set expects key=value, got {item!r}")
        try:
            value = yaml.safe_load(raw) if raw.strip() else None
        except yaml.YAMLError:
            value = raw
        node, parts = out, key.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--set {key}: '{p}' is not a section")
        node[parts[-1]] = Replace(value) if isinstance(value, dict) else value
    return out


def merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """Recursive dict merge (``over`` wins); a :class:`Replace` value replaces the section (as a plain dict)."""
    out = dict(base)
    for k, v in over.items():
        nested = isinstance(v, Mapping) and isinstance(out.get(k), Mapping) and not isinstance(v, Replace)
        out[k] = merge(dict(out[k]), v) if nested else dict(v) if isinstance(v, Replace) else v
    return out


def read_yaml(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file not found: {p}")
    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {p}: invalid YAML: {str(exc).splitlines()[0]}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {p}: top level must be a mapping")
    return data


def config_mapping(value: Any, key: str, base_dir: Path | None, *, cwd_first: bool = False) -> dict[str, Any]:
    """A nested run config given as a YAML path or an inline mapping (experiment and sequence files).

    A relative path is taken relative to ``base_dir`` (the directory of the file naming it);
    with ``cwd_first`` a relative path that exists from the current directory wins.
    Errors name ``key``.
    """
    if isinstance(value, str):
        path = Path(value)
        if not path.is_absolute() and base_dir is not None and not (cwd_first and path.exists()):
            path = base_dir / path
        if not path.is_file():
            raise ConfigError(f"config key '{key}': config file not found: {path}")
        return read_yaml(path)
    if isinstance(value, Mapping):
        return dict(value)
    raise ConfigError(f"config key '{key}': expected a config file path or a mapping, got {value!r}")


def to_dict(cfg: Any) -> dict[str, Any]:
    """Plain-dict view (tuples as lists) for manifests and YAML dumps."""
    def conv(v: Any) -> Any:
        if isinstance(v, tuple):
            return [conv(x) for x in v]
        if isinstance(v, dict):
            return {k: conv(x) for k, x in v.items()}
        return v
    return conv(dataclasses.asdict(cfg))
