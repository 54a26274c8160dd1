"""Seeded perturbation directions, reconstructed on demand and never stored.

A population member is an integer seed. Its direction eps_i is, per parameter
tensor, a standard-Gaussian tensor drawn from a generator seeded by
``(seed, stable tensor name)`` (paper appendix "Implementation Procedure",
step 2). The tensor name is the one ``named_parameters()`` yields first, so tied
weights (shared embedding / LM head) are one tensor and are perturbed once.

Device independence: CUDA ``torch.randn`` with a seeded generator differs from
CPU and between GPU models (it depends on the SM count), so directions are always
drawn on the CPU in float32 and then moved/cast. The same seed therefore gives
the same direction on every machine, at the cost of a host-to-device copy on GPU.
"""

from __future__ import annotations

import hashlib

import torch


def tensor_seed(seed: int, name: str) -> int:
    """63-bit generator seed for (member seed, tensor name): blake2b, stable across runs and platforms."""
    digest = hashlib.blake2b(f"{int(seed)}\x1f{name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def direction(seed: int, name: str, shape: torch.Size | tuple[int, ...], *,
              device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """eps(seed, name): i.i.d. N(0, 1) tensor of ``shape``; float32 CPU draw, then ``.to(device, dtype)``."""
    gen = torch.Generator(device="cpu")
    gen.manual_seed(tensor_seed(seed, name))
    eps = torch.randn(tuple(shape), generator=gen, dtype=torch.float32)  # [*shape] fp32
    if eps.device != torch.device(device) or dtype != torch.float32:
        eps = eps.to(device=device, dtype=dtype)
    return eps
