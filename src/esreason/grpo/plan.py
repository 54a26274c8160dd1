"""How one GRPO update maps onto TRL's batching knobs, and how many updates a run makes.

The paper counts updates T (appendix "ES-GRPO FLOP Matching": FLOPs_GRPO = 8 T B G P L,
matched to ES at T_ES = T_GRPO). In esreason one **update** is one rollout batch: B prompts
x G responses sampled from the current policy, scored, turned into group advantages, and
trained on. The paper's Easy GRPO ran verl with "PPO minibatch 32; microbatch 2" at B = 64,
i.e. each rollout batch is split into B / 32 = 2 optimizer steps of 32 prompts (256
sequences), each accumulated from micro-batches of 2 sequences. In TRL terms::

    per_device_train_batch_size = micro                    (2)
    gradient_accumulation_steps = mini * G / micro         (32 * 8 / 2 = 128)
    steps_per_generation        = B * G / micro            (64 * 8 / 2 = 256)
    => generation_batch_size    = B * G                    (512 sequences per rollout)
       optimizer steps / update = B / mini                 (2)

With P processes (``accelerate launch``, data parallel or sharded), B x G stays the *global*
rollout batch and the mini-batch stays global; only the micro-batch is per process, as verl's
``ppo_micro_batch_size_per_gpu``::

    per_device_train_batch_size = micro
    gradient_accumulation_steps = mini * G / (micro * P)
    steps_per_generation        = B * G / (micro * P)
    => generation_batch_size    = micro * P * steps_per_generation = B * G   (TRL's GRPOConfig)

so T, the prompts per update and the optimizer steps per update do not depend on P. Each
process samples B * G / P of the update's responses (TRL splits the generation batch by
process rank); the gradient of an optimizer step is the mean over its mini * G responses
(TRL's per-micro-batch mean divided by the accumulation steps, averaged over processes by
DDP/FSDP). :func:`plan_batches` refuses a P that does not divide the batch evenly.

The second optimizer step of an update trains on responses sampled before the first step,
so its importance ratio differs from 1 and the clip acts (PPO semantics); TRL computes the
behaviour log-probabilities at generation time whenever steps_per_generation exceeds
gradient_accumulation_steps. Run directories, checkpoints (``step_N``), ``train.max_steps``
and the ES<->GRPO budget split all count updates; TRL's ``global_step`` counts optimizer
steps (``optimizer_steps`` in metrics.jsonl).

Epochs: TRL's sampler shuffles per epoch and drops the last partial batch (as verl does),
so an epoch is floor(N / B) updates, while ES keeps the tail (ceil(N / B)). On GSM8K
(N = 7,473, B = 64) that is 116 vs 117 updates per epoch.
"""

from __future__ import annotations

from dataclasses import dataclass

from esreason.errors import UserError
from esreason.grpo.config import GRPORunConfig, mini_batch_prompts


@dataclass(frozen=True)
class BatchPlan:
    """TRL batch settings for one run. B, G, the mini-batch, T and the optimizer steps are global
    (the same for every process count); the micro-batch and the TRL step counts derived from it
    are per process."""

    prompts_per_update: int
    """B: prompts in one rollout batch."""
    generations: int
    """G: responses per prompt."""
    prompts_per_optimizer_step: int
    """Mini-batch in prompts."""
    sequences_per_micro_batch: int
    """TRL per_device_train_batch_size."""
    updates_per_epoch: int
    """floor(N / B)."""
    total_updates: int
    """T: train.max_steps, or epochs x updates_per_epoch."""
    num_processes: int = 1
    """P: training processes (accelerate launch --num_processes); 1 without a launcher."""

    @property
    def optimizer_steps_per_update(self) -> int:
        return self.prompts_per_update // self.prompts_per_optimizer_step

    @property
    def gradient_accumulation_steps(self) -> int:
        """Micro-batches per optimizer step on each process: mini x G / (micro x P)."""
        return (self.prompts_per_optimizer_step * self.generations
                // (self.sequences_per_micro_batch * self.num_processes))

    @property
    def steps_per_generation(self) -> int:
        """Micro-batches per rollout batch on each process: B x G / (micro x P)."""
        return self.prompts_per_update * self.generations // (self.sequences_per_micro_batch * self.num_processes)

    @property
    def sequences_per_process(self) -> int:
        """Responses of one update sampled (and trained on) by each process: B x G / P."""
        return self.sequences_per_update // self.num_processes

    @property
    def sequences_per_update(self) -> int:
        return self.prompts_per_update * self.generations

    @property
    def total_optimizer_steps(self) -> int:
        return self.total_updates * self.optimizer_steps_per_update

    def update_of(self, optimizer_step: int) -> int:
        """The update index T reached after TRL's ``global_step`` optimizer steps."""
        return optimizer_step // self.optimizer_steps_per_update

    def is_update_boundary(self, optimizer_step: int) -> bool:
        return optimizer_step % self.optimizer_steps_per_update == 0

    def as_dict(self) -> dict[str, int]:
        return {
            "prompts_per_update": self.prompts_per_update,
            "generations": self.generations,
            "sequences_per_update": self.sequences_per_update,
            "num_processes": self.num_processes,
            "sequences_per_process": self.sequences_per_process,
            "prompts_per_optimizer_step": self.prompts_per_optimizer_step,
            "optimizer_steps_per_update": self.optimizer_steps_per_update,
            "sequences_per_micro_batch": self.sequences_per_micro_batch,
            "gradient_accumulation_steps": self.gradient_accumulation_steps,
            "steps_per_generation": self.steps_per_generation,
            "updates_per_epoch": self.updates_per_epoch,
            "total_updates": self.total_updates,
            "total_optimizer_steps": self.total_optimizer_steps,
        }


def updates_per_epoch(num_problems: int, batch_size: int) -> int:
    """Full rollout batches in one pass over ``num_problems`` (the tail is dropped)."""
    return num_problems // batch_size


def check_divisible(cfg: GRPORunConfig, num_processes: int) -> None:
    """Raise UserError unless P processes split every optimizer step into whole micro-batches.

    The condition is (mini x G) % (micro x P) == 0 with mini the prompts per optimizer step
    (:func:`esreason.grpo.config.mini_batch_prompts`; it implies (B x G) % (micro x P) == 0, since mini divides B).
    """
    tr, g = cfg.train, cfg.grpo
    if num_processes < 1:
        raise UserError(f"number of processes must be >= 1 (got {num_processes})")
    mini = mini_batch_prompts(cfg)
    step_seqs = mini * g.num_generations
    per_step = g.micro_batch_size * num_processes
    if step_seqs % per_step:
        raise UserError(
            f"config key 'grpo.micro_batch_size': {num_processes} processes x {g.micro_batch_size} sequences per "
            f"micro-batch = {per_step} does not divide the {step_seqs} sequences of one optimizer step "
            f"({mini} prompts x grpo.num_generations={g.num_generations}; the update is train.batch_size="
            f"{tr.batch_size} x {g.num_generations} = {tr.batch_size * g.num_generations} sequences); "
            "change grpo.micro_batch_size or the number of processes")


def plan_batches(cfg: GRPORunConfig, num_problems: int, num_processes: int = 1) -> BatchPlan:
    """The :class:`BatchPlan` of ``cfg`` on a training split of ``num_problems`` prompts, trained by
    ``num_processes`` processes (T and the prompts per update do not depend on it).

    Raises UserError (naming train.batch_size) when not even one full batch fits, and (naming
    grpo.micro_batch_size) when the processes cannot split the batch evenly.
    """
    tr, g = cfg.train, cfg.grpo
    check_divisible(cfg, num_processes)
    per_epoch = updates_per_epoch(num_problems, tr.batch_size)
    if per_epoch < 1:
        raise UserError(f"config key 'train.batch_size': {tr.batch_size} prompts per update but the training "
                        f"split of task {cfg.task!r} has only {num_problems} problems")
    total = tr.max_steps if tr.max_steps is not None else tr.epochs * per_epoch
    return BatchPlan(prompts_per_update=tr.batch_size, generations=g.num_generations,
                     prompts_per_optimizer_step=mini_batch_prompts(cfg),
                     sequences_per_micro_batch=g.micro_batch_size, updates_per_epoch=per_epoch,
                     total_updates=total, num_processes=num_processes)


def trl_forwards(cfg: GRPORunConfig, num_processes: int = 1) -> dict[str, int]:
    """Forward-equivalents TRL 1.16 runs per padded token of a rollout under this config's batching
    (the plan's GRPO train term); a backward counts as two forwards.

    - ``train``: 3, the loss forward and its backward (``GRPOTrainer._compute_loss``);
    - ``recompute``: 1 with ``grpo.gradient_checkpointing`` (the backward reruns each checkpointed
      layer's forward);
    - ``old_logps``: 1 when ``GRPOTrainer._generate_and_score_completions`` recomputes the behaviour
      log-probabilities: when ``gradient_accumulation_steps % (steps_per_generation x num_iterations)
      != 0``, or with ``vllm_importance_sampling_correction`` under vLLM, which
      :func:`esreason.grpo.trainer.build_trl_args` turns off (and sets num_iterations = 1). So it runs
      exactly when an update makes more than one optimizer step (``grpo.mini_batch_size`` <
      ``train.batch_size``, or ``grpo.mini_batches`` > 1), as the paper's Easy config does (B / mini = 2);
    - ``reference``: 1 when ``grpo.beta != 0`` (the same function, ``ref_per_token_logps`` under no_grad).

    Both extra forwards run under ``torch.no_grad`` with checkpointing disabled
    (``disable_gradient_checkpointing``), in chunks of ``per_device_train_batch_size`` rows of the
    whole padded generation batch.
    """
    g = cfg.grpo
    check_divisible(cfg, num_processes)
    shape = BatchPlan(prompts_per_update=cfg.train.batch_size, generations=g.num_generations,
                      prompts_per_optimizer_step=mini_batch_prompts(cfg),
                      sequences_per_micro_batch=g.micro_batch_size, updates_per_epoch=1, total_updates=1,
                      num_processes=num_processes)
    num_iterations = 1  # build_trl_args
    old = shape.gradient_accumulation_steps % (shape.steps_per_generation * num_iterations) != 0
    return {"train": 3, "recompute": int(g.gradient_checkpointing), "old_logps": int(old),
            "reference": int(g.beta != 0.0)}


def passes_per_token(cfg: GRPORunConfig, num_processes: int = 1) -> dict[str, int]:
    """Forward-equivalents (a backward counts 2) TRL 1.16 spends per generated token of an update, by part:

    - ``sample``: 1, the rollout's decoding forward (vLLM or ``generate``);
    - ``forward``: 1 and ``backward``: 2, the loss forward and its backward (``train`` of :func:`trl_forwards`);
    - ``recompute``: 1 with ``grpo.gradient_checkpointing``;
    - ``old_policy``: 1 when an update makes several optimizer steps (the behaviour log-probabilities);
    - ``reference``: 1 when ``grpo.beta != 0``.

    Each generated token is trained on once per update (``num_iterations`` 1), whatever the optimizer steps.
    The paper's 8 P L per response (appendix "ES-GRPO FLOP Matching") counts 4 of these, one policy forward,
    the reference forward and the backward (``paper``: 4 whatever the config). Prompt tokens and padding are
    left out of both counts, as L leaves them out.
    """
    f = trl_forwards(cfg, num_processes)
    return {"sample": 1, "forward": 1, "backward": 2, "recompute": f["recompute"], "old_policy": f["old_logps"],
            "reference": f["reference"]}


__all__ = ["BatchPlan", "check_divisible", "passes_per_token", "plan_batches", "trl_forwards", "updates_per_epoch"]
