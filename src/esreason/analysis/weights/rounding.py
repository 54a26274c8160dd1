"""Rounding attribution of a checkpoint's changes (beyond the paper).

In a bf16 checkpoint a weight near 1 (a LayerNorm gain) can only move in steps of
2^-7 = 0.0078125 above 1 and 2^-8 below it, while a projection weight near 0.02 moves
in steps ~64x smaller. The paper's largest ES updates -- 0.01171875 = 3 * 2^-8 and
0.015625 = 2^-6, mostly on LayerNorm weights -- are exactly such lattice steps. This
module measures how much of a change is the floating-point lattice:

- ``ulp(x)``: the spacing of the checkpoint's format in the binade of |x|
  (2^(floor(log2|x|) - p), p = 7 bf16, 10 fp16, 23 fp32; the subnormal spacing for
  |x| below the smallest normal and for 0).
- integer-ulp share: changed coordinates with |Delta| / ulp(theta_0) an integer.
  A change that stays in or above the base's binade always is one; a change into a
  lower binade may be a half-ulp multiple.
- lattice distance: the number of representable values between theta_0 and theta
  (the difference of the order-preserving integer keys of their bit patterns);
  a *single-ulp flip* is lattice distance 1.
- the share of ||Delta||^2 carried by single-ulp flips, overall and per category.

It applies to tensors stored in the same floating dtype (BF16, F16 or F32) in both
checkpoints; others are listed as skipped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from esreason.analysis.weights.categories import CATEGORIES, categorize
from esreason.analysis.weights.checkpoints import PairedChunk

#: dtype -> (int view, mantissa bits p, minimum normal exponent emin, sign-magnitude mask)
FORMATS: dict[str, tuple[torch.dtype, int, int, int]] = {
    "BF16": (torch.int16, 7, -126, 0x7FFF),
    "F16": (torch.int16, 10, -14, 0x7FFF),
    "F32": (torch.int32, 23, -126, 0x7FFFFFFF),
}

#: Lattice-distance buckets: 1, 2, 3-4, 5-8, ..., 513-1024, > 1024.
DIST_EDGES = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]


def order_key(x: torch.Tensor, dtype: str) -> torch.Tensor:
    """Order-preserving int64 key of each value's bit pattern (+0 and -0 both map to 0).

    Adjacent representable values have keys differing by 1, so |key(a) - key(b)| is
    the number of lattice steps between a and b. x: [n] in the stored dtype.
    """
    view, _, _, mag = FORMATS[dtype]
    bits = x.contiguous().view(view).to(torch.int64)  # [n] signed view of the bit pattern
    return torch.where(bits < 0, -(bits & mag), bits)


def ulp(b: torch.Tensor, dtype: str) -> torch.Tensor:
    """Spacing of the format in the binade of |b| (float64). b: [n] float64."""
    _, p, emin, _ = FORMATS[dtype]
    _, e = torch.frexp(b.abs())            # |b| = m * 2^e, m in [0.5, 1)
    expo = torch.clamp(e.to(torch.int64) - 1, min=emin)  # floor(log2|b|), normal range
    expo = torch.where(b == 0, torch.full_like(expo, emin), expo)
    return torch.ldexp(torch.ones_like(b), expo - p)


@dataclass
class CategoryRounding:
    changed: int = 0
    integer_ulp: int = 0
    single_ulp: int = 0
    sq_diff: float = 0.0
    sq_single_ulp: float = 0.0


@dataclass
class RoundingResult:
    """Totals over applicable tensors; ``skipped`` lists tensors of other/mismatched dtypes."""

    dtypes: list[str]
    by_category: dict[str, CategoryRounding]
    distance_hist: list[int]
    skipped: list[str] = field(default_factory=list)

    def _total(self) -> CategoryRounding:
        t = CategoryRounding()
        for c in self.by_category.values():
            t.changed += c.changed
            t.integer_ulp += c.integer_ulp
            t.single_ulp += c.single_ulp
            t.sq_diff += c.sq_diff
            t.sq_single_ulp += c.sq_single_ulp
        return t

    @staticmethod
    def _shares(c: CategoryRounding) -> dict[str, Any]:
        ch = c.changed
        return {
            "changed": ch,
            "integer_ulp_share": c.integer_ulp / ch if ch else None,
            "single_ulp_share": c.single_ulp / ch if ch else None,
            "single_ulp_sq_drift_share": c.sq_single_ulp / c.sq_diff if c.sq_diff > 0 else None,
            "l2": math.sqrt(c.sq_diff),
        }

    @property
    def changed(self) -> int:
        return self._total().changed

    @property
    def integer_ulp_share(self) -> float | None:
        return self._shares(self._total())["integer_ulp_share"]

    @property
    def single_ulp_share(self) -> float | None:
        return self._shares(self._total())["single_ulp_share"]

    @property
    def single_ulp_sq_drift_share(self) -> float | None:
        return self._shares(self._total())["single_ulp_sq_drift_share"]

    def distance_buckets(self) -> dict[str, int]:
        labels = []
        lo = 1
        for hi in DIST_EDGES:
            labels.append(str(hi) if lo == hi else f"{lo}-{hi}")
            lo = hi + 1
        labels.append(f">{DIST_EDGES[-1]}")
        return dict(zip(labels, self.distance_hist))

    def to_json(self) -> dict[str, Any]:
        return {
            "dtypes": self.dtypes,
            **self._shares(self._total()),
            "lattice_distance": self.distance_buckets(),
            "categories": {c: self._shares(v) for c, v in self.by_category.items()},
            "skipped_tensors": self.skipped,
        }


class RoundingAccumulator:
    """Collects the rounding statistics of :class:`RoundingResult` during a scan."""

    def __init__(self) -> None:
        self.cats: dict[str, CategoryRounding] = {}
        self.dtypes: set[str] = set()
        self.hist = torch.zeros(len(DIST_EDGES) + 1, dtype=torch.int64)
        self._edges = torch.tensor(DIST_EDGES, dtype=torch.int64)
        self.skipped: list[str] = []

    def add(self, chunk: PairedChunk, b: torch.Tensor, d: torch.Tensor, a: torch.Tensor) -> None:
        if chunk.base_dtype != chunk.tuned_dtype or chunk.base_dtype not in FORMATS:
            if chunk.name not in self.skipped:
                self.skipped.append(chunk.name)
            return
        dt = chunk.base_dtype
        self.dtypes.add(dt)
        nz = a > 0
        if not bool(nz.any()):
            self.cats.setdefault(categorize(chunk.name), CategoryRounding())
            return
        bn, an = b[nz], a[nz]                                         # [m] float64
        dist = (order_key(chunk.tuned[nz], dt) - order_key(chunk.base[nz], dt)).abs()  # [m] int64
        u = ulp(bn, dt)                                               # [m] float64, powers of two
        ratio = an / u                                                # exact: division by 2^k
        single = dist == 1
        c = self.cats.setdefault(categorize(chunk.name), CategoryRounding())
        c.changed += int(an.numel())
        c.integer_ulp += int((ratio == torch.round(ratio)).sum())
        c.single_ulp += int(single.sum())
        sq = an * an
        c.sq_diff += float(sq.sum())
        c.sq_single_ulp += float(sq[single].sum())
        self.hist += torch.bincount(torch.bucketize(dist, self._edges, right=False),
                                    minlength=len(DIST_EDGES) + 1)

    def result(self) -> RoundingResult:
        cats = {c: self.cats[c] for c in CATEGORIES if c in self.cats}
        return RoundingResult(sorted(self.dtypes), cats, self.hist.tolist(), list(self.skipped))
