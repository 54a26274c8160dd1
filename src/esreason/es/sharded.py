"""The sharded update: each engine sums only its own members; the engines add the sums exactly.

The replicated update (:mod:`esreason.es.update`) has every engine of a pool redraw all N
directions: at the paper's scale that is most of the ES overhead per engine
(benchmarks/noise.py). With ``backend.update: sharded`` the sum

    S = sum_{i=1}^{N} w_i eps_i          (the update is theta += alpha / N * S; Eq. es-practical-update)

is cut into ``num_shards`` shards -- shard k holds the members i with i mod num_shards == k,
summed in index order -- each engine computes the shards assigned to it and the engines add
their results with one all-reduce per noise block (docs/es.md, "Sharded update").

Exactness. A floating-point sum depends on its order, and an all-reduce's order depends on
the library's algorithm and on how many engines take part. So every shard's partial sum is
computed in fixed point and the shards are added as integers:

    P_k   = sum_{i in shard k} (w_i * 2**s) eps_i     fp32, index order (= 2**s times the plain
                                                      fp32 sum: power-of-two scaling is exact)
    q_k   = trunc(P_k)                                int64
    total = sum_k q_k                                 int64: exact and associative
    delta = float32(total) * (alpha / N * 2**-s)      the same bits wherever it is computed

so the update is bit-identical on every engine and in the trainer's reference (which sums
all shards itself, with no collective), whichever engine computed which shard, in whichever
order the collective added them, and with any number of live engines. It depends only on
``num_shards`` (a config value): a run resumed on fewer engines continues exactly.

The shift s is the largest with 2**s * EPS_BOUND * sum_i |w_i| <= 2**62, so neither a q_k
nor the total can overflow. ``torch.randn`` in fp32 never returns |eps| >= EPS_BOUND = 64
(Box-Muller of a uniform >= 2**-64 gives at most 9.4). With z-scored weights of N = 32
(sum |w| about 26) s = 51: truncation costs at most 2**-51 = 4e-16 of the sum, far below the
fp32 rounding of the partial sums themselves (about 5e-7 at |P| = 5), so the fixed point
changes how the sum is rounded, not how accurate it is.

Bytes (what the cost model in benchmarks/noise.py counts): scaling the weights instead of the
sums makes quantizing one int64 conversion per shard (read 4 B, write 8 B per element) and
dequantizing one conversion and one multiply (read 8 + 4 B, write 4 + 4 B); the all-reduce
moves 8 B per element.

Deviation from the replicated update: the two round differently, so a sharded run is not
bit-identical to a replicated one (both are the same sum to fp32 accuracy).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import torch

from esreason.es.cache import DirectionCache
from esreason.es.lowrank import region_chunks, region_matrix, row_chunks, stacked_factors
from esreason.es.noise import block_spans
from esreason.es.region import Region
from esreason.es.update import weighted_block_sum

#: Strict upper bound on |eps| of any fp32 torch.randn draw (see the module docstring).
EPS_BOUND = 64.0
#: All-reduce of an int64 tensor, in place, summing over the engines (None: no collective).
Reduce = Callable[[torch.Tensor], None]


@dataclass(frozen=True)
class Sharding:
    """Which part of the update this process computes.

    num_shards: shards the N members are cut into (``backend.engines`` of the run).
    shards: the shards this process sums (all of them for the trainer's reference).
    reduce: in-place int64 all-reduce (sum) over the engines, or None when ``shards`` covers
    every shard (no collective).
    """

    num_shards: int
    shards: tuple[int, ...]
    reduce: Reduce | None = None

    @classmethod
    def local(cls, num_shards: int) -> "Sharding":
        """Every shard here, no collective: the trainer's reference computation."""
        return cls(num_shards, tuple(range(num_shards)))


def shard_members(num_members: int, num_shards: int, shard: int) -> list[int]:
    """Member indices of ``shard``: i with i mod num_shards == shard, in index order."""
    if not 0 <= shard < num_shards:
        raise ValueError(f"shard {shard} out of range for {num_shards} shards")
    return list(range(shard, num_members, num_shards))


def assign_shards(num_shards: int, engines: int, position: int) -> tuple[int, ...]:
    """Shards of the engine at ``position`` (0..engines-1) among ``engines`` live engines: round robin."""
    if not 0 <= position < engines:
        raise ValueError(f"engine position {position} out of range for {engines} engines")
    return tuple(range(position, num_shards, engines))


def fixed_point_shift(weights: Sequence[float]) -> int | None:
    """s with 2**s * EPS_BOUND * sum|w| <= 2**62 (None when every weight is 0: nothing to add)."""
    total = math.fsum(abs(float(w)) for w in weights)
    if total == 0.0:
        return None
    if not math.isfinite(total):
        raise ValueError(f"update weights must be finite (sum of |w| = {total})")
    return 62 - math.ceil(math.log2(EPS_BOUND * total))


def quantize(scaled: torch.Tensor) -> torch.Tensor:
    """trunc(scaled) as int64 (scaled: an fp32 partial sum computed with weights w_i * 2**s)."""
    return scaled.to(torch.int64)  # [n] int64, truncated toward zero


def dequantize(total: torch.Tensor, shift: int, scale: float = 1.0) -> torch.Tensor:
    """float32(total) * (scale * 2**-shift): [n] fp32 from [n] int64 (two roundings, the same everywhere)."""
    return total.to(torch.float32).mul_(scale * 2.0 ** -shift)


def _shard_weights(seeds: Sequence[int], weights: Sequence[float], num_shards: int, shard: int,
                   shift: int) -> tuple[list[int], list[float]]:
    """The shard's seeds and its weights times 2**shift (exact: a power-of-two scaling)."""
    idx = shard_members(len(seeds), num_shards, shard)
    return [seeds[i] for i in idx], [math.ldexp(float(weights[i]), shift) for i in idx]


def sharded_update_pieces(p: torch.Tensor, name: str, seeds: Sequence[int], weights: Sequence[float],
                          alpha: float, sharding: Sharding, *, rank: int | None = None,
                          cache: DirectionCache | None = None, device: torch.device | str | None = None,
                          region: Region | None = None) -> Iterator[tuple[int, int, torch.Tensor]]:
    """(start, stop, delta piece fp32) of alpha/N * S over the flattened ``p`` (S: module docstring).

    Pieces are the noise blocks of a dense direction, or row chunks of a low-rank matrix
    (``rank`` = r_W), in the same order on every engine: each piece is one collective.
    ``device``: where directions are drawn and pieces computed (default ``p.device``).
    ``region``: ``p`` is a tensor-parallel shard of ``name`` (:mod:`esreason.es.region`): its pieces
    are its parts of the full tensor's blocks, one collective each; quantizing, the integer sum and
    dequantizing are elementwise, so a shard gets the slice of the unsharded result bit for bit
    (the engines' group for a shard is the same rank of every engine: same pieces, same order).
    """
    if len(seeds) != len(weights):
        raise ValueError(f"{len(seeds)} seeds but {len(weights)} weights")
    device = p.device if device is None else torch.device(device)
    if region is not None and rank is None:
        spans = [(lo, hi, (b, size, lo, hi)) for b, size, lo, hi in region.pieces()]
    elif rank is None:
        spans = [(start, stop, b) for b, start, stop in block_spans(p.numel())]
    elif region is not None:  # a low-rank matrix's shard: slices of the unsharded chunks (lowrank.region_chunks)
        m, n = region_matrix(region)
        spans = [(lo, hi, (r0, r1, i0, i1)) for lo, hi, r0, r1, i0, i1 in region_chunks(region)]
    else:
        m, n = int(p.shape[0]), int(p.shape[1])
        spans = [(r0 * n, r1 * n, (r0, r1, r0, r1)) for r0, r1 in row_chunks(m, n)]
    shift = fixed_point_shift(weights)
    if shift is None:  # every weight 0: every engine knows it, so none enters a collective
        for start, stop, _ in spans:
            yield start, stop, torch.zeros(stop - start, dtype=torch.float32, device=device)
        return
    shards = [_shard_weights(seeds, weights, sharding.num_shards, k, shift) for k in sharding.shards]
    if rank is not None:  # per shard: stacked factors [m, K r], [n, K r] fp32 (weights scaled by 2**s), or None
        factors = [stacked_factors(name, (m, n), s, w, rank, cache, device=device) for s, w in shards]

    def scaled_partial(k: int, where: Any, size: int) -> torch.Tensor | None:
        """Shard k's piece of sum_i (w_i 2**s) E_i: [size] fp32 (None: a low-rank shard with no weight)."""
        if region is not None and rank is None:  # where = (block, its size, local start, local stop)
            return weighted_block_sum(name, where[0], where[1], *shards[k], device=device, cache=cache,
                                      piece=(region, where[2], where[3]))
        if rank is None:
            return weighted_block_sum(name, where, size, *shards[k], device=device, cache=cache)
        if factors[k] is None:
            return None
        left, right = factors[k]
        r0, r1, i0, i1 = where  # full chunk [r0, r1), of which rows [i0, i1) are here
        full = torch.mm(left[r0:r1], right.t())  # [r1 - r0, n] fp32
        if region is None:
            return full.view(-1)  # [rows*n]
        return full[i0 - r0:i1 - r0, region.cols[0]:region.cols[1]].reshape(-1)  # [(i1 - i0) * cols]

    for start, stop, where in spans:
        total: torch.Tensor | None = None  # [piece] int64; the first shard's sum is used in place
        for k in range(len(shards)):
            partial = scaled_partial(k, where, stop - start)
            if partial is not None:
                total = quantize(partial) if total is None else total.add_(quantize(partial))
        if total is None:  # no shard here (more engines than shards) or only zero-weight members
            total = torch.zeros(stop - start, dtype=torch.int64, device=device)
        if sharding.reduce is not None:
            sharding.reduce(total)
        yield start, stop, dequantize(total, shift, alpha / len(seeds))  # [piece] fp32
