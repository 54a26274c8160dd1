"""``GRPOComparator``: the paper's GRPO (our TRL configuration) on a user's model, data and reward.

TRL's own ``GRPOTrainer`` takes the same reward functions and dataset; this class runs them with
the comparator's settings (the paper's objective, population-std advantages, an epoch-seeded data
order, FLOP matching through ``grpo.num_generations`` = N/4) and writes the run directory
``esreason train grpo`` writes, so its checkpoints enter the same evaluation and report. Its
docstring has the parameters and an example.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, Sequence

from esreason.api.data import register_api_task, reward_task
from esreason.errors import UserError


class GRPOComparator:
    """GRPO on ``train_dataset`` scored by ``reward_funcs`` (TRL's contract), into ``output_dir``.

    model: 'demo', a model directory or a hub id (wins over the config's ``model``; None: the config's).
    reward_funcs: one callable or a list with TRL's contract, as for :class:`esreason.ESTrainer`. None:
        train on the config's registered task with its own verifier.
    train_dataset: a ``datasets.Dataset`` or a list of dicts with a ``prompt`` column, scored by
        ``reward_funcs``.
    args: the GRPO run config: a :class:`esreason.grpo.config.GRPORunConfig`, the path of its YAML
        file (keys in docs/config.md, "GRPO run config"), or None (the GRPO defaults: the paper's Easy
        column).
    output_dir: the run directory (the one ``esreason train grpo --output`` writes).
    overrides: ``--set``-style ``key=value`` strings applied on top of a YAML ``args`` (or of the
        defaults).
    reward_weights: one weight per reward function (TRL's ``reward_weights``); None = 1 each.
    pass_threshold: a sample whose combined reward is >= this counts as correct.
    task: the name ``train_dataset`` is registered under (default: the config's ``task``, or
        ``custom`` when that is the default ``demo-add``); without ``reward_funcs``, the registered task
        to train on (default: the config's).

    Example::

        from esreason import GRPOComparator

        def exact(completions, total, **kwargs):
            return [float(str(t) in c) for c, t in zip(completions, total)]

        rows = [{"prompt": f"{a}+{b}", "total": a + b} for a in range(10, 40) for b in range(10, 40)]
        grpo = GRPOComparator("demo", exact, rows, output_dir="runs/api-grpo",
                              overrides=["train.max_steps=1", "train.batch_size=2", "grpo.num_generations=2",
                                         "generation.max_new_tokens=16"])
        grpo.train()  # runs/api-grpo: the run directory of `esreason train grpo`
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
        elif reward_weights is not None or pass_threshold != 1.0:
            raise UserError("reward_weights / pass_threshold: they combine and judge reward_funcs; a registered task "
                            "scores with its own verifier (a task file: its own keys)")
        elif task is not None:  # a registered task (a built-in, a task file) with its own verifier
            cfg = replace(cfg, task=task)
        self.config = cfg
        self.output_dir = Path(output_dir)
        self.result: Any = None

    def train(self, resume_from_checkpoint: bool | None = None) -> Any:
        """Run GRPO (``esreason train grpo``'s code path); returns its result (updates done, final checkpoint).

        resume_from_checkpoint: True continues from the newest checkpoint (None or False: a new run).
        """
        from esreason.grpo.distributed import shutdown_process_group
        from esreason.grpo.run import run_grpo

        try:
            self.result = run_grpo(self.config, self.output_dir, resume=bool(resume_from_checkpoint))
        finally:
            shutdown_process_group(vllm_colocated=self.config.grpo.use_vllm and self.config.grpo.vllm_mode == "colocate")
        return self.result


__all__ = ["GRPOComparator"]
