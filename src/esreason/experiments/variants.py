"""GRPO variants as methods of an experiment, and the budget an experiment matches on.

An experiment lists a variant among its methods by name. A preset (:data:`esreason.grpo.variants.PRESETS`:
``dr_grpo``, ``dapo``, ``bnpo``, ``gspo``, ``cispo``, ``sapo``, ``luspo``, ``vespo``) needs nothing else; the
``variants`` mapping defines new ones or sets a preset's label, settings and family membership::

    methods: [base, es, grpo, dr_grpo, dapo, gspo2]
    variants:
      gspo2:                                 # a new method name
        preset: gspo                         # optional: start from a preset's overlay
        label: "GSPO (2 optimizer steps)"    # the report's row label (default: the preset's, else the name)
        config: {grpo: {mini_batches: 2}}    # overlay of configs.grpo, applied after the preset's
        family: true                         # its claims against ES join the report's family (Holm)
      dapo: {family: true}
    match: flops                             # or rollouts, compute

A variant is trained exactly as the ``grpo`` method is (kind ``grpo``, the same runner, checkpoints,
evaluation and seeds) from configs.grpo with the overlays merged in, so it differs from GRPO only in
what the overlays change; the experiment's ``model``, ``task`` and budget still win.

``match`` (:mod:`esreason.accounting.budget`): ``flops`` (default) gives every method the same T
updates, which matches the paper's FLOP formula when N = 4 G at equal B (the paper). ``rollouts`` keeps ES
at T and gives every GRPO method (``grpo`` and each variant) T x (N x B_ES) / (B x G) updates, so each
samples as many responses as ES; B and G (the group the objective is defined on) stay as configured.
``compute`` keeps ES at T and gives every GRPO method the updates at which its planned FLOPs as spent (its
own forward-equivalents per token) equal ES's. Compositions split one update budget between ES and GRPO
stages and are refused under ``rollouts`` and ``compute``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any, Mapping, Sequence

from esreason.config import ConfigError, build, merge
from esreason.accounting.budget import MATCHES, compute_matched_updates, rollout_matched_updates

VARIANT_KEYS = ("preset", "label", "config", "family")
COMPOSITIONS = ("es_grpo", "grpo_es")


@dataclass(frozen=True)
class VariantDef:
    """A GRPO variant an experiment trains: its name, label, config overlay and family membership."""

    name: str
    label: str
    overlay: Mapping[str, Any]
    """Merged into configs.grpo: the preset's overlay, then the entry's ``config``."""
    family: bool = False
    """Its claims against ES (Pass@1, Pass@K) are members of the report's family of claims (Holm)."""
    preset: str | None = None


def variant_names(data: Mapping[str, Any]) -> tuple[str, ...]:
    """The method names an experiment may list beyond the built-in methods: presets and ``variants`` keys."""
    from esreason.grpo.variants import PRESETS

    extra = data.get("variants") or {}
    return tuple(dict.fromkeys(list(PRESETS) + (list(extra) if isinstance(extra, Mapping) else [])))


def check_methods(data: Mapping[str, Any], builtin: Sequence[str]) -> list[str]:
    """The ``methods`` list: each a built-in method, a preset or a ``variants`` key, none listed twice."""
    methods = data["methods"]
    known = tuple(builtin) + variant_names(data)
    if not isinstance(methods, (list, tuple)) or not methods:
        raise ConfigError(f"config key 'methods': expected a list from {', '.join(known)}, got {methods!r}")
    for m in methods:
        if m not in known:
            raise ConfigError(f"config key 'methods': unknown method {m!r}; choose from {', '.join(known)} "
                              "(or define it under 'variants')")
    if len(set(methods)) != len(methods):
        raise ConfigError(f"config key 'methods': listed twice: {methods}")
    return list(methods)


def parse_variants(raw: Any, methods: Sequence[str], builtin: Sequence[str]) -> dict[str, VariantDef]:
    """The variants among ``methods``: presets by name and the entries of the ``variants`` mapping ``raw``.

    builtin: the experiment's own method names (base, grpo, es, ...), which no variant may take."""
    from esreason.grpo.variants import PRESETS

    raw = raw or {}
    if not isinstance(raw, Mapping):
        raise ConfigError(f"config key 'variants': expected a mapping method -> variant, got {raw!r}")
    for name, entry in raw.items():
        key = f"variants.{name}"
        if name in builtin or not isinstance(name, str) or not re.fullmatch(r"[a-z][a-z0-9_]*", name):
            raise ConfigError(f"config key '{key}': a variant needs a new method name (lowercase letters, digits, "
                              f"_; not one of {', '.join(builtin)})")
        if not isinstance(entry, Mapping) or set(entry) - set(VARIANT_KEYS):
            raise ConfigError(f"config key '{key}': expected a mapping with keys from {', '.join(VARIANT_KEYS)}, "
                              f"got {entry!r}")
        if name not in methods:
            raise ConfigError(f"config key '{key}': method {name!r} is not in 'methods'")
    out: dict[str, VariantDef] = {}
    for name in methods:
        if name in builtin or (name not in raw and name not in PRESETS):
            continue
        entry = raw.get(name) or {}
        key = f"variants.{name}"
        preset_name = entry.get("preset", name if name in PRESETS else None)
        if preset_name is not None and preset_name not in PRESETS:
            raise ConfigError(f"config key '{key}.preset': unknown preset {preset_name!r}; choose from "
                              f"{', '.join(PRESETS)}")
        base = PRESETS[preset_name] if preset_name else None
        overlay = entry.get("config") or {}
        if not isinstance(overlay, Mapping):
            raise ConfigError(f"config key '{key}.config': expected a mapping (GRPO run config keys), got {overlay!r}")
        bad = [k for k in ("model", "task") if k in overlay] + (
            ["train.max_steps"] if "max_steps" in (overlay.get("train") or {}) else [])
        if bad:
            raise ConfigError(f"config key '{key}.config.{bad[0]}': set by the experiment for every method")
        family = entry.get("family", False)
        if not isinstance(family, bool):
            raise ConfigError(f"config key '{key}.family': expected true or false, got {family!r}")
        label = entry.get("label") or (base.label if base else name)
        if not isinstance(label, str):
            raise ConfigError(f"config key '{key}.label': expected a string, got {label!r}")
        out[name] = VariantDef(name, label, merge(dict(base.overlay) if base else {}, dict(overlay)), family,
                               preset_name)
    return out


def parse_match(value: Any) -> str:
    """The ``match`` key: 'flops' (default), 'rollouts' or 'compute'."""
    value = "flops" if value is None else value
    if value not in MATCHES:
        raise ConfigError(f"config key 'match': expected one of {', '.join(MATCHES)}, got {value!r}")
    return value


def _grpo_config(mapping: Mapping[str, Any], model: str, task: str, updates: int, key: str) -> Any:
    from esreason.grpo.config import GRPORunConfig

    mapping = merge(dict(mapping), {"model": model, "task": task, "train": {"max_steps": updates}})
    try:
        return build(GRPORunConfig, mapping)
    except ConfigError as exc:
        raise ConfigError(f"{key}: {exc}") from None


def resolve_methods(methods: Sequence[Any], defs: Mapping[str, VariantDef], grpo_mapping: Mapping[str, Any] | None,
                    es_cfg: Any, model: str, task: str, updates: int, match: str) -> list[Any]:
    """``methods`` (MethodSpecs) with every variant's GRPO config and, under ``match: rollouts | compute``,
    every GRPO method's own update count (``MethodSpec.config`` / ``updates``; None keeps the experiment's)."""
    trained_grpo = [m for m in methods if m.kind == "grpo"]
    if match in ("rollouts", "compute"):
        comps = [m.name for m in methods if m.kind in COMPOSITIONS]
        if comps:
            raise ConfigError(f"config key 'match': {match} cannot be matched for the compositions {comps}: they "
                              "split one update budget between an ES and a GRPO stage (T//2 + T - T//2, the "
                              f"paper's split), and equal {match} would need another split, which the paper does "
                              "not define; use match: flops or drop them")
        if trained_grpo and es_cfg is None:
            raise ConfigError(f"config key 'match': {match} is matched to ES's, which needs configs.es")
    out = []
    for m in methods:
        if m.kind != "grpo":
            out.append(m)
            continue
        d = defs.get(m.name)
        mapping = merge(dict(grpo_mapping or {}), dict(d.overlay)) if d else grpo_mapping
        key = f"variants.{m.name}" if d else "configs.grpo"
        cfg = _grpo_config(mapping or {}, model, task, updates, key) if d else None
        n = None
        if match in ("rollouts", "compute"):
            matcher = rollout_matched_updates if match == "rollouts" else compute_matched_updates
            n = matcher(es_cfg, cfg or _grpo_config(mapping or {}, model, task, updates, key), updates)
            cfg = _grpo_config(mapping or {}, model, task, n, key)
        out.append(replace(m, config=cfg, updates=n, family=bool(d and d.family)))
    return out


def map_configs(spec: Any, fn: Any) -> Any:
    """``spec`` with ``fn`` applied to every run config it trains with: configs.es, configs.grpo and each
    method's own (variants; GRPO under ``match: rollouts``)."""
    methods = tuple(m if m.config is None else replace(m, config=fn(m.config)) for m in spec.methods)
    return replace(spec, es=fn(spec.es), grpo=fn(spec.grpo), methods=methods)


def method_stages(spec: Any, m: Any, trained: Mapping[str, Sequence[str]]) -> list[tuple[str, Any, int]]:
    """(kind, run config, updates) of each training stage of method ``m`` (``trained``: spec.TRAINED);
    a composition's two stages split the experiment's updates."""
    from esreason.experiments.sequence import split_budget

    kinds = trained.get(m.kind, ())
    budgets = (spec.method_updates(m),) if len(kinds) == 1 else split_budget(spec.updates) if kinds else ()
    return [(k, spec.stage_config(m, k), n) for k, n in zip(kinds, budgets)]


def method_record(m: Any, cfg: Any, updates: int) -> dict[str, Any]:
    """What experiment.json says about a GRPO method beyond its kind and label: its objective settings,
    its updates and whether it is in the report's family."""
    from esreason.grpo.variants import describe

    out: dict[str, Any] = {"objective": describe(cfg), "updates": updates}
    if m.variant:
        out["variant"] = True
    if getattr(m, "family", False):
        out["family"] = True
    return out


__all__ = ["COMPOSITIONS", "VARIANT_KEYS", "VariantDef", "check_methods", "map_configs", "method_record", "method_stages", "parse_match", "parse_variants",
           "resolve_methods", "variant_names"]
