"""Backend protocols: the only seam between esreason's algorithms and an inference engine.

Three roles (DESIGN §2):

- :class:`Generator` samples responses for a batch of prompts.
- :class:`PerturbablePolicy` moves its weights to ``theta + sigma * eps(seed)``,
  restores the centre bit-exactly, and applies the ES update.
- :class:`PopulationEvaluator` evaluates a whole population (one member at a
  time, batched, or over a Ray pool) and returns rewards by population index.

vLLM and Ray are imported only inside ``esreason.backends``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, Sequence, runtime_checkable

import numpy as np


@dataclass(frozen=True)
class SamplingParams:
    """How to sample.

    max_new_tokens: response limit in tokens.
    temperature: 0 means greedy (argmax); otherwise softmax(logits / temperature).
    top_p: nucleus mass kept (1.0 = full distribution).
    seed: seed of this call's sampling randomness (same seed + same weights => same texts).
    compute_entropy: also return, per response, the sum over its generated tokens of the
        token-level entropy of the sampling distribution (at ``temperature``, before top-p
        truncation); see ``Generation.entropy_sum``.
    """

    max_new_tokens: int = 64
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    compute_entropy: bool = False


@dataclass
class Generation:
    """Result of one generate call, in prompt order.

    texts: decoded responses (special tokens and the stop token removed).
    token_ids: generated token ids per response (stop token excluded).
    entropy_sum: per response, the sum over generated tokens of the token entropy
        (nats), or None when not requested; divide by ``len(token_ids[i])`` (or
        pool over responses) to average.
    stop_ids: per response, the stop (EOS) id that ended it, None where it ended at its token
        budget or the context limit; None when the engine does not report it (only
        :class:`esreason.backends.sampling.Sampler` does: GRPO's rollouts append it, as
        ``generate`` keeps the EOS in a completion).
    """

    texts: list[str]
    token_ids: list[list[int]]
    entropy_sum: list[float] | None = None
    stop_ids: list[int | None] | None = None

    @property
    def num_tokens(self) -> int:
        return sum(len(t) for t in self.token_ids)


@dataclass
class PopulationResult:
    """Outcome of one population evaluation.

    rewards: [N, B] per member, per prompt training reward.
    correct: [N, B] verifier-correct flags.
    formatted: [N, B] followed the final-answer format.
    tokens: generated tokens in total.
    timings: seconds per phase ('generate', 'reward').
    lengths: [N, B] generated tokens of each response (stop token excluded; ``max_new_tokens`` where
        it ended at the cap), or None from an evaluator that does not report them.
    """

    rewards: np.ndarray
    correct: np.ndarray
    formatted: np.ndarray
    tokens: int
    timings: dict[str, float] = field(default_factory=dict)
    lengths: np.ndarray | None = None

    @property
    def member_rewards(self) -> np.ndarray:
        """R_i = mean reward over the mini-batch, shape [N]. A NaN reward (a sample no reward function
        scored: TRL's all-``None`` row) is left out of its member's mean, as TRL leaves it out of a
        group's baseline; a member with no scored sample is an error."""
        if not np.isnan(self.rewards).any():
            return self.rewards.mean(axis=1)
        unscored = np.isnan(self.rewards).all(axis=1)
        if unscored.any():
            from esreason.errors import UserError

            raise UserError(f"no reward function scored any completion of population member "
                            f"{int(np.flatnonzero(unscored)[0])} (every function returned None for every row)")
        return np.nanmean(self.rewards, axis=1)


@runtime_checkable
class Generator(Protocol):
    def generate(self, prompts: Sequence[str], params: SamplingParams) -> Generation: ...


@runtime_checkable
class PerturbablePolicy(Protocol):
    def perturb(self, seed: int, sigma: float) -> None:
        """theta <- centre + sigma * eps(seed) (sigma may be negative for antithetic members)."""

    def restore(self) -> None:
        """theta <- centre, bit-exactly (or by subtraction in the paper-artifact mode)."""

    def apply_update(self, seeds: Sequence[int], weights: Sequence[float], alpha: float) -> float:
        """centre <- centre + alpha/len(seeds) * sum_i weights_i * eps(seeds_i); returns ||delta||_2."""

    def save(self, directory: str | Path) -> None:
        """Write a Hugging Face checkpoint of the centre."""


@runtime_checkable
class PopulationEvaluator(Protocol):
    """Evaluates a whole population around the current centre (paper procedure step 3).

    Implementations: :class:`esreason.es_loop.evaluate.SequentialEvaluator` (the reference: one
    member at a time on an :class:`PerturbablePolicy`), the population-batched evaluator
    and the Ray engine pool (``backend.type``). Every implementation must return the same
    rewards as the sequential reference for the same seeds.

    Optional (the Ray pool with ``backend.update: sharded``): ``owns_update`` True means the
    trainer calls ``apply_update(seeds, weights, alpha, step) -> norm`` instead of updating its
    own centre and calling :meth:`after_update`; the evaluator then updates the trainer's centre
    in the background and ``wait_reference()`` joins that before the trainer reads it.
    """

    def evaluate(self, population: Any, sigma: float, prompts: Sequence[str], golds: Sequence[Any],
                 scorer: Any, params: Sequence[SamplingParams]) -> PopulationResult:
        """Rewards of every member (:class:`PopulationResult`, by population index)."""

    def after_update(self, seeds: Sequence[int], weights: Sequence[float], alpha: float, step: int) -> None:
        """Called after the trainer applied update ``step`` to its own centre: engines that hold
        their own copy of the centre apply the same update from (seeds, weights); in-process
        evaluators do nothing."""

    def close(self) -> None:
        """Release engines, actors and memory (idempotent)."""
