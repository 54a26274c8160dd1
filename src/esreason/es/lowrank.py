"""Low-rank (EGGROLL) perturbation directions: ``es.perturbation: lowrank``.

Following "Evolution Strategies at the Hyperscale" (Sarkar et al. 2025, EGGROLL),
the direction of member i for a 2-D weight matrix W [m, n] is

    E_i = A_i B_i^T / sqrt(r_W),   A_i [m, r_W], B_i [n, r_W] i.i.d. N(0, 1),
    r_W = min(es.rank, m, n)

so every element of E_i has mean 0 and variance 1, like the dense direction of
``perturbation: full``, and the same sigma means the same per-weight noise scale.
Tensors that are not matrices (norm gains, biases, scalars, and any tensor with
ndim != 2) keep the dense Gaussian direction of :func:`esreason.es.noise.direction`.

``es.perturbation: lora`` (our restriction, for engines that evaluate members as LoRA adapters:
:mod:`esreason.backends.vllm_lora`): the same low-rank directions, on the weights of the decoder's
linear projections only (:data:`LORA_MODULES`: the modules a LoRA adapter targets); every other
tensor -- embedding, LM head, norms, biases, stacked experts, routers -- has no direction: members
leave it at the centre and updates never move it (:meth:`Perturbation.moves`). vLLM's multi-LoRA
batching can add x B A^T per member to exactly those layers and to nothing that a dense direction
would need (a norm gain or bias perturbation is not a low-rank change of any matrix).

Determinism (same contract as the dense directions, :mod:`esreason.es.noise`): the factors
of (seed, tensor name) are one float32 draw ``F = randn(m + n, r_W)`` on the weights'
device from its own generator seeded with ``tensor_seed(seed, name)``; ``A = F[:m]`` and
``B = F[m:]``. They are reconstructed from the seed whenever needed and never stored
beyond one update's optional in-memory cache (which holds the packed ``F`` [m + n, r_W],
far smaller than E). Perturb and update work on row chunks of at most
``BLOCK_ELEMENTS`` elements of E, so no [m, n] fp32 temporary of a large matrix exists.

Per-tensor rank clamp (our choice): ``es.rank`` larger than a matrix's smaller
dimension is clamped to ``min(m, n)`` for that matrix (a rank-r product of an
m x n matrix has rank <= min(m, n) anyway, and one ``es.rank`` must fit matrices
of every shape in a model). The 1/sqrt scale uses the clamped rank, so the
per-element variance stays 1.

The update (paper Eq. es-practical-update with E_i in place of eps_i)

    theta <- theta + alpha / N * sum_i w_i E_i
           = theta + alpha / N * [A_1 w_1 / sqrt(r) | ... | A_N w_N / sqrt(r)] [B_1 | ... | B_N]^T

is computed as one float32 GEMM of the stacked factors ([m, N r] x [N r, n]):
each term is rank r_W, the sum has rank up to min(N r_W, m, n), i.e. it is
full-rank in aggregate once N r_W >= min(m, n) — EGGROLL's point.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterator, Sequence

import torch

from esreason.errors import UserError
from esreason.es.cache import FACTORS, DirectionCache
from esreason.es.noise import BLOCK_ELEMENTS, device_generator, direction, tensor_seed
from esreason.es.region import Region

#: Allowed values of ``es.perturbation``.
PERTURBATIONS = ("full", "lowrank", "lora")
#: Linear projections (HF module names) whose 2-D ``weight`` ``perturbation: lora`` moves: the attention
#: and MLP projections of Llama / Qwen / Mistral decoders (and of a MoE layer's shared expert).
LORA_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def lora_module(name: str, shape: torch.Size | tuple[int, ...]) -> str | None:
    """The module of tensor ``name`` (``name`` without ``.weight``) when it is the 2-D weight of one of
    :data:`LORA_MODULES`, else None."""
    module, _, leaf = name.rpartition(".")
    if leaf != "weight" or len(shape) != 2 or module.rpartition(".")[2] not in LORA_MODULES:
        return None
    return module


def tensor_rank(shape: torch.Size | tuple[int, ...], rank: int) -> int:
    """r_W = min(rank, m, n) for a matrix shape [m, n] (the per-tensor clamp)."""
    m, n = shape
    return min(int(rank), int(m), int(n))


def lowrank_factors(seed: int, name: str, shape: torch.Size | tuple[int, ...], rank: int, *,
                    device: torch.device | str = "cpu") -> torch.Tensor:
    """Packed factors F = [A; B] of (seed, name): float32 [m + n, r_W], drawn on ``device``.

    ``A = F[:m]`` [m, r_W] and ``B = F[m:]`` [n, r_W]; i.i.d. N(0, 1), from the device's own
    generator (see :mod:`esreason.es.noise` for what is bit-identical where).
    """
    if len(shape) != 2:
        raise ValueError(f"low-rank factors need a 2-D shape, got {tuple(shape)} for {name}")
    m, n = int(shape[0]), int(shape[1])
    r = tensor_rank(shape, rank)
    gen = device_generator(device, tensor_seed(seed, name))
    return torch.randn((m + n, r), generator=gen, dtype=torch.float32, device=device)  # [m+n, r_W] fp32


def cached_factors(seed: int, name: str, shape: torch.Size | tuple[int, ...], rank: int,
                   device: torch.device | str, cache: DirectionCache | None = None) -> torch.Tensor:
    """:func:`lowrank_factors`, from this update's cache when it holds them."""
    if cache is None:
        return lowrank_factors(seed, name, shape, rank, device=device)
    return cache.get((int(seed), name, FACTORS), lambda: lowrank_factors(seed, name, shape, rank, device=device))


def row_chunks(m: int, n: int) -> Iterator[tuple[int, int]]:
    """Row ranges [r0, r1) of an [m, n] matrix with at most BLOCK_ELEMENTS elements each (>= 1 row)."""
    step = max(1, BLOCK_ELEMENTS // max(1, n))
    for r0 in range(0, m, step):
        yield r0, min(m, r0 + step)


def region_matrix(region: Region) -> tuple[int, int]:
    """(m, n) of the 2-D matrix a tensor-parallel shard ``region`` is part of (ValueError for any other
    region: an expert's block of a stacked tensor is not a low-rank-perturbed matrix)."""
    if region.offset != 0 or region.numel % region.width:
        raise ValueError(f"low-rank directions need a shard of a 2-D matrix (got {region})")
    return region.numel // region.width, region.width


def region_chunks(region: Region) -> Iterator[tuple[int, int, int, int, int, int]]:
    """Pieces of a shard for the low-rank *update*: (local start, local stop, r0, r1, i0, i1) per row chunk
    [r0, r1) of the full matrix (:func:`row_chunks`) that holds shard rows [i0, i1).

    The shard's delta is the slice [i0 - r0 : i1 - r0, cols] of the full chunk's GEMM -- the very call the
    unsharded update makes, with the same operands -- so a shard gets the unsharded update's bits (a GEMM
    of other shapes may sum its inner dimension in another order); a band of columns computes whole
    chunks for its slice (the GEMM's cost, r (m + n) draws stay the same)."""
    m, n = region_matrix(region)
    (lo_row, hi_row), width = region.rows, region.local_cols
    for r0, r1 in row_chunks(m, n):
        i0, i1 = max(r0, lo_row), min(r1, hi_row)
        if i1 > i0:
            yield (i0 - lo_row) * width, (i1 - lo_row) * width, r0, r1, i0, i1


def lowrank_direction(seed: int, name: str, shape: torch.Size | tuple[int, ...], rank: int, *,
                      device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """E(seed, name) = A B^T / sqrt(r_W), materialised as [m, n] (computed in fp32, then cast).

    For consumers that need the dense matrix (tests, batched evaluators); the
    perturb and update paths never materialise E beyond the perturbed weights.
    """
    packed = lowrank_factors(seed, name, shape, rank, device=device)  # [m+n, r] fp32
    m = int(shape[0])
    a, b = packed[:m], packed[m:]  # [m, r], [n, r]
    e = torch.mm(a, b.t()).mul_(1.0 / math.sqrt(packed.shape[1]))  # [m, n] fp32
    return e if dtype == torch.float32 else e.to(dtype)


def stacked_factors(name: str, shape: torch.Size | tuple[int, ...], seeds: Sequence[int],
                    weights: Sequence[float], rank: int, cache: DirectionCache | None = None, *,
                    device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor] | None:
    """([w_1 A_1 | ... | w_K A_K] / sqrt(r_W) [m, K r_W], [B_1 | ... | B_K] [n, K r_W]) over the
    members with a non-zero weight (K of them), fp32 on ``device``; None when K = 0."""
    if len(seeds) != len(weights):
        raise ValueError(f"{len(seeds)} seeds but {len(weights)} weights")
    m, n = int(shape[0]), int(shape[1])
    r = tensor_rank(shape, rank)
    lefts: list[torch.Tensor] = []
    rights: list[torch.Tensor] = []
    for seed, w in zip(seeds, weights):
        if w == 0.0:
            continue
        packed = cached_factors(seed, name, (m, n), rank, device, cache)  # [m+n, r] fp32
        lefts.append(packed[:m] * (float(w) / math.sqrt(r)))  # [m, r]: w_i A_i / sqrt(r)
        rights.append(packed[m:])  # [n, r]: B_i
    if not lefts:
        return None
    return torch.cat(lefts, dim=1), torch.cat(rights, dim=1)  # [m, K r], [n, K r] fp32


def lowrank_update_delta(name: str, shape: torch.Size | tuple[int, ...], seeds: Sequence[int],
                         weights: Sequence[float], alpha: float, rank: int,
                         cache: DirectionCache | None = None, *,
                         device: torch.device | str = "cpu") -> torch.Tensor:
    """alpha / N * sum_i w_i A_i B_i^T / sqrt(r_W) for one matrix: float32 [m, n] on ``device``.

    N = len(seeds). Members with weight exactly 0 are skipped (as in the dense
    update). The sum is one GEMM of the stacked, weight-scaled factors, accumulated
    in float32 by the BLAS of ``device``; it equals the member-by-member sum up to
    float32 rounding (summation order differs), not bit for bit. Materialised: for tests;
    training applies it by row chunks (:func:`esreason.es.apply.update_tensor`).
    """
    m, n = int(shape[0]), int(shape[1])
    stacked = stacked_factors(name, shape, seeds, weights, rank, cache, device=device)
    if stacked is None:
        return torch.zeros((m, n), dtype=torch.float32, device=device)
    left, right = stacked
    return torch.mm(left, right.t()).mul_(alpha / len(seeds))  # [m, n] fp32


@dataclass(frozen=True)
class Perturbation:
    """The direction family of a run: ``es.perturbation`` and ``es.rank``.

    ``tensor_rank(shape)`` is None where the tensor gets a dense Gaussian direction
    (``full`` mode, or a non-matrix tensor in ``lowrank`` mode) and r_W otherwise.
    ``moves(name, shape)`` is False for the tensors ``lora`` mode leaves alone (no direction at all).
    """

    kind: str = "full"
    rank: int = 1

    def __post_init__(self) -> None:
        if self.kind not in PERTURBATIONS:
            raise UserError(f"config key 'es.perturbation': must be one of {', '.join(PERTURBATIONS)} "
                            f"(got {self.kind!r})")
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 1:
            raise UserError(f"config key 'es.rank': must be an integer >= 1 (got {self.rank!r})")

    def tensor_rank(self, shape: torch.Size | tuple[int, ...]) -> int | None:
        """r_W for a low-rank-perturbed matrix, None for a dense direction."""
        if self.kind == "full" or len(shape) != 2:
            return None
        return tensor_rank(shape, self.rank)

    def moves(self, name: str, shape: torch.Size | tuple[int, ...]) -> bool:
        """Whether tensor ``name`` has a direction (every tensor, except outside the LoRA targets in ``lora`` mode)."""
        return self.kind != "lora" or lora_module(name, shape) is not None

    def direction(self, seed: int, name: str, shape: torch.Size | tuple[int, ...], *,
                  device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The materialised member direction of this family (dense eps, A B^T / sqrt(r_W), or zeros for
        a tensor that does not move)."""
        if not self.moves(name, shape):
            return torch.zeros(tuple(shape), dtype=dtype, device=device)
        if self.tensor_rank(shape) is None:
            return direction(seed, name, shape, device=device, dtype=dtype)
        return lowrank_direction(seed, name, shape, self.rank, device=device, dtype=dtype)
