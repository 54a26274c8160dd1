"""The ES centre update (paper Eq. es-practical-update, procedure step 5).

    theta_{t+1} = theta_t + alpha / N * sum_{i=1}^{N} w_i * eps_i

with w_i = z_i (one-point) or z_i * sign_i (two-point members), accumulated in float32
block by block (:data:`esreason.es.noise.BLOCK_ELEMENTS`) on the device that holds the
weights. The 1/sigma factor of the raw estimator is absorbed into alpha, as in the paper.
Directions are regenerated from their seeds here (or taken from this update's
:class:`~esreason.es.cache.DirectionCache`), not kept from the evaluation phase.

Applying the delta to a tensor is :func:`esreason.es.apply.update_tensor`; this module
computes it.
"""

from __future__ import annotations

from typing import Sequence

import torch

from esreason.es.cache import DirectionCache
from esreason.es.noise import block_spans, direction_block, numel_of
from esreason.es.region import Region

#: A shard's part of one noise block: (region, local start, local stop) (:meth:`Region.pieces`).
Piece = tuple[Region, int, int]


def block_direction(seed: int, name: str, block: int, size: int, device: torch.device | str,
                    cache: DirectionCache | None = None) -> torch.Tensor:
    """Block ``block`` of eps(seed, name) [size] fp32 on ``device``, from ``cache`` when it holds it."""
    if cache is None:
        return direction_block(seed, name, block, size, device=device)
    return cache.get((int(seed), name, int(block)),
                     lambda: direction_block(seed, name, block, size, device=device))


def weighted_block_sum(name: str, block: int, size: int, seeds: Sequence[int], weights: Sequence[float], *,
                       device: torch.device | str = "cpu", cache: DirectionCache | None = None,
                       piece: Piece | None = None) -> torch.Tensor:
    """sum_i weights_i * eps(seeds_i, name)[block] as float32 [size] on ``device``; with ``piece``
    only a shard's elements of the block, [stop - start] (each block drawn whole, then sliced:
    the same per-element arithmetic, so the shard's sum is the slice of the whole block's).

    Members with weight exactly 0 contribute nothing and are skipped (an all-equal
    population therefore costs no noise generation at all).
    """
    out = size if piece is None else piece[2] - piece[1]
    acc = torch.zeros(out, dtype=torch.float32, device=device)  # [out] fp32 accumulator
    for seed, w in zip(seeds, weights):
        if w != 0.0:
            eps = block_direction(seed, name, block, size, device, cache)  # [size] fp32
            acc.add_(eps if piece is None else piece[0].take(eps, block, piece[1], piece[2]), alpha=float(w))
    return acc


def update_block(name: str, block: int, size: int, seeds: Sequence[int], weights: Sequence[float], alpha: float, *,
                 device: torch.device | str = "cpu", cache: DirectionCache | None = None,
                 piece: Piece | None = None) -> torch.Tensor:
    """alpha / N * sum_i w_i eps_i[block]: float32 [size] (or a shard's ``piece`` of it) on ``device``; N = len(seeds)."""
    if len(seeds) != len(weights):
        raise ValueError(f"{len(seeds)} seeds but {len(weights)} weights")
    return weighted_block_sum(name, block, size, seeds, weights, device=device, cache=cache,
                              piece=piece).mul_(alpha / len(seeds))


def update_delta(name: str, shape: torch.Size | tuple[int, ...], seeds: Sequence[int], weights: Sequence[float],
                 alpha: float, cache: DirectionCache | None = None, *,
                 device: torch.device | str = "cpu") -> torch.Tensor:
    """alpha / N * sum_i w_i eps_i for a whole tensor, materialised: float32 [*shape] on ``device``.

    For tests and analyses; the training path applies the delta block by block
    (:func:`esreason.es.apply.update_tensor`) and never holds it whole.
    """
    n = numel_of(shape)
    out = torch.empty(n, dtype=torch.float32, device=device)  # [n] fp32
    for b, start, stop in block_spans(n):
        out[start:stop] = update_block(name, b, stop - start, seeds, weights, alpha, device=device, cache=cache)
    return out.view(tuple(shape))
