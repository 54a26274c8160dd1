"""Tiny in-process ES and GRPO runs that record what a key test needs to see (not a test module).

:func:`es_run` trains through :class:`esreason.ESTrainer` (the same objects as ``esreason train es``)
on the session's tiny random model (tests/conftest.py, ``tiny_model_dir``: hidden 32, 2 layers), a
few ``a+b=`` prompts and a reward that varies with the text, and records:

- every call of the sampler (:class:`esreason.backends.sampling.Sampler`): its prompts, sampling
  parameters, texts and token ids, the rows of each model forward, and the offset of one weight
  matrix (:data:`PROBE`) from its start value while the call ran (a member's perturbation during
  training: ``sign * sigma * eps``);
- every call of the reward function (one per member: its completions and rewards);
- metrics.jsonl and the run directory.

A run of 4 members, 2 prompts and 6 new tokens takes about 0.3 s. :func:`grpo_run` does the same
through :class:`esreason.GRPOComparator` (B = 2 prompts x G = 2 responses, about 2 s) and records
the rollout batches the sampler draws for TRL (``grpo.rollouts: sampler``, the CPU default).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

#: The weight matrix whose perturbations and updates the tests follow (a [32, 64] matrix of the tiny model).
PROBE = "model.layers.0.mlp.down_proj.weight"

ROWS = [{"prompt": f"{a}+{b}=", "total": a + b} for a in range(3, 7) for b in range(2, 5)]  # 12 rows
EVAL_ROWS = [{"prompt": f"{a}-{b}=", "total": a - b} for a in range(7, 10) for b in range(1, 3)]  # 6 rows

#: The small run every key test starts from (flat ESConfig fields); a test changes one of them.
BASE = dict(population_size=4, batch_size=2, max_steps=1, max_new_tokens=6, sigma=0.05, alpha=0.01,
            checkpoint_every=1, backend="hf", eval_limit=None, eval_samples=2, eval_ks=(1, 2), eval_max_new_tokens=5)
# (held-out evaluation answers in 5 tokens, training in 6: Run.train_calls tells them apart)


def text_reward(completions: list[Any], total: list[int], **kwargs: Any) -> list[float]:
    """A reward in [0, 1) that changes with almost any change of the text (members get distinct rewards)."""
    return [(sum(map(ord, c if isinstance(c, str) else c[0]["content"])) % 101) / 100 for c in completions]


@dataclass(eq=False)
class Call:
    """One sampler call."""

    prompts: list[str]
    params: Any
    texts: list[str]
    token_ids: list[list[int]]
    offset: torch.Tensor | None
    """The probed matrix minus its start value during the call (None: no start value given)."""
    forward_rows: list[int]
    """Rows (batch size) of every model forward of the call."""


@dataclass
class Run:
    """A finished run and what it recorded."""

    out: Path
    result: Any
    calls: list[Call]
    rewards: list[list[float]] = field(default_factory=list)
    """One entry per reward-function call (ES: a member's rewards, in member order)."""
    start: torch.Tensor | None = None
    max_new_tokens: int = 0
    """The training response limit (a held-out evaluation's calls use another, BASE)."""
    rollouts: list = field(default_factory=list)
    """GRPO: the rollout batches the sampler drew for TRL."""
    config: Any = None
    """GRPO: the run config trained."""

    @property
    def metrics(self) -> list[dict]:
        return [json.loads(line) for line in (self.out / "metrics.jsonl").read_text().splitlines()]

    def train_calls(self) -> list[Call]:
        """The members' calls (sampling at the run's training settings, not a held-out evaluation)."""
        return [c for c in self.calls if c.params.max_new_tokens == self.max_new_tokens]

    def checkpoint(self, step: int | None = None) -> torch.Tensor:
        """The probed matrix in checkpoint ``step`` (default: the final one)."""
        path = Path(self.result.final_checkpoint) if step is None else self.out / "checkpoints" / f"step_{step}"
        return probe_tensor(path)

    def update(self) -> torch.Tensor:
        """The final checkpoint's probed matrix minus its start value (float64)."""
        return self.checkpoint().double() - self.start.double()


def probe_tensor(model_dir: Path) -> torch.Tensor:
    from safetensors.torch import load_file

    return load_file(str(Path(model_dir) / "model.safetensors"))[PROBE]


def record_sampler(monkeypatch: Any, start: torch.Tensor | None = None) -> list[Call]:
    """Wrap ``Sampler.generate`` so every call is recorded (see the module docstring)."""
    from esreason.backends.sampling import Sampler

    calls: list[Call] = []
    original = Sampler.generate

    def generate(self: Any, prompts: Any, params: Any, **kw: Any) -> Any:
        rows: list[int] = []

        def hook(module: Any, args: Any, kwargs: Any) -> None:
            ids = kwargs.get("input_ids", args[0] if args else None)
            rows.append(int(ids.shape[0]))

        offset = None
        if start is not None:
            offset = dict(self.model.named_parameters())[PROBE].detach().float().cpu() - start.float()
        handle = self.model.register_forward_pre_hook(hook, with_kwargs=True)
        try:
            out = original(self, prompts, params, **kw)
        finally:
            handle.remove()
        calls.append(Call(list(prompts), params, list(out.texts), [list(t) for t in out.token_ids], offset, rows))
        return out

    monkeypatch.setattr(Sampler, "generate", generate)
    return calls


def es_run(out: Path, monkeypatch: Any, model_dir: Path, *, rows: list[dict] | None = None,
           eval_rows: list[dict] | None = None, reward: Any = text_reward, trainer: dict | None = None,
           **flat: Any) -> Run:
    """Train ``BASE`` with the flat ESConfig fields ``flat`` changed into ``out`` and record it."""
    from esreason import ESConfig, ESTrainer

    start = probe_tensor(model_dir)
    calls = record_sampler(monkeypatch, start)
    rewards: list[list[float]] = []

    def recorded(completions: list[Any], **kwargs: Any) -> list[float]:
        values = reward(completions, **kwargs)
        rewards.append(list(values))
        return values

    recorded.__name__ = getattr(reward, "__name__", "reward")
    args = ESConfig(output_dir=str(out), model=str(model_dir), **{**BASE, **flat})
    kw = {"reward_funcs": recorded, "train_dataset": ROWS if rows is None else rows, "eval_dataset": eval_rows,
          **(trainer or {})}
    if kw["reward_funcs"] is None:
        kw.pop("train_dataset")
    result = ESTrainer(args=args, **kw).train()
    return Run(out, result, calls, rewards, start, args.max_new_tokens)


__all__ = ["BASE", "Call", "EVAL_ROWS", "PROBE", "ROWS", "Run", "es_run", "probe_tensor", "record_sampler",
           "text_reward"]


# --------------------------------------------------------------------------- GRPO

#: The small GRPO run every GRPO key test starts from (dotted keys of the GRPO run config).
GRPO_BASE = {"train.batch_size": 2, "train.max_steps": 1, "grpo.num_generations": 2, "grpo.micro_batch_size": 4,
             "grpo.learning_rate": 1e-3, "generation.max_new_tokens": 6, "checkpoint.every": 1}


@dataclass(eq=False)
class Rollout:
    """One rollout batch the sampler drew for TRL (``rollouts: sampler``)."""

    prompts: list[str]
    """The prompts as text (decoded from the ids TRL tokenised), G copies each."""
    params: Any
    token_ids: list[list[int]]


def record_rollouts(monkeypatch: Any) -> list[Rollout]:
    from esreason.backends.sampling import Sampler

    out: list[Rollout] = []
    original = Sampler.generate_ids

    def generate_ids(self: Any, prompt_ids: Any, params: Any, **kw: Any) -> Any:
        gen = original(self, prompt_ids, params, **kw)
        texts = [self.tokenizer.decode(list(p), skip_special_tokens=True) for p in prompt_ids]
        out.append(Rollout(texts, params, [list(t) for t in gen.token_ids]))
        return gen

    monkeypatch.setattr(Sampler, "generate_ids", generate_ids)
    return out


def grpo_run(out: Path, monkeypatch: Any, model_dir: Path, *, rows: list[dict] | None = None,
             reward: Any = text_reward, settings: dict[str, Any] | None = None, api: dict | None = None) -> Run:
    """Train ``GRPO_BASE`` with the dotted keys ``settings`` changed through :class:`esreason.GRPOComparator`
    (``reward=None``: the config's registered task with its own scorer; ``api``: more keyword arguments
    of GRPOComparator). Every reward-function call is recorded."""
    from esreason import GRPOComparator

    start = probe_tensor(model_dir)
    calls = record_sampler(monkeypatch, start)
    rollouts = record_rollouts(monkeypatch)
    dotted = {**GRPO_BASE, "model": str(model_dir), **(settings or {})}
    rewards: list[list[float]] = []

    def recorded(completions: list[Any], **kwargs: Any) -> list[float]:
        values = reward(completions, **kwargs)
        rewards.append(list(values))
        return values

    funcs = None
    if reward is not None:
        recorded.__name__ = reward.__name__  # TRL logs rewards/<name>/mean
        funcs = recorded
    grpo = GRPOComparator(None, funcs, (ROWS if rows is None else rows) if reward is not None else None,
                          overrides=[f"{k}={_yaml(v)}" for k, v in dotted.items()], output_dir=out, **(api or {}))
    result = grpo.train()
    # max_new_tokens -1: every sampler call of a GRPO run is a held-out evaluation (rollouts: generate_ids)
    return Run(out, result, calls, rewards, start, -1, rollouts, grpo.config)


def _yaml(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(map(str, value)) + "]"
    if value is None:
        return "null"
    return str(value).lower() if isinstance(value, bool) else str(value)
