"""``ESConfig``: the ES run config flat, as TRL's configs are (``esreason.ESConfig(population_size=32)``).

Every key of the YAML run config (:class:`esreason.config.RunConfig`) has one field here, named
after the key's last part (``es.sigma`` -> ``sigma``, ``train.max_steps`` -> ``max_steps``); where
two sections share a last part, or the part alone would not say what it is, the field carries its
section as a prefix (``generation.batch_size`` -> ``generation_batch_size``, ``eval.every`` ->
``eval_every``, ``backend.type`` -> ``backend``). :data:`FIELD_KEYS` is the whole table; a test
checks that it covers every key of the YAML config and nothing else.

Defaults fit a small CPU run of the embedded default (the values of ``configs/demo/es.yaml``: N = 16,
sigma 2e-3, alpha 1e-3, B = 16, 30 updates, 64 response tokens) rather than the paper's Easy setting
(the YAML defaults: N = 32, sigma 1.5e-3, alpha 2.5e-4, B = 64, 2,048 tokens):
``ESConfig.from_yaml("configs/easy/es-qwen2.5-1.5b.yaml")`` gives the paper's. The same settings
through :class:`esreason.ESTrainer` and ``esreason train es --config`` give the same run.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Sequence

from esreason.config import RunConfig, build, load_config, to_dict

#: Flat field -> dotted YAML key (fields that are not here are the API's own: output_dir,
#: reward_weights, pass_threshold).
FIELD_KEYS: dict[str, str] = {
    "model": "model", "task": "task", "data_path": "data_path", "tasks_dir": "tasks_dir", "data_dir": "data_dir",
    "dtype": "dtype", "device": "device",
    **{k: f"es.{k}" for k in ("population_size", "sigma", "alpha", "shaping", "zscore_eps", "estimator",
                              "format_reward", "restore", "master_weights", "sampling_seeds", "direction_cache_mb",
                              "reward_control", "perturbation", "rank", "anchor_decay")},
    **{k: f"train.{k}" for k in ("batch_size", "epochs", "max_steps", "seed", "split", "limit", "stream_start")},
    "temperature": "generation.temperature", "top_p": "generation.top_p",
    "max_new_tokens": "generation.max_new_tokens", "generation_batch_size": "generation.batch_size",
    "checkpoint_every": "checkpoint.every", "keep_last": "checkpoint.keep_last",
    **{f"eval_{k}": f"eval.{k}" for k in ("every", "tasks", "samples", "temperature", "max_new_tokens", "ks",
                                           "limit", "greedy", "split")},
    "backend": "backend.type", "engines": "backend.engines", "engines_per_gpu": "backend.engines_per_gpu",
    "ray_address": "backend.ray_address", "population_batch": "backend.population_batch",
    "check_every": "backend.check_every", "backend_update": "backend.update", "backend_engine": "backend.engine",
    "tensor_parallel_size": "backend.tensor_parallel_size",
    **{f"coverage_{k}": f"coverage.{k}" for k in ("every", "prompts", "samples", "temperature")},
    **{f"wandb_{k}": f"logging.wandb.{k}" for k in ("project", "entity", "mode", "group", "name", "table_every",
                                                     "table_rows")},
}


@dataclass(frozen=True)
class ESConfig:
    """An ES run, flat (TRL's shape). Each field stands for the YAML key beside it (:data:`FIELD_KEYS`):
    its meaning, allowed values and checks are the key's (docs/config.md), with the defaults below, a
    small CPU run of the embedded default. ``output_dir``, ``reward_weights`` and ``pass_threshold``
    are the API's own. A bad value is refused at construction, naming the field.

    Example::

        from esreason import ESConfig

        args = ESConfig(output_dir="runs/mine", population_size=8, sigma=1e-3, max_steps=20)
        longer = args.replace(max_steps=40)
        paper = ESConfig.from_yaml("configs/easy/es-qwen2.5-1.5b.yaml", output_dir="runs/easy")
        print(paper.population_size, paper.sigma, paper.backend)  # 32 0.0015 ray
    """

    # --- the API's own -----------------------------------------------------------------------
    output_dir: str = "runs/es-api"
    """Run directory (config.yaml, manifest.json, metrics.jsonl, checkpoints/step_N)."""
    reward_weights: tuple[float, ...] | None = None
    """One weight per reward function (TRL's ``reward_weights``); None = 1 each."""
    pass_threshold: float = 1.0
    """A sample whose combined reward is >= this counts as correct (accuracy, Pass@K)."""
    # --- run ---------------------------------------------------------------------------------
    model: str = "demo"
    """'demo' (the embedded default), a local model directory or a hub id; ESTrainer(model=...) wins."""
    task: str = "custom"
    """Name of the training task: a registered task, or the name the trainer gives ``train_dataset``."""
    data_path: str | None = None
    """Local JSONL/Parquet file or directory for a registered training task."""
    tasks_dir: str | None = None
    """Directory of task files (``*.yaml``) registered before ``task`` is looked up."""
    data_dir: str | None = None
    """Directory with ``<data_dir>/<task>/<split>.jsonl`` for evaluation tasks."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Dtype of the weights (bfloat16 for real models on GPUs; fp32 masters follow ``master_weights``)."""
    device: str = "cpu"
    """'cpu', 'cuda' or 'cuda:N'."""
    # --- es ----------------------------------------------------------------------------------
    population_size: int = 16
    """N: perturbations evaluated per update."""
    sigma: float = 2.0e-3
    """Perturbation scale: member i runs theta + sigma * eps_i."""
    alpha: float = 1.0e-3
    """Centre-update scale (absorbs 1/sigma, as in the paper)."""
    shaping: Literal["zscore", "none", "rank"] = "zscore"
    """Reward shaping: population z-score (paper), raw rewards, or centred ranks."""
    zscore_eps: float = 1e-8
    """Added to the population std (ddof 0) in the z-score."""
    estimator: Literal["one_point", "two_point"] = "one_point"
    """one_point (paper) or two_point (N/2 antithetic pairs)."""
    format_reward: float = 0.1
    """Built-in verifiers: reward of a formatted but wrong answer (reward functions set their own)."""
    restore: Literal["exact", "subtract"] = "exact"
    """exact: the centre restored bit-exactly; subtract: the paper artifact's subtraction."""
    master_weights: Literal["auto", "fp32", "none"] = "auto"
    """fp32 master copy of the centre ('auto': for bf16/fp16 models)."""
    sampling_seeds: Literal["common", "independent"] = "common"
    """At temperature > 0: one sampling seed per update for all members, or one per member."""
    direction_cache_mb: int = 256
    """MiB of directions kept between evaluation and update (a speed-up; 0 = off)."""
    reward_control: Literal["none", "shuffle"] = "none"
    """'shuffle': rewards permuted before shaping (a control that should not learn)."""
    perturbation: Literal["full", "lowrank"] = "full"
    """full (paper) or lowrank (EGGROLL-style A B^T directions)."""
    rank: int = 1
    """Rank of the low-rank directions."""
    anchor_decay: float = 0.0
    """Anchored ES: lambda of the pull theta <- theta - alpha * lambda * (theta - theta_0) after every update."""
    # --- train -------------------------------------------------------------------------------
    batch_size: int = 16
    """B: prompts every member answers per update."""
    epochs: int = 2
    """Passes over the training split when max_steps is None."""
    max_steps: int | None = 30
    """Updates to run (None: epochs over the training split)."""
    seed: int = 0
    """Master seed: data order, population and sampling seeds."""
    split: str = "train"
    """Split of a registered task to train on."""
    limit: int | None = None
    """Only the first ``limit`` training problems."""
    stream_start: int | None = None
    """A composition stage's position in the shared data stream (None: the run's own order)."""
    # --- generation --------------------------------------------------------------------------
    temperature: float = 0.0
    """Train-time sampling temperature (0 = greedy)."""
    top_p: float = 1.0
    """Nucleus mass."""
    max_new_tokens: int = 64
    """Response limit in tokens."""
    generation_batch_size: int = 256
    """Sequences per forward batch of the sampler."""
    # --- checkpoint --------------------------------------------------------------------------
    checkpoint_every: int = 10
    """Checkpoint every this many updates (0 = only at the end)."""
    keep_last: int | None = None
    """Keep only the newest this many checkpoints."""
    # --- eval (periodic held-out evaluation during training) --------------------------------
    eval_every: int = 0
    """Evaluate every this many updates (0 = never); eval_dataset, or eval_tasks."""
    eval_tasks: tuple[str, ...] = ()
    """Registered tasks to evaluate (default: the training task's test split / eval_dataset)."""
    eval_samples: int = 8
    """Sampled responses per problem."""
    eval_temperature: float = 0.6
    """Sampling temperature of the evaluation."""
    eval_max_new_tokens: int | None = None
    """Response limit of the evaluation (None: max_new_tokens)."""
    eval_ks: tuple[int, ...] = (1, 8)
    """K values of Pass@K."""
    eval_limit: int | None = 64
    """Problems per task (None = all)."""
    eval_greedy: bool = True
    """Also report greedy accuracy."""
    eval_split: str = "test"
    """Split evaluated."""
    # --- backend -----------------------------------------------------------------------------
    backend: Literal["auto", "hf", "batched", "ray", "vllm"] = "auto"
    """Population evaluation: 'auto' = batched for the embedded default (float32 on the CPU;
    bit-identical to hf and faster), hf otherwise; or hf, batched, ray, vllm (docs/gpu-layout.md)."""
    engines: int = 1
    """Engines of a Ray pool."""
    engines_per_gpu: int = 1
    """vLLM engines sharing one GPU."""
    ray_address: str | None = None
    """An existing Ray cluster (None: start a local one)."""
    population_batch: int = 0
    """batched: members per batched forward (0 = all)."""
    check_every: int = 10
    """ray/vllm: engine checksum period in updates (0 = never)."""
    backend_update: Literal["replicated", "sharded"] = "replicated"
    """ray: how engines apply an update."""
    backend_engine: Literal["auto", "hf", "vllm"] = "auto"
    """ray: the engine each actor runs."""
    tensor_parallel_size: int = 1
    """GPUs per vLLM engine (tensor parallelism; docs/tensor-parallel.md)."""
    # --- coverage ----------------------------------------------------------------------------
    coverage_every: int = 0
    """Population coverage diagnostics every this many updates (0 = off)."""
    coverage_prompts: int = 8
    """Prompts used by the diagnostics."""
    coverage_samples: int = 4
    """Samples per member and prompt."""
    coverage_temperature: float = 1.0
    """Sampling temperature of the diagnostics."""
    # --- logging -----------------------------------------------------------------------------
    wandb_project: str | None = None
    """Weights & Biases project (None = no W&B; metrics.jsonl and TensorBoard are always written)."""
    wandb_entity: str | None = None
    """W&B entity."""
    wandb_mode: Literal["online", "offline", "disabled"] | None = None
    """W&B mode."""
    wandb_group: str | None = None
    """W&B group."""
    wandb_name: str | None = None
    """W&B run name."""
    wandb_table_every: int = 10
    """Completions table every this many updates (0 = never)."""
    wandb_table_rows: int = 4
    """Rows per completions table."""

    def __post_init__(self) -> None:
        if self.reward_weights is not None:
            object.__setattr__(self, "reward_weights", tuple(float(w) for w in self.reward_weights))
        for name in ("eval_tasks", "eval_ks"):
            value = getattr(self, name)
            if isinstance(value, list):
                object.__setattr__(self, name, tuple(value))
        self.to_run_config()  # every check of the YAML config, naming the flat field

    # ------------------------------------------------------------------ conversions

    def resolved_backend(self, model: str | None = None) -> str:
        """``backend`` with 'auto' resolved for ``model`` (default: this config's)."""
        if self.backend != "auto":
            return self.backend
        spec = self.model if model is None else model
        return "batched" if spec == "demo" and self.device == "cpu" and self.dtype == "float32" else "hf"

    def nested(self, model: str | None = None) -> dict[str, Any]:
        """The YAML run config as a nested mapping (``backend: auto`` resolved)."""
        out: dict[str, Any] = {}
        for flat, key in FIELD_KEYS.items():
            value = getattr(self, flat)
            if flat == "model" and model is not None:
                value = model
            if flat == "backend":
                value = self.resolved_backend(model)
            if isinstance(value, tuple):
                value = list(value)
            node = out
            *parents, last = key.split(".")
            for p in parents:
                node = node.setdefault(p, {})
            node[last] = value
        return out

    def to_run_config(self, model: str | None = None) -> RunConfig:
        """The :class:`esreason.config.RunConfig` these settings stand for; errors name the flat field."""
        from esreason.config import ConfigError

        try:
            return build(RunConfig, self.nested(model))
        except ConfigError as exc:
            raise ConfigError(_flat_message(str(exc))) from None

    @classmethod
    def from_run_config(cls, cfg: RunConfig, **changes: Any) -> "ESConfig":
        """The flat view of a YAML run config; ``changes``: flat fields set on top (output_dir, ...)."""
        nested = to_dict(cfg)
        values = {}
        for flat, key in FIELD_KEYS.items():
            node: Any = nested
            for part in key.split("."):
                node = node[part]
            values[flat] = tuple(node) if isinstance(node, list) else node
        return cls(**{**values, **changes})

    @classmethod
    def from_yaml(cls, path: str | Path, overrides: Sequence[str] = (), **changes: Any) -> "ESConfig":
        """Read a YAML run config (``esreason train es --config``), with ``--set``-style overrides, then
        set the flat fields ``changes``."""
        return cls.from_run_config(load_config(path, overrides), **changes)

    def replace(self, **changes: Any) -> "ESConfig":
        """A copy with ``changes`` (flat field names)."""
        return dataclasses.replace(self, **changes)


def _flat_message(message: str) -> str:
    """A ConfigError message with its dotted key replaced by the flat field name."""
    by_key = {key: flat for flat, key in FIELD_KEYS.items()}
    for key in sorted(by_key, key=len, reverse=True):
        quoted = f"'{key}'"
        if quoted in message:
            return message.replace(quoted, f"'{by_key[key]}' ({key})", 1)
    return message


def yaml_keys(cls: type = RunConfig, prefix: str = "") -> list[str]:
    """Every dotted leaf key of the nested config ``cls`` (the table :data:`FIELD_KEYS` must cover)."""
    import typing

    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        key = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(hints[f.name]):
            out += yaml_keys(hints[f.name], key + ".")
        else:
            out.append(key)
    return out


__all__ = ["ESConfig", "FIELD_KEYS", "yaml_keys"]
