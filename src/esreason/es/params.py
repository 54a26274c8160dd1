"""Perturbing a model's parameters in place around a centre that is restored exactly.

:class:`CentredParameters` owns the ES view of a ``torch.nn.Module``: the list of
unique named parameters (tied weights once), the saved centre, optional fp32
master weights, and the three operations the paper's procedure needs:

- ``perturb(seed, sigma)``: theta <- centre + sigma * eps(seed)   (step 3)
- ``restore()``: theta <- centre                                     (step 3)
- ``apply_update(seeds, weights, alpha)``: centre += alpha/N sum w_i eps_i  (step 5)

Restore modes (DESIGN §3):

- ``exact`` (default): copy the saved centre back; bit-exact by construction. With
  master weights the fp32 master is the saved centre (copying it into the model dtype
  rounds to exactly the centre's bits), so no model-dtype copy is kept.
- ``subtract``: theta <- theta - sigma * eps(seed), as the paper's artifact does.
  ``p + d - d != p`` in floating point, so this leaves ulp-level drift (in bf16
  about 10% of elements after one cycle). It exists for faithful reproduction
  and for measuring that drift; no saved centre is kept in this mode.

Master weights: with ``master=True`` an fp32 copy of the centre receives the
updates and the model-dtype centre is re-derived from it, so updates smaller
than half an ulp of a bf16 weight accumulate instead of rounding away.
Perturbed weights are always computed in fp32 and rounded once to the model
dtype: theta_i = round(centre_fp32 + sigma * eps).

Direction cache: with ``cache_bytes > 0`` the directions drawn while perturbing are
kept (in memory, for the current update only, up to that budget) so that
``apply_update`` does not draw them a second time. Directions are still defined by
their seeds; the cache holds exactly the tensors ``direction()`` returns, is never
written anywhere, and is emptied by every update. It removes half of the noise cost
of an update (benchmarks/es_step.py on the embedded default, N=16, B=32: the
perturb + restore + update share of a step went from 4.0% to 2.4%).

Low-rank directions (``perturbation="lowrank"``, :mod:`esreason.es.lowrank`): every
2-D tensor W is perturbed by E = A B^T / sqrt(r_W) instead of a dense eps, as one
fused fp32 ``addmm`` (theta_i = round(centre_fp32 + sigma * A B^T / sqrt(r_W))); the
cache then holds the packed factors [m + n, r_W]; the update is one GEMM per matrix.
Exact restore, masters and ``subtract`` work unchanged. With ``perturbation="full"``
(the default) every code path and result is the one described above, bit for bit.
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Iterable, Sequence

import torch

from esreason.es.lowrank import Perturbation, add_scaled, add_scaled_, lowrank_factors, lowrank_update_delta
from esreason.es.noise import direction
from esreason.es.update import update_delta


def unique_named_parameters(module: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
    """Named parameters with shared tensors listed once under their first name (tied weights)."""
    seen: set[int] = set()
    out = []
    for name, p in module.named_parameters(remove_duplicate=False):
        if id(p) in seen:
            continue
        seen.add(id(p))
        out.append((name, p))
    return out


class CentredParameters:
    """ES perturbation state of a module's parameters (see module docstring)."""

    def __init__(self, params: Iterable[tuple[str, torch.nn.Parameter]], *,
                 restore: str = "exact", master: bool = False, cache_bytes: int = 0,
                 perturbation: str = "full", rank: int = 1) -> None:
        if restore not in ("exact", "subtract"):
            raise ValueError(f"unknown restore mode {restore!r}")
        self.params = list(params)
        self.perturbation = Perturbation(perturbation, rank)  # UserError naming es.perturbation / es.rank
        # r_W per tensor name for low-rank-perturbed matrices; None = dense direction
        self._ranks: dict[str, int | None] = {n: self.perturbation.tensor_rank(p.shape) for n, p in self.params}
        self.restore_mode = restore
        self.master = master
        self.timings: dict[str, float] = defaultdict(float)
        self._active: tuple[int, float] | None = None  # (seed, sigma) currently applied
        self.cache_bytes = int(cache_bytes)
        self._cache: dict[tuple[int, str], torch.Tensor] = {}  # this update's directions
        self._cache_used = 0
        self._snapshot()

    # ------------------------------------------------------------------ state

    def _snapshot(self) -> None:
        """(Re)take the centre from the current parameter values."""
        with torch.no_grad():
            # fp32 master copy on the parameter's device
            self._master = ({n: p.detach().to(torch.float32, copy=True) for n, p in self.params}
                            if self.master else None)
            # centre in model dtype, on the parameter's device (exact restore source). With
            # masters it is not kept: the model-dtype centre is round(master) by construction
            # (at the snapshot exactly, after every update because apply_update writes
            # p = round(master)), so restoring from the master gives the same bits and saves
            # one copy of the weights (docs/scale.md, "Memory").
            self._centre = ({n: p.detach().clone() for n, p in self.params}
                            if self.restore_mode == "exact" and self._master is None else None)

    def reset_centre(self) -> None:
        """Adopt the module's current weights as the centre (after loading a checkpoint)."""
        if self._active is not None:
            raise RuntimeError("cannot reset the centre while a member is applied")
        self._snapshot()

    def master_state(self) -> dict[str, torch.Tensor] | None:
        """fp32 master weights (for checkpoints), or None when masters are off."""
        return None if self._master is None else {n: t.detach().cpu() for n, t in self._master.items()}

    def load_master_state(self, state: dict[str, torch.Tensor]) -> None:
        if self._master is None:
            raise RuntimeError("master weights are disabled")
        for n, _ in self.params:
            self._master[n].copy_(state[n])

    @property
    def num_parameters(self) -> int:
        return sum(p.numel() for _, p in self.params)

    # ------------------------------------------------------------------ ES operations

    @torch.no_grad()
    def perturb(self, seed: int, sigma: float) -> None:
        """theta <- centre + sigma * eps(seed), rounded once to the model dtype."""
        if self._active is not None:
            raise RuntimeError("perturb() called twice without restore()")
        t0 = time.perf_counter()
        for name, p in self.params:
            if self._ranks[name] is not None:
                self._perturb_lowrank(seed, sigma, name, p)
                continue
            eps = self._direction(seed, name, p)  # [*p.shape] fp32
            if self._master is not None:
                p.copy_(torch.add(self._master[name], eps, alpha=sigma))  # fp32 sum, one rounding
            elif p.dtype == torch.float32:
                p.add_(eps, alpha=sigma)  # same arithmetic as torch.add, without a temporary
            else:
                p.copy_(torch.add(p.detach().to(torch.float32), eps, alpha=sigma))
        self._active = (seed, sigma)
        self.timings["perturb"] += time.perf_counter() - t0

    def _perturb_lowrank(self, seed: int, sigma: float, name: str, p: torch.Tensor) -> None:
        """p <- round(centre_fp32 + sigma * A B^T / sqrt(r_W)) for one matrix."""
        packed = self._factors(seed, name, p)  # [m+n, r_W] fp32
        if self._master is not None:
            p.copy_(add_scaled(self._master[name], packed, sigma))  # fp32 sum, one rounding
        elif p.dtype == torch.float32:
            add_scaled_(p, packed, sigma)  # in place, no [m, n] temporary
        else:
            p.copy_(add_scaled(p.detach().to(torch.float32), packed, sigma))

    def _factors(self, seed: int, name: str, p: torch.Tensor) -> torch.Tensor:
        """Packed factors [A; B] of (seed, name) on p's device, from this update's cache when present."""
        key = (int(seed), name)
        packed = self._cache.get(key)
        if packed is None:
            packed = lowrank_factors(seed, name, p.shape, self.perturbation.rank, device=p.device)
            size = packed.numel() * packed.element_size()
            if self._cache_used + size <= self.cache_bytes:
                self._cache[key] = packed
                self._cache_used += size
        return packed

    def _direction(self, seed: int, name: str, p: torch.Tensor) -> torch.Tensor:
        """eps(seed, name) on p's device, from this update's cache when present."""
        key = (int(seed), name)
        eps = self._cache.get(key)
        if eps is None:
            eps = direction(seed, name, p.shape, device=p.device)
            size = eps.numel() * eps.element_size()
            if self._cache_used + size <= self.cache_bytes:
                self._cache[key] = eps
                self._cache_used += size
        return eps

    @torch.no_grad()
    def restore(self) -> None:
        """theta <- centre: bit-exact copy (``exact``) or subtract the same noise (``subtract``)."""
        if self._active is None:
            raise RuntimeError("restore() called without perturb()")
        t0 = time.perf_counter()
        if self.restore_mode == "exact":
            source = self._centre if self._centre is not None else self._master  # masters: round(master)
            for name, p in self.params:
                p.copy_(source[name])
        else:
            seed, sigma = self._active
            for name, p in self.params:
                if self._ranks[name] is not None:  # the paper artifact's inverse, low-rank noise
                    p.copy_(add_scaled(p.detach().to(torch.float32), self._factors(seed, name, p), -sigma))
                    continue
                eps = self._direction(seed, name, p)
                p.copy_(torch.add(p.to(torch.float32), eps, alpha=-sigma))
        self._active = None
        self.timings["restore"] += time.perf_counter() - t0

    @torch.no_grad()
    def apply_update(self, seeds: Sequence[int], weights: Sequence[float], alpha: float) -> float:
        """centre <- centre + alpha/N * sum_i w_i eps(seeds_i); returns ||theta_new - theta_old||_2.

        The delta is accumulated in fp32; without master weights the new centre is
        round(theta_old_fp32 + delta) in the model dtype. The returned norm is that of
        the change actually applied (after rounding), over unique tensors.
        """
        if self._active is not None:
            raise RuntimeError("apply_update() while a member is applied; restore() first")
        t0 = time.perf_counter()
        sq = 0.0
        for name, p in self.params:
            if self._ranks[name] is not None:  # one GEMM of the stacked factors, on p's device
                delta = lowrank_update_delta(name, p.shape, seeds, weights, alpha, self.perturbation.rank,
                                             self._cache, device=p.device)  # [m, n] fp32
            else:
                delta = update_delta(name, p.shape, seeds, weights, alpha, self._cache).to(p.device)  # fp32
            old = p.detach().to(torch.float32, copy=True)  # fp32 copy of theta_old
            if self._master is not None:
                self._master[name].add_(delta)
                p.copy_(self._master[name])
            else:
                p.copy_(old + delta)
            sq += float(torch.sum((p.detach().to(torch.float32) - old) ** 2))
            if self._centre is not None:
                self._centre[name].copy_(p.detach())
        self._cache.clear()
        self._cache_used = 0
        self.timings["update"] += time.perf_counter() - t0
        return sq ** 0.5

    def pop_timings(self) -> dict[str, float]:
        out = dict(self.timings)
        self.timings.clear()
        return out
