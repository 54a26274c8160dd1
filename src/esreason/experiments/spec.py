"""The experiment file of ``esreason experiment run`` (paper RQ1: Base / GRPO / ES / ES->GRPO / GRPO->ES).

One YAML names the model, the training task, the methods, the shared update budget, the
ES and GRPO run configs, the evaluation suites and the sampling protocol::

    name: demo
    model: demo                       # 'demo', a local HF directory or a hub id
    task: demo-add                    # training task (registry name)
    updates: 20                       # T for every trained method (compositions: T//2 + T-T//2)
    methods: [base, grpo, es, es_grpo, grpo_es]
    checkpoints:                      # optional: evaluate these instead of training the method
      grpo: {path: org/released-grpo, label: "GRPO (released)"}   # path: ${VAR}, ${VAR:-} (unset: trained)
    configs:
      es: ../demo/es.yaml             # path (relative to this file) or an inline mapping
      grpo: ../demo/grpo.yaml
    eval:
      in_domain: [demo-indomain]      # suite or task names
      held_out: [demo-heldout]
      samples: 32
      ks: [1, 16, 32]
      temperature: 0.6
      max_new_tokens: 64
      greedy: true
      limit: 100                      # first N test problems per task (null: all)
    report:
      pairs: [[demo-add, demo-sub]]   # train -> test pairs for the bar charts
    seeds: [0, 1, 2]                  # optional: train every trained method once per seed
    plan: {runaway_share: 0.01}       # optional: `experiment plan` assumptions (PlanSettings)
    variants: {dapo: {family: true}}  # optional: GRPO variants as methods (experiments/variants.py)
    match: flops                      # optional: flops (same T), rollouts or compute (GRPO's T set to ES's)
    analysis:                         # optional: off-task drift (esreason.analysis.offtask.settings)
      offtask: {task: demo-countdown, limit: 64, max_tokens: 64}

Without ``seeds`` every trained method is trained once, with the ``train.seed`` of its run
configs (today's layout: ``runs/<m>/``, ``eval/<m>/``). With ``seeds`` (``--set seeds=[0,1,2]``)
every trained method is trained once per seed (its ES and GRPO configs' ``train.seed`` set to
that seed) into ``runs/<m>/seed<s>/`` and evaluated into ``eval/<m>/seed<s>/`` on the same
problems with the same sampling seed; Base and checkpoints are evaluated once.

The ES/GRPO configs' ``model``, ``task`` and ``train.max_steps`` are replaced by the
experiment's ``model``, ``task`` and ``updates``, so every method shares them. Every part is
validated before anything is trained: unknown methods or keys, a model or checkpoint path
that does not exist, unknown suites or tasks, a budget that cannot be split, invalid run
configs (errors name the key).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from esreason.config import ConfigError, build, config_mapping, merge, parse_overrides, read_yaml
from esreason.experiments.file_keys import EvalProtocol, ExperimentFile, PlanSettings, key_names

METHODS = ("base", "grpo", "es", "es_grpo", "grpo_es")
LABELS = {"base": "Base", "grpo": "GRPO", "es": "ES", "es_grpo": "ES→GRPO", "grpo_es": "GRPO→ES"}
TRAINED = {"grpo": ("grpo",), "es": ("es",), "es_grpo": ("es", "grpo"), "grpo_es": ("grpo", "es")}
TOP_KEYS = key_names(ExperimentFile)
EVAL_KEYS = key_names(EvalProtocol)
EVAL_BACKENDS = ("hf", "vllm")


def _plan_settings(data: Any) -> PlanSettings:
    if data is None:
        return PlanSettings()
    if not isinstance(data, Mapping) or set(data) - {"runaway_share"}:
        raise ConfigError(f"config key 'plan': expected a mapping with 'runaway_share', got {data!r}")
    share = data.get("runaway_share")
    if share is not None and (isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 <= share < 1):
        raise ConfigError(f"config key 'plan.runaway_share': expected a number in [0, 1), got {share!r}")
    return PlanSettings(None if share is None else float(share))


@dataclass(frozen=True)
class MethodSpec:
    """One row of the comparison: trained here (es, grpo, compositions), the base model, or a checkpoint."""

    name: str
    label: str
    kind: str
    """'base', 'checkpoint' (evaluated, not trained), 'es', 'grpo' (GRPO or a variant), 'es_grpo' or 'grpo_es'."""
    checkpoint: str | None = None
    """The model evaluated for 'base' and 'checkpoint' methods."""
    config: Any = None
    """A 'grpo' method's own GRPORunConfig (a variant, or GRPO under ``match: rollouts | compute``); None:
    configs.grpo."""
    updates: int | None = None
    """This method's updates when they differ from the experiment's (``match: rollouts | compute``); None:
    ``updates``."""
    family: bool = False
    """A variant whose claims against ES join the report's family (``variants.<name>.family``)."""
    variant: bool = False
    """A GRPO variant (:mod:`esreason.experiments.variants`): trained as 'grpo' from its own config."""


@dataclass(frozen=True)
class ExperimentSpec:
    name: str
    model: str
    task: str
    updates: int
    methods: tuple[MethodSpec, ...]
    es: Any = None
    """The ES RunConfig every ES stage uses (model/task/max_steps set by the experiment)."""
    grpo: Any = None
    """The GRPORunConfig every GRPO stage uses."""
    eval: EvalProtocol = field(default_factory=lambda: EvalProtocol((), ()))
    pairs: tuple[tuple[str, str], ...] = ()
    data_dir: str | None = None
    raw: Mapping[str, Any] = field(default_factory=dict)
    """The resolved mapping (stage configs inlined): what a resumed experiment must match."""
    seeds: tuple[int, ...] | None = None
    """Training seeds (key ``seeds``): every trained method once per seed, in ``seed<s>/``
    subdirectories. None: one training run per method with its configs' own ``train.seed``."""
    plan: PlanSettings = field(default_factory=PlanSettings)
    """Assumptions of ``esreason experiment plan`` (key ``plan``)."""
    match: str = "flops"
    """What the methods' budgets match (key ``match``): 'flops', 'rollouts' or 'compute'
    (:mod:`esreason.experiments.variants`)."""
    analysis: Any = None
    """Analyses run after the evaluations (key ``analysis``:
    :class:`esreason.analysis.offtask.settings.AnalysisSettings`); None or empty: none."""

    def stage_config(self, method: MethodSpec, kind: str) -> Any:
        """The run config ``method`` trains its ``kind`` stage with: its own, else the experiment's."""
        return method.config if kind == "grpo" and method.config is not None else getattr(self, kind)

    def method_updates(self, method: MethodSpec) -> int:
        """T of ``method``: its own (``match: rollouts | compute``), else the experiment's ``updates``."""
        return self.updates if method.updates is None else method.updates

    def trained_kinds(self) -> set[str]:
        """The training kinds (``es``, ``grpo``) some method of this experiment runs."""
        return {k for m in self.methods for k in TRAINED.get(m.kind, ())}

    def eval_settings(self) -> tuple[str, str]:
        """(device, dtype) of this experiment's evaluation (:func:`eval_settings`)."""
        return eval_settings(self)

    def method(self, name: str) -> MethodSpec:
        return next(m for m in self.methods if m.name == name)

    def with_seed(self, seed: int) -> "ExperimentSpec":
        """This spec with ``train.seed = seed`` in its ES and GRPO run configs (one training seed)."""
        from dataclasses import replace

        def _seeded(cfg: Any) -> Any:
            return None if cfg is None else replace(cfg, train=replace(cfg.train, seed=seed))

        return replace(self, es=_seeded(self.es), grpo=_seeded(self.grpo),
                       methods=tuple(replace(m, config=_seeded(m.config)) for m in self.methods))


def run_stages(spec: "ExperimentSpec") -> list[tuple[str, str, int]]:
    """The stages ``esreason experiment run`` executes, in order: (name, kind, updates) with kind
    'es', 'grpo' or 'eval' (updates 0). Names: ``train/<m>`` (a composition:
    ``train/<m>/stage<i>_<kind>``, T//2 + T - T//2 updates), ``eval/<m>``; with ``seeds`` every
    trained method once per seed under ``seed<s>/``, the base model (no training seed) once.
    The table plan and the calibrated plan both price these (with their configs: :func:`run_stage_configs`)."""
    return [(name, kind, updates) for name, kind, updates, _ in run_stage_configs(spec)]


def run_stage_configs(spec: "ExperimentSpec") -> list[tuple[str, str, int, Any]]:
    """:func:`run_stages` with each stage's run config: (name, kind, updates, config), the config a method
    trains that stage with (a variant's own, GRPO's under ``match: rollouts | compute``; None for 'eval')."""
    from esreason.experiments.sequence import split_budget

    out: list[tuple[str, str, int, Any]] = []
    for m in spec.methods:
        kinds = TRAINED.get(m.kind, ())
        budgets = (spec.method_updates(m),) if len(kinds) == 1 else split_budget(spec.updates) if kinds else ()
        prefixes = [f"seed{s}/" for s in spec.seeds] if (spec.seeds and kinds) else [""]
        for prefix in prefixes:
            for i, (kind, updates) in enumerate(zip(kinds, budgets), start=1):
                name = f"{prefix}train/{m.name}" if len(kinds) == 1 else f"{prefix}train/{m.name}/stage{i}_{kind}"
                out.append((name, kind, updates, spec.stage_config(m, kind)))
            out.append((f"{prefix}eval/{m.name}", "eval", 0, None))
    return out


def parse_seeds(value: Any, key: str = "seeds") -> tuple[int, ...] | None:
    """A ``seeds`` key: a non-empty list of distinct integers >= 0 (None when absent)."""
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        value = [value]
    if (not isinstance(value, (list, tuple)) or not value
            or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value)):
        raise ConfigError(f"config key '{key}': expected a non-empty list of integers >= 0, got {value!r}")
    if len(set(value)) != len(value):
        raise ConfigError(f"config key '{key}': a seed is listed twice: {list(value)}")
    return tuple(int(v) for v in value)


def _tasks(values: Any, key: str) -> tuple[str, ...]:
    from esreason import tasks as registry
    from esreason.errors import UserError

    if isinstance(values, str):
        values = [values]
    if not isinstance(values, (list, tuple)) or not values:
        raise ConfigError(f"config key '{key}': expected a list of suite or task names, got {values!r}")
    out: list[str] = []
    for v in values:
        if v in registry.SUITES:
            out.extend(registry.SUITES[v])
            continue
        try:
            registry.get(str(v))
        except UserError:
            raise ConfigError(f"config key '{key}': {v!r} is neither a suite ({', '.join(sorted(registry.SUITES))}) "
                              f"nor a task ({', '.join(registry.names())})") from None
        out.append(str(v))
    return tuple(dict.fromkeys(out))


def expand_env(value: Any, key: str) -> Any:
    """``${NAME}`` -> the environment variable NAME (for checkpoints a config cannot name, e.g. a
    released model whose hub id the paper does not give); unset or empty -> ConfigError naming the
    key. ``${NAME:-DEFAULT}`` (the shell's form) -> DEFAULT when NAME is unset or empty; an empty
    DEFAULT gives None (for a checkpoint: none, the method is trained)."""
    if isinstance(value, str):
        match = re.fullmatch(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(:-([^}]*))?\}", value.strip())
        if match:
            if os.environ.get(match.group(1)):
                return os.environ[match.group(1)]
            if match.group(2) is not None:
                return match.group(3) or None
            raise ConfigError(f"config key '{key}': environment variable {match.group(1)} is not set "
                              "(set it to a local checkpoint directory or a hub id)")
    return value


def _check_model(spec: str, key: str) -> None:
    from esreason.backends.hf import resolve_model_path
    from esreason.errors import UserError

    if not isinstance(spec, str) or not spec:
        raise ConfigError(f"config key '{key}': expected a model ('demo', a directory or a hub id), got {spec!r}")
    try:
        resolve_model_path(spec)
    except UserError as exc:
        raise ConfigError(f"config key '{key}': {exc}") from None


def _eval_protocol(data: Any) -> EvalProtocol:
    if not isinstance(data, Mapping):
        raise ConfigError(f"config key 'eval': expected a mapping, got {data!r}")
    unknown = sorted(set(data) - set(EVAL_KEYS))
    if unknown:
        raise ConfigError(f"unknown config key 'eval.{unknown[0]}'; known keys: {', '.join(EVAL_KEYS)}")
    if "in_domain" not in data or "held_out" not in data:
        raise ConfigError("config key 'eval': needs 'in_domain' and 'held_out' (suite or task names)")
    rest = {k: v for k, v in data.items() if k not in ("in_domain", "held_out")}
    proto = build(EvalProtocol, {**rest, "in_domain": list(_tasks(data["in_domain"], "eval.in_domain")),
                                 "held_out": list(_tasks(data["held_out"], "eval.held_out"))}, prefix="eval")
    held = tuple(t for t in proto.held_out if t not in proto.in_domain)
    if proto.samples < 1:
        raise ConfigError(f"config key 'eval.samples': must be >= 1 (got {proto.samples})")
    bad = [k for k in proto.ks if not 1 <= k <= proto.samples]
    if bad or not proto.ks:
        raise ConfigError(f"config key 'eval.ks': each K must be in [1, eval.samples={proto.samples}] "
                          f"(got {list(proto.ks)})")
    if proto.limit is not None and proto.limit < 1:
        raise ConfigError(f"config key 'eval.limit': must be >= 1 (got {proto.limit})")
    if proto.backend not in EVAL_BACKENDS:
        raise ConfigError(f"config key 'eval.backend': expected one of {', '.join(EVAL_BACKENDS)} "
                          f"(got {proto.backend!r})")
    if proto.engines < 1:
        raise ConfigError(f"config key 'eval.engines': must be >= 1 (got {proto.engines})")
    if isinstance(proto.engines_per_gpu, bool) or not isinstance(proto.engines_per_gpu, int) \
            or proto.engines_per_gpu < 1:
        raise ConfigError(f"config key 'eval.engines_per_gpu': must be an integer >= 1 (got {proto.engines_per_gpu!r})")
    if proto.engines_per_gpu > 1 and (proto.backend != "vllm" or proto.engines < 2):
        raise ConfigError(f"config key 'eval.engines_per_gpu': {proto.engines_per_gpu} engines per GPU need "
                          f"eval.backend: vllm and eval.engines >= 2 (got backend {proto.backend!r}, "
                          f"engines {proto.engines})")
    tp = proto.tensor_parallel_size
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1 or (tp > 1 and (
            proto.backend != "vllm" or proto.engines_per_gpu > 1)):
        raise ConfigError(f"config key 'eval.tensor_parallel_size': must be an integer >= 1, and > 1 only with "
                          f"eval.backend: vllm and eval.engines_per_gpu: 1 (got {tp!r})")
    if proto.engines > 1 and proto.backend != "vllm":
        raise ConfigError(f"config key 'eval.engines': {proto.engines} engines need eval.backend: vllm "
                          f"(the hf sampler runs in one process)")
    from dataclasses import replace

    return replace(proto, held_out=held)


def _stage_config(kind: str, mapping: dict[str, Any], model: str, task: str, updates: int) -> Any:
    from esreason.config import RunConfig

    mapping = merge(mapping, {"model": model, "task": task, "train": {"max_steps": updates}})
    if kind == "es":
        cls: type = RunConfig
    else:
        from esreason.grpo.config import GRPORunConfig

        cls = GRPORunConfig
    try:
        return build(cls, mapping)
    except ConfigError as exc:
        raise ConfigError(f"configs.{kind}: {exc}") from None


def _register_tasks_dir(value: Any, base_dir: Path | None) -> None:
    """``tasks_dir``: task files (relative to the experiment file) registered before tasks are looked up,
    so user tasks can be trained on and evaluated in- and held-out (docs/custom-tasks.md)."""
    if value is None:
        return
    if not isinstance(value, str) or not value:
        raise ConfigError(f"config key 'tasks_dir': expected a directory, got {value!r}")
    from esreason.tasks.registry import add_tasks_dir

    path = Path(value)
    add_tasks_dir(path if path.is_absolute() or base_dir is None else base_dir / path)


def parse_spec(data: Mapping[str, Any], base_dir: Path | None = None) -> ExperimentSpec:
    """Validate an experiment mapping completely (nothing is run)."""
    from esreason.experiments.sequence import split_budget

    unknown = sorted(set(data) - set(TOP_KEYS))
    if unknown:
        raise ConfigError(f"unknown config key '{unknown[0]}'; known keys: {', '.join(TOP_KEYS)}")
    for key in ("name", "model", "task", "methods", "eval"):
        if key not in data:
            raise ConfigError(f"config key '{key}': missing")
    name, model, task = data["name"], data["model"], data["task"]
    if not isinstance(name, str) or not name or "/" in name:
        raise ConfigError(f"config key 'name': expected a plain name, got {name!r}")
    _check_model(model, "model")
    _register_tasks_dir(data.get("tasks_dir"), base_dir)
    _tasks([task], "task")
    from esreason.experiments.variants import check_methods, parse_match, parse_variants, resolve_methods

    methods = check_methods(data, METHODS)
    variants = parse_variants(data.get("variants"), methods, METHODS)
    labels = {**LABELS, **{n: v.label for n, v in variants.items()}}
    checkpoints = data.get("checkpoints") or {}
    if not isinstance(checkpoints, Mapping):
        raise ConfigError(f"config key 'checkpoints': expected a mapping method -> checkpoint, got {checkpoints!r}")
    specs: list[MethodSpec] = []
    for m in list(checkpoints):
        entry = checkpoints[m]
        entry = {"path": entry} if isinstance(entry, str) else entry
        if not isinstance(entry, Mapping) or "path" not in entry or set(entry) - {"path", "label"}:
            raise ConfigError(f"config key 'checkpoints.{m}': expected a path/hub id or {{path, label}}")
        checkpoints = {**checkpoints, m: {**entry, "path": expand_env(entry["path"], f"checkpoints.{m}.path")}}
        if checkpoints[m]["path"] is None:  # `${VAR:-}` with VAR unset, or null: no checkpoint, trained here
            checkpoints = {k: v for k, v in checkpoints.items() if k != m}
    for m in methods:
        if m in checkpoints:
            entry = checkpoints[m]
            _check_model(entry["path"], f"checkpoints.{m}.path")
            specs.append(MethodSpec(m, str(entry.get("label") or f"{labels[m]} (checkpoint)"), "checkpoint",
                                    str(entry["path"])))
        elif m == "base":
            specs.append(MethodSpec(m, LABELS[m], "base", model))
        else:
            specs.append(MethodSpec(m, labels[m], "grpo" if m in variants else m, variant=m in variants))
    extra = sorted(set(checkpoints) - set(methods))
    if extra:
        raise ConfigError(f"config key 'checkpoints.{extra[0]}': method {extra[0]!r} is not in 'methods'")
    needed = sorted({k for s in specs if s.kind in TRAINED for k in TRAINED[s.kind]})
    updates = data.get("updates")
    if needed:
        if isinstance(updates, bool) or not isinstance(updates, int) or updates < 1:
            raise ConfigError(f"config key 'updates': expected an integer >= 1, got {updates!r}")
        if any(s.kind in ("es_grpo", "grpo_es") for s in specs):
            try:
                split_budget(updates)
            except ConfigError as exc:
                raise ConfigError(str(exc).replace("'total_updates'", "'updates'")) from None
    configs = data.get("configs") or {}
    if not isinstance(configs, Mapping):
        raise ConfigError(f"config key 'configs': expected a mapping with 'es' and/or 'grpo', got {configs!r}")
    unknown_cfg = sorted(set(configs) - {"es", "grpo"})
    if unknown_cfg:
        raise ConfigError(f"unknown config key 'configs.{unknown_cfg[0]}'; known keys: es, grpo")
    stage_cfgs: dict[str, Any] = {}
    raw_cfgs: dict[str, Any] = {}
    for kind in needed:
        if kind not in configs:
            raise ConfigError(f"config key 'configs.{kind}': a {kind} run config is needed by the methods "
                              f"{[s.name for s in specs if s.kind in TRAINED and kind in TRAINED[s.kind]]}")
    for kind in configs:  # every given config is validated, needed or not (methods may be added later)
        raw_cfgs[kind] = config_mapping(configs[kind], f"configs.{kind}", base_dir)
        stage_cfgs[kind] = _stage_config(kind, raw_cfgs[kind], model, task, updates or 1)
    proto = _eval_protocol(data["eval"])
    report = data.get("report") or {}
    pairs_raw = report.get("pairs", []) if isinstance(report, Mapping) else None
    if pairs_raw is None or not isinstance(pairs_raw, (list, tuple)):
        raise ConfigError(f"config key 'report': expected a mapping with 'pairs', got {report!r}")
    pairs = []
    for p in pairs_raw:
        if not (isinstance(p, (list, tuple)) and len(p) == 2 and all(t in proto.tasks + (task,) for t in p)):
            raise ConfigError(f"config key 'report.pairs': each pair is [train_task, test_task] from the "
                              f"evaluated tasks {list(proto.tasks)}; got {p!r}")
        pairs.append((str(p[0]), str(p[1])))
    seeds = parse_seeds(data.get("seeds"))
    match = parse_match(data.get("match"))
    specs = resolve_methods(specs, variants, raw_cfgs.get("grpo"), stage_cfgs.get("es"), model, task, updates or 1,
                            match)
    resolved = dict(data)
    resolved["configs"] = raw_cfgs
    return ExperimentSpec(name=name, model=model, task=task, updates=int(updates or 0), methods=tuple(specs),
                          es=stage_cfgs.get("es"), grpo=stage_cfgs.get("grpo"), eval=proto, pairs=tuple(pairs),
                          data_dir=data.get("data_dir"), raw=resolved, seeds=seeds,
                          plan=_plan_settings(data.get("plan")), match=match,
                          analysis=_analysis(data.get("analysis"), base_dir))


def _analysis(data: Any, base_dir: Path | None) -> Any:
    from esreason.analysis.offtask.settings import parse_analysis

    return parse_analysis(data, base_dir)


def load_spec(path: str | Path, overrides: Sequence[str] = ()) -> ExperimentSpec:
    """Read an experiment YAML and apply ``--set`` overrides (e.g. ``updates=4``, ``eval.limit=8``)."""
    p = Path(path)
    base_dir = p.resolve().parent
    data = read_yaml(p)
    over = parse_overrides(overrides)
    cfg_over = over.get("configs")
    if isinstance(cfg_over, Mapping) and isinstance(data.get("configs"), Mapping):
        # a run-config override merges into that config, whether it was given inline or as a path
        data["configs"] = {k: (config_mapping(v, f"configs.{k}", base_dir) if k in cfg_over else v)
                           for k, v in data["configs"].items()}
    return parse_spec(merge(data, over), base_dir)


def eval_settings(spec: ExperimentSpec) -> tuple[str, str]:
    """(device, dtype) for evaluation: those of the ES (else GRPO) config, else CPU fp32."""
    for cfg in (spec.es, spec.grpo):
        if cfg is not None:
            return cfg.device, cfg.dtype
    return "cpu", "float32"
