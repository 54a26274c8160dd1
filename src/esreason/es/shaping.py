"""Reward shaping: population rewards R (by population index) -> weights z.

We MAXIMISE reward. All functions are pure and return float64 numpy arrays of the
same length as their input; an all-equal population gives all-zero weights,
never NaN.
"""

from __future__ import annotations

import numpy as np


def zscore(rewards: np.ndarray, eps: float = 1e-8) -> np.ndarray:
    """Paper appendix "Implementation Procedure" step 4:
    z_i = (R_i - mean R) / (sqrt(N^-1 sum_j (R_j - mean R)^2) + eps), i.e. std with ddof 0.

    Deviation: when all rewards are equal we return exact zeros whatever eps is (incl. 0).
    The formula would give 0/0 in exact arithmetic, but the floating-point mean of N equal
    values can be one ulp off (mean of 3 x 0.1 is 0.1 + 1.4e-17), which would make every
    centred reward the same tiny number and every z = +-1 at eps 0 (or +-1e-9 at eps 1e-8):
    a full-size update in a direction no reward supports. Equality is tested, not the std.
    """
    r = np.asarray(rewards, dtype=np.float64)
    if r.size == 0 or bool(np.all(r == r[0])):
        return np.zeros_like(r)  # equal rewards carry no signal: zero update
    centred = r - r.mean()
    std = float(np.sqrt(np.mean(centred**2)))
    if std == 0.0:
        return np.zeros_like(r)
    return centred / (std + eps)


def none(rewards: np.ndarray) -> np.ndarray:
    """Raw rewards (the unnormalised one-point estimator, paper Eq. es-raw-estimator)."""
    return np.asarray(rewards, dtype=np.float64).copy()


def centered_rank(rewards: np.ndarray) -> np.ndarray:
    """Centred ranks in [-0.5, 0.5] (Salimans et al. 2017); ties share their mean rank."""
    r = np.asarray(rewards, dtype=np.float64)
    n = r.size
    if n < 2:
        return np.zeros_like(r)
    order = np.argsort(r, kind="stable")
    ranks = np.empty(n, dtype=np.float64)
    ranks[order] = np.arange(n, dtype=np.float64)
    for value in np.unique(r):  # average the ranks of tied rewards
        mask = r == value
        ranks[mask] = ranks[mask].mean()
    return ranks / (n - 1) - 0.5


def shape(rewards: np.ndarray, method: str, eps: float = 1e-8) -> np.ndarray:
    """Dispatch on ``es.shaping`` (zscore | none | rank)."""
    if method == "zscore":
        return zscore(rewards, eps)
    if method == "none":
        return none(rewards)
    if method == "rank":
        return centered_rank(rewards)
    raise ValueError(f"unknown shaping {method!r}")
