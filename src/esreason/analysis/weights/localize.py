"""Where the largest updates are (paper §RQ2, "We further compare the locations and scales").

The paper reports, per model: the maximum update magnitude and how many coordinates
reach it, by category ("117 of its 144 maximum coordinates are LayerNorm weights and
24 are attention-projection biases"); the categories of the 100 largest updates
("Normalization parameters further account for 72 ... of the 100 largest"); and the
ratio of maxima between ES and GRPO ("48x smaller").

**Tie rule for the top-k.** Low-precision checkpoints produce many exactly equal
|Delta| values (bf16 differences are multiples of a power of two), so "the k largest"
needs a rule. Coordinates are ordered by |Delta| descending, then by tensor name
ascending (plain string order), then by flat row-major index ascending; the first k
are the top-k. Only changed coordinates (|Delta| > 0) qualify. Because the rule can
split a group of equal values, the result also reports the k-th value, how many
coordinates in the whole model have |Delta| >= that value and how many equal it, so a
reader can see when the top-k boundary is a tie.

Streaming: each chunk contributes its own first k by the rule (``torch.sort`` with
``stable=True`` keeps index order among equal values); the running top-k is merged and
cut to k. Exact counts of every value >= the running k-th value are kept per category
(``torch.unique``), pruned as the running k-th value rises -- the k-th value never
falls, so nothing pruned can matter at the end.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from esreason.analysis.weights.categories import CATEGORIES, GROUPS, categorize
from esreason.analysis.weights.checkpoints import PairedChunk


@dataclass(frozen=True)
class TopEntry:
    """One of the largest updates."""

    abs_delta: float
    name: str
    flat_index: int
    index: tuple[int, ...]
    delta: float
    base: float
    tuned: float

    @property
    def category(self) -> str:
        return categorize(self.name)

    def sort_key(self) -> tuple[float, str, int]:
        return (-self.abs_delta, self.name, self.flat_index)


def unravel(flat: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    """Row-major multi-index of a flat index."""
    out = []
    for s in reversed(shape):
        out.append(flat % s if s else 0)
        flat //= s if s else 1
    return tuple(reversed(out))


class TopKAccumulator:
    """Streaming top-k of |Delta| with the module's tie rule, plus exact counts at the top."""

    def __init__(self, k: int = 100) -> None:
        if k < 1:
            raise ValueError("k must be >= 1")
        self.k = k
        self.top: list[TopEntry] = []
        # {(|Delta| value, category): number of coordinates}, for values >= running k-th value
        self.counts: dict[tuple[float, str], int] = {}

    @property
    def kth(self) -> float:
        """Running k-th largest |Delta| (0 until k changed coordinates were seen)."""
        return self.top[-1].abs_delta if len(self.top) >= self.k else 0.0

    def add(self, chunk: PairedChunk, b: torch.Tensor, d: torch.Tensor, a: torch.Tensor) -> None:
        n = a.numel()
        if n == 0:
            return
        kk = min(self.k, n)
        chunk_kth = float(torch.topk(a, kk, sorted=False).values.min())
        thr = max(chunk_kth, self.kth)
        mask = (a >= thr) & (a > 0)
        idx = torch.nonzero(mask).reshape(-1)  # ascending flat indices
        if idx.numel() == 0:
            return
        vals = a[idx]
        order = torch.sort(vals, descending=True, stable=True).indices[: self.k]
        cat = categorize(chunk.name)
        for j in order.tolist():
            i = int(idx[j])
            flat = chunk.offset + i
            self.top.append(TopEntry(float(vals[j]), chunk.name, flat, unravel(flat, chunk.shape),
                                     float(d[i]), float(b[i]), float(b[i] + d[i])))
        self.top.sort(key=TopEntry.sort_key)
        del self.top[self.k:]
        uv, uc = torch.unique(vals, return_counts=True)
        for v, c in zip(uv.tolist(), uc.tolist()):
            self.counts[(v, cat)] = self.counts.get((v, cat), 0) + int(c)
        floor = self.kth
        if floor > 0:
            self.counts = {key: c for key, c in self.counts.items() if key[0] >= floor}

    def result(self) -> "Localization":
        return Localization(self.k, list(self.top), dict(self.counts))


@dataclass
class Localization:
    """Top-k updates and the counts at the maximum and at the top-k boundary."""

    k: int
    top: list[TopEntry]
    counts: dict[tuple[float, str], int] = field(default_factory=dict)

    @property
    def max_abs(self) -> float:
        return self.top[0].abs_delta if self.top else 0.0

    def _count_where(self, pred) -> dict[str, int]:
        out: dict[str, int] = {}
        for (v, cat), c in self.counts.items():
            if pred(v):
                out[cat] = out.get(cat, 0) + c
        return _ordered(out)

    @property
    def at_max_by_category(self) -> dict[str, int]:
        m = self.max_abs
        return self._count_where(lambda v: v == m) if m > 0 else {}

    @property
    def at_max(self) -> int:
        return sum(self.at_max_by_category.values())

    @property
    def kth_value(self) -> float:
        return self.top[-1].abs_delta if self.top else 0.0

    @property
    def top_by_category(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for e in self.top:
            out[e.category] = out.get(e.category, 0) + 1
        return _ordered(out)

    def boundary(self) -> dict[str, Any]:
        """How the k-th value is tied: coordinates >= it and == it in the whole model."""
        kv = self.kth_value
        if kv <= 0:
            return {"kth_value": kv, "num_ge_kth": 0, "num_eq_kth": 0, "num_eq_kth_in_top": 0}
        ge = sum(self._count_where(lambda v: v >= kv).values())
        eq = sum(self._count_where(lambda v: v == kv).values())
        return {"kth_value": kv, "num_ge_kth": ge, "num_eq_kth": eq,
                "num_eq_kth_in_top": sum(1 for e in self.top if e.abs_delta == kv)}

    def to_json(self) -> dict[str, Any]:
        return {
            "k": self.k,
            "tie_rule": "|delta| descending, then tensor name ascending, then flat row-major index ascending",
            "max_abs_update": self.max_abs,
            "num_at_max": self.at_max,
            "at_max_by_category": self.at_max_by_category,
            "top_k_by_category": self.top_by_category,
            "top_k_by_group": group_counts(self.top_by_category),
            "at_max_by_group": group_counts(self.at_max_by_category),
            "boundary": self.boundary(),
            "top": [{"rank": r + 1, "name": e.name, "category": e.category, "index": list(e.index),
                     "abs_delta": e.abs_delta, "delta": e.delta, "base": e.base, "tuned": e.tuned}
                    for r, e in enumerate(self.top)],
        }


def _ordered(counts: dict[str, int]) -> dict[str, int]:
    return {c: counts[c] for c in CATEGORIES if c in counts}


def group_counts(counts: dict[str, int]) -> dict[str, int]:
    """Roll category counts up to the paper's groups (normalization, attention)."""
    return {g: sum(counts.get(c, 0) for c in cats) for g, cats in GROUPS.items()}


def max_ratio(tuned: Localization, ref: Localization) -> float | None:
    """max|Delta_tuned| / max|Delta_ref| (the paper's "48x smaller"), None if ref did not move."""
    return tuned.max_abs / ref.max_abs if ref.max_abs > 0 else None
