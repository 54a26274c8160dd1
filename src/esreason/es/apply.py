"""The ES operations on one tensor, piece by piece, on the device that holds it.

Shared by :class:`esreason.es.params.CentredParameters` (the transformers policy) and the
vLLM worker extension (:mod:`esreason.backends.vllm_worker`), so both move a centre by
the same arithmetic:

- :func:`perturb_tensor`   p <- round(base_fp32 + sigma * E(seed))        (procedure step 3)
- :func:`subtract_tensor`  p <- round(p_fp32 - sigma * E(seed))            (``restore: subtract``)
- :func:`update_tensor`    centre += alpha / N * sum_i w_i E(seed_i)       (step 5; replicated or sharded;
                           optionally pulled toward theta_0 after the step: :mod:`esreason.es.anchor`)

E is the dense direction eps (``rank=None``) or the low-rank A B^T / sqrt(r_W)
(:mod:`esreason.es.lowrank`). A *piece* is one noise block of a dense direction
(:data:`~esreason.es.noise.BLOCK_ELEMENTS` elements) or a chunk of rows of a low-rank
matrix of at most that many elements. Everything happens on ``p.device``: directions are
drawn there, the fp32 accumulator lives there, and the extra memory of any operation is a
few pieces (<= 3 x 16 MiB), never a copy of the tensor. Elementwise operations do not
depend on how a tensor is cut, so results equal the whole-tensor arithmetic bit for bit
(the low-rank GEMMs of a cut matrix may round differently on some BLAS; matrices of at
most BLOCK_ELEMENTS elements -- all of the embedded default's -- are never cut).

Masters: ``master`` is an fp32 copy of the centre (on the device, or in pinned host memory
for the vLLM worker when the device has no room; then each piece is copied to the device
once per operation). Without masters the model-dtype tensor is its own centre base.

Shards: with ``region`` (:class:`~esreason.es.region.Region`) ``p`` is a tensor-parallel shard of
the full tensor ``name``; its pieces are its parts of the full tensor's noise blocks and it gets
exactly the full tensor's direction elements, so every operation on a shard equals the same
operation on the full tensor, sliced, bit for bit (elementwise arithmetic). A low-rank matrix's shard
(rows [i0, i1), columns [j0, j1)) is perturbed with A[i0:i1] B[j0:j1]^T (a GEMM of other shapes: its
member weights may round differently from the unsharded ones, as LoRA kernels do) and updated with
slices of the unsharded update's own GEMMs (:func:`esreason.es.lowrank.region_chunks`: the same bits).
"""

from __future__ import annotations

import math
from typing import Iterator, Sequence

import torch

from esreason.es.anchor import anchor_factor, pull_toward
from esreason.es.cache import DirectionCache
from esreason.es.lowrank import cached_factors, region_chunks, region_matrix, row_chunks, stacked_factors
from esreason.es.noise import block_spans
from esreason.es.region import Region
from esreason.es.sharded import Sharding, sharded_update_pieces
from esreason.es.update import block_direction, update_block

_F32 = torch.float32


def _flat(t: torch.Tensor) -> torch.Tensor:
    if not t.is_contiguous():
        raise ValueError(f"ES operations need contiguous tensors (got strides {t.stride()} for shape {tuple(t.shape)})")
    return t.view(-1)


def _on(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    return t if t.device == device else t.to(device, non_blocking=False)


def _local_region(p: torch.Tensor, rank: int | None, region: Region | None) -> Region | None:
    """``region`` when ``p`` is a shard (checked against p), None for a whole tensor."""
    if region is None or region.is_whole:
        return None
    if rank is not None:
        region_matrix(region)  # ValueError unless the shard is part of a 2-D matrix
    if p.numel() != region.local_numel:
        raise ValueError(f"shard of {p.numel()} elements does not match its region of {region.local_numel}")
    return region


def noise_pieces(p: torch.Tensor, name: str, seed: int, scale: float, rank: int | None,
                 cache: DirectionCache | None = None,
                 region: Region | None = None) -> Iterator[tuple[int, int, torch.Tensor | None, tuple]]:
    """(start, stop, eps piece or None, low-rank operands) over the flattened ``p``.

    Dense: eps block [stop - start] fp32 (a shard's part of it with ``region``). Low-rank:
    (A rows [r, r_W], B [n, r_W], alpha) for ``addmm``, with eps None.
    """
    region = _local_region(p, rank, region)
    if region is not None and rank is None:
        for b, size, lo, hi in region.pieces():
            yield lo, hi, region.take(block_direction(seed, name, b, size, p.device, cache), b, lo, hi), ()
        return
    if rank is None:
        for b, start, stop in block_spans(p.numel()):
            yield start, stop, block_direction(seed, name, b, stop - start, p.device, cache), ()
        return
    m, n = (int(p.shape[0]), int(p.shape[1])) if region is None else region_matrix(region)
    packed = cached_factors(seed, name, (m, n), rank, p.device, cache)  # [m+n, r_W] fp32
    a, b = packed[:m], packed[m:]
    if region is not None:  # this shard's rows of A and columns' rows of B
        a, b = a[region.rows[0]:region.rows[1]], b[region.cols[0]:region.cols[1]]
    rows, width = a.shape[0], b.shape[0]
    alpha = scale / math.sqrt(packed.shape[1])
    for r0, r1 in row_chunks(rows, width):
        yield r0 * width, r1 * width, None, (a[r0:r1], b.t(), alpha, width)


def _plus_noise(base: torch.Tensor, eps: torch.Tensor | None, lowrank: tuple, scale: float) -> torch.Tensor:
    """base + scale * E piece, as a new fp32 tensor (base: fp32 flat piece)."""
    if eps is not None:
        return torch.add(base, eps, alpha=scale)
    a, bt, alpha, n = lowrank
    return torch.addmm(base.view(-1, n), a, bt, alpha=alpha).view(-1)  # [rows*n] fp32


@torch.no_grad()
def perturb_tensor(p: torch.Tensor, name: str, seed: int, sigma: float, *, rank: int | None = None,
                   master: torch.Tensor | None = None, cache: DirectionCache | None = None,
                   region: Region | None = None) -> None:
    """p <- round(base_fp32 + sigma * E(seed, name)); base = ``master`` if given, else p itself."""
    flat = _flat(p)
    mflat = None if master is None else _flat(master)
    for start, stop, eps, lowrank in noise_pieces(p, name, seed, sigma, rank, cache, region):
        piece = flat[start:stop]
        if mflat is not None:
            piece.copy_(_plus_noise(_on(mflat[start:stop], p.device), eps, lowrank, sigma))  # one rounding
        elif p.dtype == _F32 and eps is not None:
            piece.add_(eps, alpha=sigma)  # same arithmetic as torch.add, without a temporary
        elif p.dtype == _F32:
            a, bt, alpha, n = lowrank
            piece.view(-1, n).addmm_(a, bt, alpha=alpha)  # in place, no [rows, n] temporary
        else:
            piece.copy_(_plus_noise(piece.to(_F32), eps, lowrank, sigma))


@torch.no_grad()
def subtract_tensor(p: torch.Tensor, name: str, seed: int, sigma: float, *, rank: int | None = None,
                    cache: DirectionCache | None = None, region: Region | None = None) -> None:
    """p <- round(p_fp32 - sigma * E(seed, name)): the paper artifact's inverse (not exact)."""
    flat = _flat(p)
    for start, stop, eps, lowrank in noise_pieces(p, name, seed, -sigma, rank, cache, region):
        piece = flat[start:stop]
        piece.copy_(_plus_noise(piece.to(_F32), eps, lowrank, -sigma))


def _host_to_device(t: torch.Tensor, device: torch.device, pinned: bool) -> torch.Tensor:
    """``t`` (a host piece) on ``device`` in its own dtype: asynchronous on the current stream when
    ``t`` is page-locked (the reads that follow run on the same stream, after it)."""
    return t.to(device, non_blocking=pinned)


@torch.no_grad()
def copy_tensor(p: torch.Tensor, source: torch.Tensor) -> None:
    """p <- source (rounded to p's dtype), piece by piece so a host or fp32 source needs no full temporary.

    Where the two differ in both device and dtype (exact restore from fp32 masters in pinned host
    memory into a bf16 model on the GPU: ``vllm_worker.es_restore``), the piece is first moved in
    its own dtype (``non_blocking`` from page-locked memory, on the current stream), then converted
    on the device that is not the CPU. A single blocking ``copy_`` would convert
    on the CPU instead: ATen's ``copy_kernel_cuda`` (aten/src/ATen/native/cuda/Copy.cu) says "For
    blocking transfers conversions are performed on CPU to avoid allocating extra GPU memory" --
    one thread of an engine's actor converting 28 GiB at 7B for every member. The extra device
    memory is one piece in the source dtype (<= 16 MiB). Bit-exactness is unchanged: a float
    narrowing (fp32 -> bf16 / fp16) rounds to nearest, ties to even, on the CPU and on CUDA alike
    (c10/util/BFloat16.h: ``round_to_nearest_even`` is ``C10_HOST_DEVICE``, CUDA's
    ``__float2bfloat16`` rounds to nearest even; fp16 is the IEEE 754 default rounding on both), so
    the device conversion writes the bits the host conversion wrote (NaN payloads aside: masters
    hold none). Same device or same dtype: one ``copy_``, as before.
    """
    flat, sflat = _flat(p), _flat(source)
    convert_where = None
    if source.device != p.device and source.dtype != p.dtype:
        convert_where = "source" if p.device.type == "cpu" else "target"
    pinned = convert_where == "target" and source.device.type == "cpu" and source.is_pinned()
    for _, start, stop in block_spans(p.numel()):
        piece = sflat[start:stop]
        if convert_where == "target":  # host -> device: move in the source dtype, convert on the device
            piece = _host_to_device(piece, p.device, pinned)
        elif convert_where == "source":  # device -> host: convert on the device, move the narrower bits
            piece = piece.to(p.dtype)
        flat[start:stop].copy_(piece)


def _update_pieces(p: torch.Tensor, name: str, seeds: Sequence[int], weights: Sequence[float], alpha: float,
                   rank: int | None, cache: DirectionCache | None, device: torch.device,
                   region: Region | None = None) -> Iterator[tuple[int, int, torch.Tensor]]:
    """(start, stop, delta piece fp32 [stop - start] on ``device``) of alpha/N sum_i w_i E_i over the flattened ``p``."""
    if region is not None and rank is None:
        for b, size, lo, hi in region.pieces():
            yield lo, hi, update_block(name, b, size, seeds, weights, alpha, device=device, cache=cache,
                                       piece=(region, lo, hi))
        return
    if rank is None:
        for b, start, stop in block_spans(p.numel()):
            yield start, stop, update_block(name, b, stop - start, seeds, weights, alpha, device=device, cache=cache)
        return
    if region is not None:
        yield from _region_update_pieces(name, seeds, weights, alpha, rank, cache, device, region)
        return
    m, n = int(p.shape[0]), int(p.shape[1])
    stacked = stacked_factors(name, (m, n), seeds, weights, rank, cache, device=device)
    for r0, r1 in row_chunks(m, n):
        if stacked is None:
            delta = torch.zeros((r1 - r0) * n, dtype=_F32, device=device)
        else:
            left, right = stacked  # [m, K r], [n, K r]
            delta = torch.mm(left[r0:r1], right.t()).mul_(alpha / len(seeds)).view(-1)  # [rows*n] fp32
        yield r0 * n, r1 * n, delta


def _region_update_pieces(name: str, seeds: Sequence[int], weights: Sequence[float], alpha: float, rank: int,
                          cache: DirectionCache | None, device: torch.device,
                          region: Region) -> Iterator[tuple[int, int, torch.Tensor]]:
    """:func:`_update_pieces` of a low-rank matrix's shard: slices of the unsharded row chunks' GEMMs."""
    m, n = region_matrix(region)
    stacked = stacked_factors(name, (m, n), seeds, weights, rank, cache, device=device)
    c0, c1 = region.cols
    for lo, hi, r0, r1, i0, i1 in region_chunks(region):
        if stacked is None:
            yield lo, hi, torch.zeros(hi - lo, dtype=_F32, device=device)
            continue
        left, right = stacked  # [m, K r], [n, K r]
        full = torch.mm(left[r0:r1], right.t()).mul_(alpha / len(seeds))  # [r1 - r0, n] fp32: the unsharded piece
        yield lo, hi, full[i0 - r0:i1 - r0, c0:c1].reshape(-1)  # [(i1 - i0) * cols] fp32


@torch.no_grad()
def update_tensor(p: torch.Tensor, name: str, seeds: Sequence[int], weights: Sequence[float], alpha: float, *,
                  rank: int | None = None, master: torch.Tensor | None = None, centre: torch.Tensor | None = None,
                  cache: DirectionCache | None = None, sharding: Sharding | None = None,
                  noise_device: torch.device | str | None = None, region: Region | None = None,
                  anchor: torch.Tensor | None = None, anchor_decay: float = 0.0) -> torch.Tensor:
    """centre += alpha / N * sum_i w_i E(seeds_i), in one pass over ``p``'s pieces.

    With ``master`` (fp32) the master receives the delta and p = round(master); without,
    p = round(p_fp32 + delta). ``centre`` (a model-dtype exact-restore copy) is refreshed.
    With ``sharding`` the delta is the sharded, exactly added sum of :mod:`esreason.es.sharded`
    (this process's shards, all-reduced over the engines) instead of the replicated one.
    ``noise_device``: draw and sum the directions there and bring each delta piece to ``p``
    (a host-resident centre that moves exactly as GPU engines' centres do: the fp32 addition
    and the one rounding are exactly rounded on every device). Default: ``p.device``.
    ``region``: ``p`` is a tensor-parallel shard of ``name`` (module docstring).
    ``anchor`` (theta_0 of this tensor, any device; shaped like ``p``) with ``anchor_decay`` lambda > 0:
    each piece is then pulled toward it by c = alpha * lambda after the step (:mod:`esreason.es.anchor`),
    before rounding.
    Returns the float64 scalar sum of squared applied changes (after rounding) on p's
    device: one host sync per update for the caller, not one per tensor.
    """
    device = p.device if noise_device is None else torch.device(noise_device)
    region = _local_region(p, rank, region)
    if sharding is None:
        pieces = _update_pieces(p, name, seeds, weights, alpha, rank, cache, device, region)
    else:
        pieces = sharded_update_pieces(p, name, seeds, weights, alpha, sharding, rank=rank, cache=cache,
                                       device=device, region=region)
    flat = _flat(p)
    mflat = None if master is None else _flat(master)
    cflat = None if centre is None else _flat(centre)
    c = anchor_factor(alpha, anchor_decay) if anchor is not None else 0.0
    aflat = _flat(anchor) if c else None
    sq = torch.zeros((), dtype=torch.float64, device=p.device)
    for start, stop, delta in pieces:
        delta = _on(delta, p.device)  # [piece] fp32 (a device-to-host copy for a host-resident centre)
        piece = flat[start:stop]
        old = piece.to(_F32, copy=True)  # [piece] fp32 copy of theta_old
        if mflat is not None:
            mpiece = mflat[start:stop]
            if mpiece.device == p.device:
                mpiece.add_(delta)
                if aflat is not None:
                    pull_toward(mpiece, aflat[start:stop], c)
                piece.copy_(mpiece)
            else:  # master in host memory: one round trip per piece
                new = mpiece.to(p.device) + delta
                if aflat is not None:
                    pull_toward(new, aflat[start:stop], c)
                mpiece.copy_(new)
                piece.copy_(new)
        else:
            new = old + delta  # [piece] fp32
            if aflat is not None:
                pull_toward(new, aflat[start:stop], c)
            piece.copy_(new)
        sq += torch.sum((piece.to(_F32) - old) ** 2).to(torch.float64)
        if cflat is not None:
            cflat[start:stop].copy_(piece)
    return sq
