"""Who is in the population at update t: seeds and signs.

Step 2 of the paper's procedure: "draw N independent 32-bit perturbation seeds".
Seeds are a pure function of (train seed, update index), so a resumed run draws
exactly the seeds the uninterrupted run would have drawn.

Estimators (paper appendix "ES-ZO Estimator Equivalence"):

- one_point: N members (seed_i, +1).
- two_point: N/2 directions, each evaluated at +sigma and -sigma, i.e. members
  (seed_j, +1), (seed_j, -1). The evaluation budget stays N, as in the paper's
  matched ablation. Shaping is applied to all N rewards jointly and member i
  contributes weight z_i * sign_i, so the update is
  alpha/N * sum_j (z_j+ - z_j-) eps_j = alpha/(N/2) * sum_j (z_j+ - z_j-)/2 * eps_j,
  the antithetic (two-point) estimator with the population-standardised
  paired difference; a common shift of all rewards cancels in each pair.

Rewards are kept by population index, never keyed by seed: duplicate seeds can
occur (2^32 draws) and must count twice.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

_SEED_STREAM = 0x5EED  # domain separator: population seeds
_SAMPLING_STREAM = 0x5A3F  # domain separator: generation sampling seeds


@dataclass(frozen=True)
class Population:
    """Members of one update: ``seeds[i]`` with perturbation ``signs[i] * sigma``."""

    seeds: tuple[int, ...]
    signs: tuple[int, ...]

    def __len__(self) -> int:
        return len(self.seeds)


def _rng(*key: int) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([int(k) for k in key])))


def draw_population(train_seed: int, step: int, size: int, estimator: str) -> Population:
    """The population of update ``step`` (0-based)."""
    n_dirs = size if estimator == "one_point" else size // 2
    seeds = _rng(train_seed, _SEED_STREAM, step).integers(0, 2**32, size=n_dirs, dtype=np.uint64)
    seeds_l = [int(s) for s in seeds]
    if estimator == "one_point":
        return Population(tuple(seeds_l), (1,) * size)
    if estimator == "two_point":
        return Population(tuple(s for s in seeds_l for _ in (0, 1)), tuple(v for _ in seeds_l for v in (1, -1)))
    raise ValueError(f"unknown estimator {estimator!r}")


def sampling_seeds(train_seed: int, step: int, size: int, mode: str) -> list[int]:
    """Per-member generation seeds: one shared seed ('common') or one per member ('independent')."""
    rng = _rng(train_seed, _SAMPLING_STREAM, step)
    if mode == "common":
        return [int(rng.integers(0, 2**31))] * size
    if mode == "independent":
        return [int(s) for s in rng.integers(0, 2**31, size=size)]
    raise ValueError(f"unknown sampling seed mode {mode!r}")
