"""Typed, frozen run configuration with explicit validation.

A run is described by one YAML file plus repeatable ``--set key=value``
overrides with dotted keys (``--set es.sigma=1e-3``). Loading is strict:
unknown keys, wrong types and out-of-range values raise :class:`ConfigError`
(a :class:`~esreason.errors.UserError`) naming the dotted key and the allowed
values; nothing is silently ignored.

Defaults follow the paper's appendix table "Training settings" for the Easy
setting where it states a value (N = 32, sigma = 1.5e-3, alpha = 2.5e-4,
batch 64, 2 epochs, z-score shaping, temperature 0, 2,048 response tokens).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Sequence

from esreason.config_backend import BackendConfig, backend_rules
from esreason.config_io import (ConfigError, Replace, build, config_mapping, merge, parse_overrides, read_yaml,
                                to_dict)
from esreason.config_logging import ESLoggingConfig


# --------------------------------------------------------------------------- sections


@dataclass(frozen=True)
class ESConfig:
    """Evolution Strategies settings (paper §"ES Optimization", appendix "Implementation Procedure")."""

    population_size: int = 32
    """N: perturbation evaluations per update (members). With ``estimator: two_point`` the
    population is N/2 antithetic pairs, so the evaluation budget stays N (the paper's
    matched ablation)."""
    sigma: float = 1.5e-3
    """Perturbation scale: member i runs theta + sigma * eps_i."""
    alpha: float = 2.5e-4
    """Centre-update scale; absorbs the 1/sigma factor (paper Eq. es-practical-update)."""
    shaping: Literal["zscore", "none", "rank"] = "zscore"
    """Reward shaping: population z-score (paper), raw rewards, or centred ranks in [-0.5, 0.5]."""
    zscore_eps: float = 1e-8
    """eps_num added to the population std (ddof 0) in the z-score denominator."""
    estimator: Literal["one_point", "two_point"] = "one_point"
    """one_point (paper): N independent directions; two_point: N/2 directions evaluated at
    +sigma and -sigma (paper appendix "ES-ZO Estimator Equivalence")."""
    format_reward: float = 0.1
    """Reward of a response that follows the final-answer format but is wrong (paper: 0.1)."""
    restore: Literal["exact", "subtract"] = "exact"
    """exact: restore the centre from a saved copy (bit-exact, default). subtract: subtract
    the same seeded noise, as the paper's artifact does; not an exact inverse in floating
    point (kept for faithful reproduction and for measuring its drift)."""
    master_weights: Literal["auto", "fp32", "none"] = "auto"
    """Keep an fp32 copy of the centre and apply updates to it: 'auto' enables it for
    bf16/fp16 models, so updates below half an ulp accumulate instead of rounding away."""
    sampling_seeds: Literal["common", "independent"] = "common"
    """At train temperature > 0: all members of a step share one sampling seed (common
    random numbers) or each member gets its own."""
    direction_cache_mb: int = 256
    """Keep the directions drawn during an update in memory (up to this many MiB) so the
    update does not draw them again; a pure speed-up, 0 disables it."""
    reward_control: Literal["none", "shuffle"] = "none"
    """'shuffle' permutes member rewards before shaping (a seeded control that detaches
    rewards from directions: ES should then not improve). 'none' for real training."""
    perturbation: Literal["full", "lowrank", "lora"] = "full"
    """full (paper): a dense Gaussian direction per tensor. lowrank: EGGROLL-style
    directions A B^T / sqrt(rank) for matrices (vectors stay dense); see docs/es.md,
    "Low-rank perturbations". lora: the same low-rank directions on the decoder's linear
    projections (q/k/v/o, gate/up/down) only, every other tensor stays at its start value: what a
    vLLM engine evaluates as LoRA adapters in one batch (``backend.members``)."""
    rank: int = 1
    """Rank r of the low-rank directions (``perturbation: lowrank`` or ``lora``); clamped per matrix
    to min(rows, cols), with the 1/sqrt scale of the clamped rank."""
    anchor_decay: float = 0.0
    """Anchored ES (Anchored Weight Decay, arXiv 2605.30148): lambda >= 0 with alpha * lambda < 1; after
    every update theta <- theta - alpha * lambda * (theta - theta_0), theta_0 = the run's start weights
    (docs/anchored-es.md). Costs one more copy of the weights in memory and in the run directory. 0: off."""


@dataclass(frozen=True)
class TrainConfig:
    """Training loop settings."""

    batch_size: int = 64
    """B: prompts in the shared mini-batch every member answers (paper: 64)."""
    epochs: int = 2
    """Passes over the training split (paper: Easy 2, Hard 1). Ignored when max_steps is set."""
    max_steps: int | None = None
    """Stop after this many updates (overrides epochs)."""
    seed: int = 0
    """Master seed: data order, population seeds and sampling seeds derive from it."""
    split: str = "train"
    """Dataset split to train on."""
    limit: int | None = None
    """Use only the first `limit` training problems (smoke tests)."""
    stream_start: int | None = None
    """None: the method's own data order. An int: a composition stage reads the shared data stream
    from this prompt position (stage 2 continues stage 1; esreason.es.schedule)."""


@dataclass(frozen=True)
class GenerationConfig:
    """Train-time sampling (paper: temperature 0 Easy, 0.6 Hard)."""

    temperature: float = 0.0
    """Sampling temperature of the members' responses; 0 = greedy decoding."""
    top_p: float = 1.0
    """Nucleus mass (the paper does not state it; 1.0 = full distribution)."""
    max_new_tokens: int = 2048
    """Response limit in tokens (paper: Easy 2,048, Hard 8,192)."""
    batch_size: int = 256
    """Sequences per forward batch in the sampler."""


@dataclass(frozen=True)
class CheckpointConfig:
    """Checkpointing."""

    every: int = 50
    """Save a checkpoint every this many updates (0 = only at the end)."""
    keep_last: int | None = None
    """Keep only the newest this many checkpoints (None = keep all)."""


@dataclass(frozen=True)
class EvalConfig:
    """Periodic held-out evaluation during training."""

    every: int = 0
    """Evaluate every this many updates (0 = never during training)."""
    tasks: tuple[str, ...] = ()
    """Tasks to evaluate (default: the training task's test split)."""
    samples: int = 8
    """Sampled responses per problem."""
    temperature: float = 0.6
    """Sampling temperature (paper evaluation protocol: 0.6)."""
    max_new_tokens: int | None = None
    """Response limit (default: generation.max_new_tokens)."""
    ks: tuple[int, ...] = (1, 8)
    """K values for Pass@K."""
    limit: int | None = 64
    """Problems per task (None = all)."""
    greedy: bool = True
    """Also report greedy accuracy."""
    split: str = "test"
    """Split evaluated."""


@dataclass(frozen=True)
class CoverageConfig:
    """Population coverage diagnostics during ES (paper Lemmas 1-3, Proposition 1; docs/coverage.md)."""

    every: int = 0
    """Measure after every this many updates (0 = off). Costs 3 * N * samples * prompts extra
    responses per measured update (members, centre, updated centre); the training trajectory is unchanged (tested)."""
    prompts: int = 8
    """Prompts of the update's mini-batch used for the diagnostics."""
    samples: int = 4
    """Sampled responses S per member and prompt, to estimate each member's success rate p_i
    (the centre and theta+ get N*S each). S >= 2 is needed for the unbiased between-member
    variance; the plug-in JS_succ has a finite-sample floor of about (1 - 1/N) / (2S) nats."""
    temperature: float = 1.0
    """Sampling temperature of those responses (the policy pi whose p_i is measured)."""


@dataclass(frozen=True)
class RunBase:
    """The run-level keys of every run config: :class:`RunConfig` (ES) and
    :class:`esreason.grpo.config.GRPORunConfig` (GRPO) extend it, so both read the same top-level
    YAML keys with the same types and defaults, and :func:`validate_run` checks what they share.

    The sections follow in each subclass: the method's own section first (``es:`` / ``grpo:``),
    then ``train``, ``generation``, ``checkpoint``, ``eval`` (the same section types, GRPO's
    generation and checkpoint sections extend ES's). They are declared per subclass because a
    dataclass puts inherited fields first: declaring ``train`` and ``eval`` here would move them
    ahead of ``es:`` / ``grpo:`` in config.yaml and in the "known keys" error message.
    """

    model: str = "demo"
    """'demo' (the embedded default), a local Hugging Face model directory, or a hub id. For
    GRPO it is also the KL reference model."""
    task: str = "demo-add"
    """Training task (registry name, see `esreason.tasks`)."""
    data_path: str | None = None
    """Local JSONL/Parquet file or directory for the training task (None = default source)."""
    tasks_dir: str | None = None
    """Directory of task files (``*.yaml``, docs/custom-tasks.md) registered before ``task`` is looked
    up; relative to the working directory. ``--tasks-dir`` and ``ESREASON_TASKS_DIR`` do the same."""
    data_dir: str | None = None
    """Directory with one sub-directory per task (<data_dir>/<task>/<split>.jsonl) for evaluation tasks."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Dtype the weights are loaded in and updated in (ES perturbs them in place; GRPO optimises
    them: float32 = fp32 master weights)."""
    device: str = "cpu"
    """Torch device. ES: 'cpu', 'cuda', 'cuda:N'. GRPO: 'cpu' or 'cuda' (one GPU, picked with
    CUDA_VISIBLE_DEVICES, or each process's own GPU under accelerate launch)."""


@dataclass(frozen=True)
class RunConfig(RunBase):
    """A complete ES run: the run-level keys of :class:`RunBase` plus the ES sections."""

    es: ESConfig = field(default_factory=ESConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    generation: GenerationConfig = field(default_factory=GenerationConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    backend: BackendConfig = field(default_factory=BackendConfig)
    coverage: CoverageConfig = field(default_factory=CoverageConfig)
    logging: ESLoggingConfig = field(default_factory=ESLoggingConfig)

    def __post_init__(self) -> None:
        validate(self)


# --------------------------------------------------------------------------- validation


def require(cond: bool, key: str, msg: str) -> None:
    """Raise :class:`ConfigError` ``config key '<key>': <msg>`` unless ``cond`` (``key`` dotted)."""
    if not cond:
        raise ConfigError(f"config key '{key}': {msg}")


def validate_run(cfg: Any) -> None:
    """Checks every run config shares (ES and GRPO): ``model`` and the ``train``, ``generation``,
    ``checkpoint`` and ``eval`` sections. Method-specific rules (``device``, the sampling
    temperature, ``train.seed`` for GRPO) stay with each config's own ``validate``."""
    tr, gen, ck, ev = cfg.train, cfg.generation, cfg.checkpoint, cfg.eval
    require(bool(cfg.model), "model", "must not be empty")
    require(tr.batch_size >= 1, "train.batch_size", f"must be >= 1 (got {tr.batch_size})")
    require(tr.epochs >= 1, "train.epochs", f"must be >= 1 (got {tr.epochs})")
    require(tr.max_steps is None or tr.max_steps >= 1, "train.max_steps", f"must be >= 1 (got {tr.max_steps})")
    require(tr.limit is None or tr.limit >= 1, "train.limit", f"must be >= 1 (got {tr.limit})")
    require(tr.stream_start is None or tr.stream_start >= 0, "train.stream_start",
            f"must be >= 0 or null (got {tr.stream_start})")
    require(0 < gen.top_p <= 1, "generation.top_p", f"must be in (0, 1] (got {gen.top_p})")
    require(gen.max_new_tokens >= 1, "generation.max_new_tokens", f"must be >= 1 (got {gen.max_new_tokens})")
    require(gen.batch_size >= 1, "generation.batch_size", f"must be >= 1 (got {gen.batch_size})")
    require(ck.every >= 0, "checkpoint.every", f"must be >= 0 (got {ck.every})")
    require(ck.keep_last is None or ck.keep_last >= 1, "checkpoint.keep_last", f"must be >= 1 (got {ck.keep_last})")
    require(ev.every >= 0, "eval.every", f"must be >= 0 (got {ev.every})")
    require(ev.samples >= 1, "eval.samples", f"must be >= 1 (got {ev.samples})")
    require(ev.temperature >= 0, "eval.temperature", f"must be >= 0 (got {ev.temperature})")
    require(len(ev.ks) > 0 and all(1 <= k <= ev.samples for k in ev.ks), "eval.ks",
            f"each K must be in [1, eval.samples={ev.samples}] (got {list(ev.ks)})")
    require(ev.limit is None or ev.limit >= 1, "eval.limit", f"must be >= 1 (got {ev.limit})")


def validate(cfg: RunConfig) -> None:
    """Range checks that types alone cannot express. Errors name the dotted key."""
    es, gen = cfg.es, cfg.generation
    require(es.population_size >= 2, "es.population_size", f"must be >= 2 (got {es.population_size})")
    if es.estimator == "two_point":
        require(es.population_size % 2 == 0, "es.population_size",
                f"must be even with es.estimator=two_point (got {es.population_size})")
    require(es.sigma > 0, "es.sigma", f"must be > 0 (got {es.sigma})")
    require(es.alpha >= 0, "es.alpha", f"must be >= 0 (got {es.alpha})")
    require(es.direction_cache_mb >= 0, "es.direction_cache_mb", f"must be >= 0 (got {es.direction_cache_mb})")
    require(es.zscore_eps >= 0, "es.zscore_eps", f"must be >= 0 (got {es.zscore_eps})")
    require(0 <= es.format_reward <= 1, "es.format_reward", f"must be in [0, 1] (got {es.format_reward})")
    validate_run(cfg)
    require(gen.temperature >= 0, "generation.temperature", f"must be >= 0 (got {gen.temperature})")
    require(es.rank >= 1, "es.rank", f"must be >= 1 (got {es.rank})")
    require(es.anchor_decay >= 0, "es.anchor_decay", f"must be >= 0 (got {es.anchor_decay})")
    require(es.alpha * es.anchor_decay < 1, "es.anchor_decay", f"es.alpha * es.anchor_decay must be < 1 "
            f"(got {es.alpha} * {es.anchor_decay}): the pull toward the start weights would overshoot them")
    for cond, key, msg in backend_rules(cfg.backend, cfg.device, es.perturbation):
        require(cond, key, msg)
    cov = cfg.coverage
    require(cov.every >= 0, "coverage.every", f"must be >= 0 (got {cov.every})")
    require(cov.prompts >= 1, "coverage.prompts", f"must be >= 1 (got {cov.prompts})")
    require(cov.samples >= 1, "coverage.samples", f"must be >= 1 (got {cov.samples})")
    require(cov.temperature > 0, "coverage.temperature", f"must be > 0 (got {cov.temperature})")
    require(cov.every == 0 or es.restore == "exact", "coverage.every",
            "the coverage pass perturbs members again and needs es.restore=exact (a bit-exact centre); "
            f"got es.restore={es.restore!r}")
    require(cfg.device == "cpu" or cfg.device.startswith("cuda"), "device",
            f"must be 'cpu' or 'cuda[:N]' (got {cfg.device!r})")


def load_config(path: str | Path | None = None, overrides: Sequence[str] = (),
                cls: type = RunConfig) -> Any:
    """Read YAML ``path`` (optional), apply ``--set`` overrides, build and validate ``cls``."""
    data = read_yaml(path) if path is not None else {}
    data = merge(data, parse_overrides(overrides))
    return build(cls, data)


__all__ = ["BackendConfig", "CheckpointConfig", "ConfigError", "CoverageConfig", "ESConfig", "EvalConfig",
           "GenerationConfig", "Replace", "RunBase", "RunConfig", "TrainConfig", "build", "config_mapping",
           "load_config", "merge", "parse_overrides", "read_yaml", "require", "to_dict", "validate",
           "validate_run"]
