"""The direction cache: one update's directions, kept so the update need not draw them again.

A pure speed-up (DESIGN §3): the entries are exactly what :func:`esreason.es.noise.direction_block`
(dense blocks) or :func:`esreason.es.lowrank.lowrank_factors` (packed low-rank factors) return
for the same arguments; they live on the weights' device, are never written anywhere, and
are dropped by every update. On the embedded default it cuts the perturb + restore + update share
of an ES step by about 40 % (benchmarks/es_step.py, ``overhead_share``; docs/measurements.md).
"""

from __future__ import annotations

from typing import Callable

import torch

#: Block index under which a tensor's packed low-rank factors are cached.
FACTORS = -1

#: (member seed, tensor name, block index or FACTORS)
CacheKey = tuple[int, str, int]


class DirectionCache:
    """Directions drawn during this update, up to ``budget_bytes`` (0 = keep nothing)."""

    def __init__(self, budget_bytes: int = 0) -> None:
        if budget_bytes < 0:
            raise ValueError(f"cache budget must be >= 0 bytes (got {budget_bytes})")
        self.budget_bytes = int(budget_bytes)
        self.entries: dict[CacheKey, torch.Tensor] = {}
        self.used_bytes = 0

    def get(self, key: CacheKey, draw: Callable[[], torch.Tensor]) -> torch.Tensor:
        """The cached tensor for ``key``, else ``draw()`` (kept while the budget allows)."""
        tensor = self.entries.get(key)
        if tensor is None:
            tensor = draw()
            size = tensor.numel() * tensor.element_size()
            if self.used_bytes + size <= self.budget_bytes:
                self.entries[key] = tensor
                self.used_bytes += size
        return tensor

    def clear(self) -> None:
        self.entries.clear()
        self.used_bytes = 0

    def __len__(self) -> int:
        return len(self.entries)
