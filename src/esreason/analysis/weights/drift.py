"""Whole-model parameter drift and update sparsity (paper §RQ2, Table "parameter drift").

Definitions, with Delta_i = theta_i - theta_0,i over every analysed coordinate:

- relative L2 distance (paper Eq. rq2-parameter-drift):
  D_rel = ||theta - theta_0||_2 / ||theta_0||_2
- update sparsity at threshold tau (paper Eq. rq2-update-sparsity):
  s_tau = |{i : 0 < |Delta_i| <= tau}| / |{i : |Delta_i| > 0}|
  Coordinates with zero change are excluded from the denominator, as the paper
  states; with no changed coordinate at all s_tau is undefined and reported as None.
- relative L2 distance of the magnitude-thresholded model (the parenthesised columns
  of the paper's drift table): the thresholded model keeps Delta_i only where
  |Delta_i| > tau, so D_rel,tau = sqrt(sum_{|Delta_i| > tau} Delta_i^2) / ||theta_0||_2.

Everything is accumulated per tensor in float64 while streaming
(:mod:`esreason.analysis.weights.scan`), so per-module and per-category breakdowns come from
the same pass. Tied weights count once (rule in :mod:`esreason.analysis.weights.checkpoints`).
A log-spaced histogram of |Delta| (20 bins per decade over [1e-16, 1e2), plus
under/overflow) is kept for the plot.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from esreason.analysis.weights.categories import CATEGORIES, GROUPS, categorize, layer_index
from esreason.analysis.weights.checkpoints import PairedChunk
from esreason.errors import UserError

#: The paper's thresholds (Easy setting; the Hard-setting sweep adds 2.5e-3 and 3e-3).
PAPER_TAUS = ("2.5e-4", "5e-4", "1e-3", "1.5e-3", "2e-3")
PAPER_TAUS_HARD = PAPER_TAUS + ("2.5e-3", "3e-3")

HIST_LO, HIST_HI, HIST_PER_DECADE = -16, 2, 20


def parse_taus(text: str | Sequence[str]) -> list[tuple[str, float]]:
    """'2.5e-4,1e-3' -> [('2.5e-4', 0.00025), ('1e-3', 0.001)]; labels kept as written.

    Raises UserError for a non-number, tau <= 0, a non-finite tau or a duplicate.
    """
    items = [t.strip() for t in text.split(",")] if isinstance(text, str) else [str(t).strip() for t in text]
    items = [t for t in items if t]
    if not items:
        raise UserError("--taus: give at least one threshold, e.g. --taus 1e-3,2e-3")
    out: list[tuple[str, float]] = []
    seen: set[float] = set()
    for t in items:
        try:
            v = float(t)
        except ValueError:
            raise UserError(f"tau {t!r} is not a number") from None
        if not math.isfinite(v) or v <= 0:
            raise UserError(f"tau must be a finite number > 0 (got {t})")
        if v in seen:
            raise UserError(f"tau {t} given twice")
        seen.add(v)
        out.append((t, v))
    return out


def hist_edges() -> torch.Tensor:
    """Histogram bin edges of |Delta| (float64, log-spaced, 20 per decade)."""
    n = (HIST_HI - HIST_LO) * HIST_PER_DECADE
    return torch.logspace(HIST_LO, HIST_HI, n + 1, base=10.0, dtype=torch.float64)


@dataclass
class TensorDrift:
    """Per-tensor sums (float64) and counts; taus in the order of DriftAccumulator.taus."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    numel: int = 0
    changed: int = 0
    sq_diff: float = 0.0
    sq_base: float = 0.0
    max_abs: float = 0.0
    at_max: int = 0
    le_tau: list[int] = field(default_factory=list)       # count of 0 < |Delta| <= tau
    sq_above_tau: list[float] = field(default_factory=list)  # sum of Delta^2 over |Delta| > tau

    @property
    def category(self) -> str:
        return categorize(self.name)


class DriftAccumulator:
    """Accumulates :class:`TensorDrift` records and the |Delta| histogram during a scan."""

    def __init__(self, taus: Sequence[tuple[str, float]]) -> None:
        self.taus = list(taus)
        self.tensors: dict[str, TensorDrift] = {}
        self.edges = hist_edges()
        self.hist = torch.zeros(len(self.edges) + 1, dtype=torch.int64)  # [under, bins..., over]
        if any(b <= a for (_, a), (_, b) in zip(self.taus, self.taus[1:])):
            self.taus.sort(key=lambda t: t[1])
        self._edges_tau = torch.tensor([0.0] + [v for _, v in self.taus], dtype=torch.float64)

    def add(self, chunk: PairedChunk, b: torch.Tensor, d: torch.Tensor, a: torch.Tensor) -> None:
        rec = self.tensors.get(chunk.name)
        if rec is None:
            rec = TensorDrift(chunk.name, chunk.shape, chunk.tuned_dtype,
                              le_tau=[0] * len(self.taus), sq_above_tau=[0.0] * len(self.taus))
            self.tensors[chunk.name] = rec
        n_taus = len(self.taus)
        sq = d * d  # [n]
        # One bucketize for every tau: 0 -> |d| == 0; j+1 -> tau_j < |d| <= tau_{j+1} (tau_0 = 0);
        # n_taus + 1 -> |d| > the largest tau. Counts and Delta^2 per interval, cumulated below.
        idx = torch.bucketize(a, self._edges_tau, right=False)                       # [n] int64
        counts = torch.bincount(idx, minlength=n_taus + 2)                           # [n_taus + 2]
        sq_per = torch.bincount(idx, weights=sq, minlength=n_taus + 2)               # [n_taus + 2] float64
        rec.numel += a.numel()
        rec.changed += int(a.numel() - counts[0])
        rec.sq_diff += float(sq_per.sum())
        rec.sq_base += float(torch.dot(b, b))
        le = torch.cumsum(counts[1:-1], 0).tolist()                                   # 0 < |d| <= tau_j
        above = torch.flip(torch.cumsum(torch.flip(sq_per[2:], [0]), 0), [0]).tolist()  # sum over |d| > tau_j
        for j in range(n_taus):
            rec.le_tau[j] += int(le[j])
            rec.sq_above_tau[j] += float(above[j])
        if a.numel():
            m = float(a.max())
            if m > rec.max_abs:
                rec.max_abs, rec.at_max = m, int((a == m).sum())
            elif m == rec.max_abs and m > 0:
                rec.at_max += int((a == m).sum())
        an = a[idx > 0]
        if an.numel():
            # log-spaced bin by arithmetic (a plot histogram: a value on an edge may land in either bin)
            pos = torch.floor((torch.log10(an) - HIST_LO) * HIST_PER_DECADE).to(torch.int64) + 1
            pos = pos.clamp_(0, len(self.edges))                   # 0: below 1e-16, len(edges): >= 1e2
            self.hist += torch.bincount(pos, minlength=len(self.edges) + 1)

    def result(self) -> "DriftResult":
        return DriftResult(self.taus, list(self.tensors.values()), self.edges.tolist(), self.hist.tolist())


def _safe_div(a: float, b: float) -> float | None:
    return a / b if b > 0 else None


@dataclass
class DriftResult:
    """Drift statistics of one (base, tuned) pair; all derived numbers are properties."""

    taus: list[tuple[str, float]]
    tensors: list[TensorDrift]
    hist_edges: list[float]
    hist_counts: list[int]   # [below first edge, one per bin, at/above last edge]

    # ------------------------------------------------------------------ totals
    @property
    def numel(self) -> int:
        return sum(t.numel for t in self.tensors)

    @property
    def changed(self) -> int:
        return sum(t.changed for t in self.tensors)

    @property
    def base_l2(self) -> float:
        return math.sqrt(sum(t.sq_base for t in self.tensors))

    @property
    def l2(self) -> float:
        return math.sqrt(sum(t.sq_diff for t in self.tensors))

    @property
    def relative_l2(self) -> float | None:
        return _safe_div(self.l2, self.base_l2)

    @property
    def max_abs(self) -> float:
        return max((t.max_abs for t in self.tensors), default=0.0)

    @property
    def at_max(self) -> int:
        m = self.max_abs
        return sum(t.at_max for t in self.tensors if t.max_abs == m) if m > 0 else 0

    @property
    def s_tau(self) -> dict[str, float | None]:
        """{tau label: s_tau} (None when no coordinate changed)."""
        ch = self.changed
        return {lab: _safe_div(sum(t.le_tau[j] for t in self.tensors), ch) for j, (lab, _) in enumerate(self.taus)}

    @property
    def thresholded_relative_l2(self) -> dict[str, float | None]:
        """{tau label: D_rel of the magnitude-thresholded model}."""
        b = self.base_l2
        return {lab: _safe_div(math.sqrt(sum(t.sq_above_tau[j] for t in self.tensors)), b)
                for j, (lab, _) in enumerate(self.taus)}

    # ------------------------------------------------------------------ breakdowns
    def by_category(self) -> dict[str, dict[str, Any]]:
        """Per category: tensors, coordinates, changed, relative L2 within the category,
        share of the whole-model ||Delta||^2, max |Delta|."""
        total_sq = sum(t.sq_diff for t in self.tensors)
        out: dict[str, dict[str, Any]] = {}
        for cat in CATEGORIES:
            ts = [t for t in self.tensors if t.category == cat]
            if ts:
                out[cat] = _summary(ts, total_sq)
        for group, cats in GROUPS.items():
            ts = [t for t in self.tensors if t.category in cats]
            if ts:
                out[group] = _summary(ts, total_sq)
        return out

    def by_layer(self) -> dict[str, dict[str, Any]]:
        """Per decoder layer (and 'none' for tensors outside the layer stack)."""
        total_sq = sum(t.sq_diff for t in self.tensors)
        groups: dict[str, list[TensorDrift]] = {}
        for t in self.tensors:
            li = layer_index(t.name)
            groups.setdefault("none" if li is None else str(li), []).append(t)
        keys = sorted((k for k in groups if k != "none"), key=int) + (["none"] if "none" in groups else [])
        return {k: _summary(groups[k], total_sq) for k in keys}

    def to_json(self, include_tensors: bool = True) -> dict[str, Any]:
        out: dict[str, Any] = {
            "relative_l2": self.relative_l2,
            "l2": self.l2,
            "base_l2": self.base_l2,
            "num_coordinates": self.numel,
            "num_changed": self.changed,
            "changed_share": _safe_div(self.changed, self.numel),
            "taus": [lab for lab, _ in self.taus],
            "s_tau": self.s_tau,
            "thresholded_relative_l2": self.thresholded_relative_l2,
            "max_abs_update": self.max_abs,
            "num_at_max": self.at_max,
            "categories": self.by_category(),
            "layers": self.by_layer(),
            "histogram": {"edges": self.hist_edges, "counts": self.hist_counts,
                          "note": "counts[0] < edges[0] <= counts[1] < edges[1] ... counts[-1] >= edges[-1]; "
                                  "zero changes excluded"},
        }
        if include_tensors:
            out["tensors"] = [{
                "name": t.name, "category": t.category, "shape": list(t.shape), "dtype": t.dtype,
                "numel": t.numel, "changed": t.changed, "l2": math.sqrt(t.sq_diff), "base_l2": math.sqrt(t.sq_base),
                "relative_l2": _safe_div(math.sqrt(t.sq_diff), math.sqrt(t.sq_base)),
                "max_abs": t.max_abs, "num_at_max": t.at_max,
            } for t in self.tensors]
        return out


def _summary(ts: Sequence[TensorDrift], total_sq: float) -> dict[str, Any]:
    sq = sum(t.sq_diff for t in ts)
    sqb = sum(t.sq_base for t in ts)
    numel = sum(t.numel for t in ts)
    changed = sum(t.changed for t in ts)
    return {
        "tensors": len(ts), "numel": numel, "changed": changed,
        "changed_share": _safe_div(changed, numel),
        "l2": math.sqrt(sq), "relative_l2": _safe_div(math.sqrt(sq), math.sqrt(sqb)),
        "share_of_sq_drift": _safe_div(sq, total_sq),
        "max_abs": max(t.max_abs for t in ts),
    }
