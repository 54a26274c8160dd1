"""``GRPOComparator``: the paper's GRPO (our TRL configuration) on a user's model, data and reward.

    from esreason import GRPOComparator
    grpo = GRPOComparator(model="demo", reward_funcs=my_reward, train_dataset=ds,
                          args="configs/demo/grpo.yaml", output_dir="runs/mine-grpo",
                          overrides=["train.max_steps=10", "grpo.num_generations=4"])
    grpo.train()

TRL's own ``GRPOTrainer`` takes the same reward functions and dataset; this class runs them with
the comparator's settings (the paper's objective, population-std advantages, an epoch-seeded data
order, FLOP matching through ``grpo.num_generations`` = N/4) and writes the run directory
``esreason train grpo`` writes, so its checkpoints enter the same evaluation and report. ``args`` is
the GRPO run config (:class:`esreason.grpo.config.GRPORunConfig`, or the path of its YAML file):
its keys are documented in docs/config.md.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, Sequence

from esreason.api.data import register_api_task, reward_task
from esreason.errors import UserError


class GRPOComparator:
    """GRPO on ``train_dataset`` scored by ``reward_funcs`` (TRL's contract), into ``output_dir``.

    model: 'demo', a model directory or a hub id (wins over the config's ``model``).
    args: a GRPORunConfig, a YAML path, or None (the GRPO defaults: the paper's Easy column).
    overrides: ``--set``-style ``key=value`` strings applied to a YAML ``args``.
    reward_weights / pass_threshold: as for :class:`esreason.ESConfig`.
    """

    def __init__(self, model: str | None = None, reward_funcs: Any = None, train_dataset: Any = None,
                 args: Any = None, *, output_dir: str | Path = "runs/grpo-api", overrides: Sequence[str] = (),
                 reward_weights: Sequence[float] | None = None, pass_threshold: float = 1.0,
                 task: str | None = None) -> None:
        from esreason.grpo.config import GRPORunConfig, load_grpo_config

        if args is None or isinstance(args, (str, Path)):
            cfg = load_grpo_config(args, list(overrides))
        elif isinstance(args, GRPORunConfig):
            if overrides:
                raise UserError("overrides apply to a YAML args; change a GRPORunConfig with dataclasses.replace")
            cfg = args
        else:
            raise UserError(f"args: expected a GRPORunConfig or a YAML path, got {type(args).__name__}")
        if model is not None:
            if not isinstance(model, (str, Path)):
                raise UserError("model: GRPOComparator takes 'demo', a model directory or a hub id "
                                "(TRL reloads the policy and its KL reference from it)")
            cfg = replace(cfg, model=str(model))
        if reward_funcs is not None:
            if train_dataset is None:
                raise UserError("train_dataset: reward_funcs need a dataset to train on")
            name = task or (cfg.task if cfg.task != "demo-add" else "custom")
            register_api_task(reward_task(name, reward_funcs, {"train": train_dataset},
                                          reward_weights=reward_weights, pass_threshold=pass_threshold))
            cfg = replace(cfg, task=name)
        elif train_dataset is not None:
            raise UserError("reward_funcs: a train_dataset needs reward functions to score it")
        self.config = cfg
        self.output_dir = Path(output_dir)
        self.result: Any = None

    def train(self, resume_from_checkpoint: bool | None = None, *, accept_task_change: bool = False) -> Any:
        """Run GRPO (``esreason train grpo``'s code path); True resumes from the newest checkpoint.

        accept_task_change: resume although the training data or the reward functions differ from the
            run's (``--accept-task-change``; without it such a resume is refused in one line).
        """
        from esreason.grpo.distributed import shutdown_process_group
        from esreason.grpo.run import run_grpo

        try:
            self.result = run_grpo(self.config, self.output_dir, resume=bool(resume_from_checkpoint),
                                   accept_task_change=accept_task_change)
        finally:
            shutdown_process_group(vllm_colocated=self.config.grpo.use_vllm and self.config.grpo.vllm_mode == "colocate")
        return self.result


__all__ = ["GRPOComparator"]
