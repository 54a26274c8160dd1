"""Pooled statistics of the local perturbation diagnostic (paper Eq. app-raw-variance-ratios).

:func:`pooled_stats` turns the (X+, X0, X-) observations of one (objective, coupling, sigma)
cell into Corr(X+, X0), kappa_base, Corr(X+, X-) and kappa_pair; :class:`Observations` holds
those arrays. Pure numpy; sample variances use ddof = 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


# --------------------------------------------------------------------------- statistics


@dataclass(frozen=True)
class DiagnosticStats:
    """Pooled statistics of one (objective, coupling, sigma) cell.

    n: pooled observations. corr_base = Corr(X+, X0); corr_pair = Corr(X+, X-);
    kappa_base = Var(X+ - X0)/Var(X+); kappa_pair = Var(X+ - X-)/Var(X+).
    None where undefined (a zero variance in the denominator).
    """

    n: int
    corr_base: float | None
    kappa_base: float | None
    corr_pair: float | None
    kappa_pair: float | None
    mean_plus: float
    mean_zero: float
    mean_minus: float
    var_plus: float
    var_zero: float
    var_minus: float


def _corr(a: np.ndarray, b: np.ndarray) -> float | None:
    va, vb = a.var(ddof=1), b.var(ddof=1)
    if va == 0 or vb == 0:
        return None
    cov = ((a - a.mean()) * (b - b.mean())).sum() / (a.size - 1)
    return float(cov / math.sqrt(va * vb))


def pooled_stats(x_plus: np.ndarray, x_zero: np.ndarray, x_minus: np.ndarray) -> DiagnosticStats:
    """Statistics of Eq. app-raw-variance-ratios over all observations (arrays of one shape, flattened).

    Pooling: every element is one scalar observation (e.g. shape [D, P, S] = directions x
    prompts x seeds); element i of the three arrays forms one (X+, X0, X-) triple.
    """
    if not (x_plus.shape == x_zero.shape == x_minus.shape):
        raise ValueError(f"X+, X0, X- shapes differ: {x_plus.shape}, {x_zero.shape}, {x_minus.shape}")
    p, z, m = (np.asarray(x, dtype=np.float64).ravel() for x in (x_plus, x_zero, x_minus))
    if p.size < 2:
        raise ValueError(f"need at least 2 pooled observations, got {p.size}")
    if not (np.isfinite(p).all() and np.isfinite(z).all() and np.isfinite(m).all()):
        raise ValueError("non-finite objective values")
    vp = float(p.var(ddof=1))
    return DiagnosticStats(
        n=int(p.size),
        corr_base=_corr(p, z),
        kappa_base=float((p - z).var(ddof=1) / vp) if vp > 0 else None,
        corr_pair=_corr(p, m),
        kappa_pair=float((p - m).var(ddof=1) / vp) if vp > 0 else None,
        mean_plus=float(p.mean()), mean_zero=float(z.mean()), mean_minus=float(m.mean()),
        var_plus=vp, var_zero=float(z.var(ddof=1)), var_minus=float(m.var(ddof=1)))


@dataclass
class Observations:
    """X+, X0, X- of one (objective, coupling) at one sigma, each float64 [D, P, S]."""

    plus: np.ndarray
    zero: np.ndarray
    minus: np.ndarray

    def stats(self) -> DiagnosticStats:
        return pooled_stats(self.plus, self.zero, self.minus)


__all__ = ["DiagnosticStats", "Observations", "pooled_stats"]
