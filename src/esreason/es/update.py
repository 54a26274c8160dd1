"""The ES centre update (paper Eq. es-practical-update, procedure step 5).

    theta_{t+1} = theta_t + alpha / N * sum_{i=1}^{N} w_i * eps_i

with w_i = z_i (one-point) or z_i * sign_i (two-point members), accumulated in
float32 per tensor. The 1/sigma factor of the raw estimator is absorbed into
alpha, as in the paper. Directions are regenerated from their seeds here, not
kept from the evaluation phase.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import torch

from esreason.es.noise import direction

#: Directions already generated in this update, keyed by (seed, tensor name). Optional:
#: a pure speed-up (the tensors are exactly what ``direction`` returns).
DirectionCache = Mapping[tuple[int, str], torch.Tensor]


def weighted_direction_sum(name: str, shape: torch.Size, seeds: Sequence[int],
                           weights: Sequence[float], cache: DirectionCache | None = None) -> torch.Tensor:
    """sum_i weights_i * eps(seeds_i, name) as a float32 CPU tensor of ``shape``.

    Members with weight exactly 0 contribute nothing and are skipped (an
    all-equal population therefore costs no noise generation at all).
    """
    acc = torch.zeros(tuple(shape), dtype=torch.float32)  # [*shape] fp32 accumulator
    for seed, w in zip(seeds, weights):
        if w != 0.0:
            eps = cache.get((seed, name)) if cache is not None else None
            if eps is None:
                eps = direction(seed, name, shape)
            acc.add_(eps.to(acc.device), alpha=float(w))
    return acc


def update_delta(name: str, shape: torch.Size, seeds: Sequence[int], weights: Sequence[float],
                 alpha: float, cache: DirectionCache | None = None) -> torch.Tensor:
    """alpha / N * sum_i w_i eps_i for one tensor (float32, CPU); N = len(seeds)."""
    if len(seeds) != len(weights):
        raise ValueError(f"{len(seeds)} seeds but {len(weights)} weights")
    acc = weighted_direction_sum(name, shape, seeds, weights, cache)
    return acc.mul_(alpha / len(seeds))
