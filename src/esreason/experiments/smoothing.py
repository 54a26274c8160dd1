"""Smoothed reward trajectories and checkpoint comparisons (paper, appendix
"Population-Size Scaling Trajectories" and table "rq3-population-checkpoints").

The paper reports per-update mean rewards x_t smoothed by *debiased exponential
smoothing with weight 0.99*::

    m_0 = 0,   m_t = beta * m_{t-1} + (1 - beta) * x_t,   s_t = m_t / (1 - beta**t)   (t = 1, 2, ...)

so s_1 = x_1 exactly and s_t is a weighted mean of x_1..x_t with weights proportional
to beta**(t-i). Its trajectory figure shades "one local standard deviation of the
raw-minus-smoothed residuals" r_t = x_t - s_t; the paper does not state the window, so
:func:`residual_band` takes it as a parameter (a centred window of ``window`` updates,
truncated at both ends, population std with ddof 0).

The checkpoint table (:func:`checkpoint_table`) reads s_t at chosen updates (paper: 100,
200, 300) for every swept value and marks values within ``tolerance`` (paper: 0.01) of
the reference value's s_t (paper: N = 64).

Pure numpy: no torch, no files.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

PAPER_BETA = 0.99
"""Smoothing weight of the paper's trajectories and checkpoint table."""
PAPER_TOLERANCE = 0.01
"""'within 0.01 of the N = 64 reference' (paper table rq3-population-checkpoints)."""
PAPER_CHECKPOINTS = (100, 200, 300)
"""Updates of the paper's checkpoint table."""


def _as_series(values: Sequence[float] | np.ndarray, name: str = "rewards") -> np.ndarray:
    x = np.asarray(values, dtype=np.float64)
    if x.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {x.shape}")
    if not np.all(np.isfinite(x)):
        raise ValueError(f"{name} contains a non-finite value")
    return x


def debiased_ema(values: Sequence[float] | np.ndarray, beta: float = PAPER_BETA) -> np.ndarray:
    """s_t = m_t / (1 - beta**t) with m_t = beta m_{t-1} + (1 - beta) x_t, m_0 = 0.

    ``values[i]`` is x_{i+1} (the mean reward of update i + 1); the result has the same
    length, ``result[0] == values[0]``. beta must be in [0, 1).
    """
    if not 0.0 <= beta < 1.0:
        raise ValueError(f"beta must be in [0, 1), got {beta}")
    x = _as_series(values)
    out = np.empty_like(x)
    m = 0.0
    for i, xt in enumerate(x):
        m = beta * m + (1.0 - beta) * xt
        out[i] = m / (1.0 - beta ** (i + 1))
    return out


def residual_band(values: Sequence[float] | np.ndarray, smoothed: Sequence[float] | np.ndarray,
                  window: int) -> np.ndarray:
    """Local standard deviation of r_t = x_t - s_t over a centred window of ``window`` updates.

    Element t is std(r[t - h : t + h + 1]) with h = window // 2, truncated at the ends of the
    trajectory, ddof 0 (a window of one point gives 0). The paper shades s_t +- this value.
    """
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"window must be an integer >= 1, got {window!r}")
    x, s = _as_series(values), _as_series(smoothed, "smoothed")
    if x.shape != s.shape:
        raise ValueError(f"values and smoothed differ in length ({len(x)} vs {len(s)})")
    r = x - s
    h = window // 2
    return np.array([r[max(0, t - h): t + h + 1].std() for t in range(len(r))], dtype=np.float64)


@dataclass(frozen=True)
class Cell:
    """One (update, value) entry of the checkpoint table.

    smoothed: s_t of that value (None when its run has fewer than t updates).
    gap: s_t(reference) - s_t(value), the paper's sign (positive = below the reference);
        None without a reference or a missing value.
    within: |gap| <= tolerance (False for the reference itself and for missing cells).
    """

    smoothed: float | None
    gap: float | None
    within: bool


@dataclass(frozen=True)
class CheckpointTable:
    """s_t at chosen updates for every swept value, compared with the reference value."""

    labels: tuple[str, ...]
    updates: tuple[int, ...]
    reference: str | None
    tolerance: float
    cells: tuple[tuple[Cell, ...], ...]
    """cells[i][j]: update updates[i], value labels[j]."""

    def cell(self, update: int, label: str) -> Cell:
        return self.cells[self.updates.index(update)][self.labels.index(label)]

    def within(self, update: int) -> list[str]:
        """Labels (reference excluded) within the tolerance at ``update``."""
        return [lab for lab, c in zip(self.labels, self.cells[self.updates.index(update)]) if c.within]

    def as_dict(self) -> dict[str, object]:
        return {
            "updates": list(self.updates), "values": list(self.labels), "reference": self.reference,
            "tolerance": self.tolerance,
            "gap_definition": "smoothed(reference) - smoothed(value); positive = below the reference",
            "rows": [{"update": u, **{lab: {"smoothed": c.smoothed, "gap": c.gap, "within": c.within}
                                      for lab, c in zip(self.labels, row)}}
                     for u, row in zip(self.updates, self.cells)],
        }


def checkpoint_table(smoothed: Mapping[str, Sequence[float] | np.ndarray], updates: Sequence[int],
                     reference: str | None, tolerance: float = PAPER_TOLERANCE) -> CheckpointTable:
    """Read smoothed trajectories at ``updates`` (1-based) and mark values near the reference.

    smoothed: {label: s_1..s_T} in column order. reference: one of the labels, or None
    (no gaps, nothing marked). A trajectory shorter than an update gives an empty cell.
    """
    labels = tuple(smoothed)
    if reference is not None and reference not in smoothed:
        raise ValueError(f"reference {reference!r} is not one of {list(labels)}")
    if tolerance < 0:
        raise ValueError(f"tolerance must be >= 0, got {tolerance}")
    ups = tuple(int(u) for u in updates)
    if any(u < 1 for u in ups):
        raise ValueError(f"updates are 1-based, got {list(ups)}")

    def at(label: str, u: int) -> float | None:
        series = smoothed[label]
        return float(series[u - 1]) if len(series) >= u else None

    rows = []
    for u in ups:
        ref = at(reference, u) if reference is not None else None
        row = []
        for lab in labels:
            val = at(lab, u)
            gap = None if val is None or ref is None else ref - val
            near = gap is not None and lab != reference and abs(gap) <= tolerance + 1e-12
            row.append(Cell(val, gap, near))
        rows.append(tuple(row))
    return CheckpointTable(labels, ups, reference, float(tolerance), tuple(rows))
