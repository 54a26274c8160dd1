"""Perturbing a model's parameters in place around a centre that is restored exactly.

:class:`CentredParameters` owns the ES view of a ``torch.nn.Module``: the list of
unique named parameters (tied weights once), the saved centre, optional fp32
master weights, and the three operations the paper's procedure needs:

- ``perturb(seed, sigma)``: theta <- centre + sigma * eps(seed)   (step 3)
- ``restore()``: theta <- centre                                     (step 3)
- ``apply_update(seeds, weights, alpha)``: centre += alpha/N sum w_i eps_i  (step 5), then, with
  ``anchor_decay`` lambda > 0, centre -= alpha * lambda * (centre - theta_0) (:mod:`esreason.es.anchor`)

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
kept (on the weights' device, for the current update only, up to that budget) so that
``apply_update`` does not draw them a second time (:mod:`esreason.es.cache`).

Device: every operation runs on the device of the weights (:mod:`esreason.es.apply`):
directions are drawn there, the update is accumulated there in fp32, one noise block
at a time; nothing parameter-sized is created on the host, and the extra memory of an
operation is a few 16 MiB blocks. The centre copy and the masters live on the weights'
device too.

Low-rank directions (``perturbation="lowrank"``, :mod:`esreason.es.lowrank`): every
2-D tensor W is perturbed by E = A B^T / sqrt(r_W) instead of a dense eps, as one
fused fp32 ``addmm`` per row chunk (theta_i = round(centre_fp32 + sigma * A B^T / sqrt(r_W)));
the cache then holds the packed factors [m + n, r_W]; the update is one GEMM per row chunk.
Exact restore, masters and ``subtract`` work unchanged. ``perturbation="lora"`` moves the linear
projections' weights only; every other tensor is skipped by perturb, restore and update. With
``perturbation="full"`` (the default) every code path and result is the one described above, bit for bit.
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Iterable, Sequence

import torch

from esreason.es.anchor import anchor_factor, snapshot_anchor
from esreason.es.apply import copy_tensor, perturb_tensor, subtract_tensor, update_tensor
from esreason.es.cache import DirectionCache
from esreason.es.lowrank import Perturbation
from esreason.es.sharded import Sharding


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
    """ES perturbation state of a module's parameters (see module docstring).

    anchor_decay: lambda of anchored ES (:mod:`esreason.es.anchor`); > 0 keeps theta_0, the weights at
    construction; the tensors of :meth:`anchor_state` are filled in place to replace it (the run's start
    weights on a resume: :meth:`esreason.backends.hf.HFPolicy.load_anchor`).
    """

    def __init__(self, params: Iterable[tuple[str, torch.nn.Parameter]], *,
                 restore: str = "exact", master: bool = False, cache_bytes: int = 0,
                 perturbation: str = "full", rank: int = 1, noise_device: torch.device | str | None = None,
                 anchor_decay: float = 0.0) -> None:
        if restore not in ("exact", "subtract"):
            raise ValueError(f"unknown restore mode {restore!r}")
        if anchor_decay < 0:
            raise ValueError(f"anchor_decay must be >= 0 (got {anchor_decay})")
        self.params = list(params)
        # Where updates draw their directions; None = each tensor's own device. Set for a
        # host-resident reference centre that must move as GPU engines do (update only).
        self.noise_device = None if noise_device is None else torch.device(noise_device)
        self.perturbation = Perturbation(perturbation, rank)  # UserError naming es.perturbation / es.rank
        # r_W per tensor name for low-rank-perturbed matrices; None = dense direction
        self._ranks: dict[str, int | None] = {n: self.perturbation.tensor_rank(p.shape) for n, p in self.params}
        # tensors without a direction (``perturbation="lora"``: all but the linear projections' weights)
        self._still = {n for n, p in self.params if not self.perturbation.moves(n, p.shape)}
        self.restore_mode = restore
        self.master = master
        self.timings: dict[str, float] = defaultdict(float)
        self._active: tuple[int, float] | None = None  # (seed, sigma) currently applied
        self.cache = DirectionCache(int(cache_bytes))  # this update's directions
        self._snapshot()
        self.anchor_decay = float(anchor_decay)
        # theta_0 in the model dtype (host memory for GPU weights); None without anchored ES
        self._anchor = snapshot_anchor(self.params) if self.anchor_decay > 0 else None

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
            # one copy of the weights (docs/internals.md, "Memory of an ES step").
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

    def anchor_state(self) -> dict[str, torch.Tensor] | None:
        """theta_0 in the model dtype (for the run's anchor file), or None without anchored ES."""
        return self._anchor

    @property
    def num_parameters(self) -> int:
        return sum(p.numel() for _, p in self.params)

    # ------------------------------------------------------------------ ES operations

    @torch.no_grad()
    def perturb(self, seed: int, sigma: float) -> None:
        """theta <- centre + sigma * eps(seed), rounded once to the model dtype."""
        if self._active is not None:
            raise RuntimeError("perturb() called twice without restore()")
        if self.noise_device is not None and any(p.device.type != self.noise_device.type for _, p in self.params):
            raise RuntimeError(f"this centre lives off its noise device {self.noise_device}: it is updated only; "
                               "members are evaluated on the engines")
        t0 = time.perf_counter()
        for name, p in self.params:
            if name in self._still:
                continue
            master = None if self._master is None else self._master[name]
            perturb_tensor(p, name, int(seed), sigma, rank=self._ranks[name], master=master, cache=self.cache)
        self._active = (int(seed), sigma)
        self.timings["perturb"] += time.perf_counter() - t0

    @torch.no_grad()
    def restore(self) -> None:
        """theta <- centre: bit-exact copy (``exact``) or subtract the same noise (``subtract``)."""
        if self._active is None:
            raise RuntimeError("restore() called without perturb()")
        t0 = time.perf_counter()
        if self.restore_mode == "exact":
            source = self._centre if self._centre is not None else self._master  # masters: round(master)
            for name, p in self.params:
                if name not in self._still:  # (a tensor without a direction was never moved)
                    copy_tensor(p, source[name])
        else:
            seed, sigma = self._active
            for name, p in self.params:
                if name in self._still:
                    continue
                subtract_tensor(p, name, seed, sigma, rank=self._ranks[name], cache=self.cache)
        self._active = None
        self.timings["restore"] += time.perf_counter() - t0

    @torch.no_grad()
    def apply_update(self, seeds: Sequence[int], weights: Sequence[float], alpha: float,
                     sharding: Sharding | None = None) -> float:
        """centre <- centre + alpha/N * sum_i w_i eps(seeds_i) (then pulled toward theta_0 when
        ``anchor_decay`` > 0); returns ||theta_new - theta_old||_2.

        ``sharding``: compute the sum sharded and added exactly (:mod:`esreason.es.sharded`);
        None is the replicated update.

        The delta is accumulated in fp32 on the weights' device; without master weights the
        new centre is round(theta_old_fp32 + delta) in the model dtype. The returned norm is
        that of the change actually applied (after rounding), over unique tensors (NaN for
        weights on the ``meta`` device, which hold no values).
        """
        if self._active is not None:
            raise RuntimeError("apply_update() while a member is applied; restore() first")
        if len(seeds) != len(weights):
            raise ValueError(f"{len(seeds)} seeds but {len(weights)} weights")
        anchor_factor(alpha, self.anchor_decay)  # ValueError before anything moves when alpha * lambda >= 1
        t0 = time.perf_counter()
        sq: torch.Tensor | None = None  # float64 scalar per device, summed in tensor order
        for name, p in self.params:
            if name in self._still:
                continue
            part = update_tensor(p, name, seeds, weights, alpha, rank=self._ranks[name],
                                 master=None if self._master is None else self._master[name],
                                 centre=None if self._centre is None else self._centre[name], cache=self.cache,
                                 sharding=sharding, noise_device=self.noise_device,
                                 anchor=None if self._anchor is None else self._anchor[name],
                                 anchor_decay=self.anchor_decay)
            sq = part if sq is None else sq + part.to(sq.device)
        self.cache.clear()
        self.timings["update"] += time.perf_counter() - t0
        if sq is None or sq.device.type == "meta":
            return float("nan") if sq is not None else 0.0
        return float(sq) ** 0.5

    def pop_timings(self) -> dict[str, float]:
        out = dict(self.timings)
        self.timings.clear()
        return out
