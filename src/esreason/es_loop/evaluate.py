"""Evaluating a population, one member at a time (paper procedure step 3).

For member i: perturb the centre by signs[i] * sigma * eps(seeds[i]), generate one
response per prompt of the shared mini-batch, score it with the task verifier,
average into R_i, restore the centre. Rewards are returned by population index.

This is the sequential reference evaluator; batched and distributed evaluators
(:mod:`esreason.backends`) must return identical rewards for the same seeds.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Sequence

import numpy as np

from esreason.backends.base import Generator, PerturbablePolicy, PopulationResult, SamplingParams
from esreason.es.population import Population
from esreason.verifiers.base import Verdict
from esreason.verifiers.batch import score_texts


def evaluate_population(policy: PerturbablePolicy, generator: Generator, population: Population,
                        sigma: float, prompts: Sequence[str], golds: Sequence[Any],
                        scorer: Callable[[str, Any], Verdict],
                        params: Sequence[SamplingParams]) -> PopulationResult:
    """Sequentially evaluate every member; ``params[i]`` are member i's sampling params."""
    n, b = len(population), len(prompts)
    rewards = np.zeros((n, b), dtype=np.float64)
    correct = np.zeros((n, b), dtype=bool)
    formatted = np.zeros((n, b), dtype=bool)
    lengths = np.zeros((n, b), dtype=np.int64)
    tokens = 0
    t_gen = t_rew = 0.0
    for i, (seed, sign) in enumerate(zip(population.seeds, population.signs)):
        policy.perturb(seed, sign * sigma)
        try:
            t0 = time.perf_counter()
            gen = generator.generate(prompts, params[i])
            t_gen += time.perf_counter() - t0
        finally:
            policy.restore()
        t0 = time.perf_counter()
        for j, v in enumerate(score_texts(scorer, gen.texts, golds)):  # one call per member
            rewards[i, j], correct[i, j], formatted[i, j] = v.reward, v.correct, v.formatted
        t_rew += time.perf_counter() - t0
        tokens += gen.num_tokens
        lengths[i] = [len(ids) for ids in gen.token_ids]
    return PopulationResult(rewards, correct, formatted, tokens, {"generate": t_gen, "reward": t_rew}, lengths)


class SequentialEvaluator:
    """The reference :class:`~esreason.backends.base.PopulationEvaluator` (``backend.type: hf``):
    :func:`evaluate_population` on one in-process policy. The trainer applies updates to
    the same policy, so :meth:`after_update` has nothing to do."""

    def __init__(self, policy: PerturbablePolicy, generator: Generator) -> None:
        self.policy = policy
        self.generator = generator

    def evaluate(self, population: Population, sigma: float, prompts: Sequence[str], golds: Sequence[Any],
                 scorer: Callable[[str, Any], Verdict], params: Sequence[SamplingParams]) -> PopulationResult:
        return evaluate_population(self.policy, self.generator, population, sigma, prompts, golds, scorer, params)

    def after_update(self, seeds: Sequence[int], weights: Sequence[float], alpha: float, step: int) -> None:
        return None

    def close(self) -> None:
        return None
