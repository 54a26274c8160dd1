"""``esreason`` (``esreason.cli.main``) with the GRPO phases timed: rollout and train per update.

Usage: python benchmarks/gpu_acceptance_phases.py PHASES.json train grpo --config ... [CLI args]

Runs the real command line unchanged, after wrapping two methods of
:class:`esreason.grpo.trainer.PaperGRPOTrainer` (the TRL trainer ``esreason train grpo`` builds):

- ``_generate_and_score_completions`` (TRL 1.16 ``GRPOTrainer``, called from ``_prepare_inputs``
  once per generation batch = once per update here): the **rollout** phase -- generation, the
  rewards, the old-policy and reference log-probabilities (TRL computes the KL reference's
  log-probabilities there, so the reference forward is a rollout cost in this split);
- ``training_step`` (transformers ``Trainer``, one per micro-batch): its time minus the rollout
  that ran inside it is the **train** phase -- forward, backward (activation checkpointing), the
  optimizer steps.

Each wrapped call synchronises CUDA on exit (if CUDA is initialised), so asynchronous kernels are
charged to the phase that launched them. The per-update lists are written to PHASES.json when
the command returns (also when it fails); the exit status is the command's.
"""

from __future__ import annotations

import functools
import json
import sys
import time
from pathlib import Path
from typing import Any, Callable


def _sync() -> None:
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


class PhaseClock:
    """Rollout seconds per generation and training-step seconds grouped by the rollout they follow."""

    def __init__(self) -> None:
        self.rollout: list[float] = []
        self.step: list[float] = []  # training_step seconds (rollout inside included), per update
        self.micro_steps: list[int] = []

    def wrap_rollout(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                _sync()
                self.rollout.append(time.perf_counter() - t0)
                self.step.append(0.0)
                self.micro_steps.append(0)
        return timed

    def wrap_step(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                _sync()
                if self.step:  # the rollout of this update ran inside this call (or before it)
                    self.step[-1] += time.perf_counter() - t0
                    self.micro_steps[-1] += 1
        return timed

    def as_dict(self) -> dict[str, Any]:
        return {"rollout_s": self.rollout, "train_s": [s - r for s, r in zip(self.step, self.rollout)],
                "micro_steps": self.micro_steps}


def install(clock: PhaseClock) -> None:
    from esreason.grpo.trainer import PaperGRPOTrainer

    PaperGRPOTrainer._generate_and_score_completions = clock.wrap_rollout(
        PaperGRPOTrainer._generate_and_score_completions)
    PaperGRPOTrainer.training_step = clock.wrap_step(PaperGRPOTrainer.training_step)


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        raise SystemExit("usage: gpu_acceptance_phases.py PHASES.json COMMAND [ARGS...]")
    out, cli_args = Path(argv[0]), argv[1:]
    clock = PhaseClock()
    install(clock)
    from esreason.cli import main as cli_main

    try:
        return cli_main(cli_args)
    finally:
        out.write_text(json.dumps(clock.as_dict()))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
