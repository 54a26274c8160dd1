"""Two-level bootstrap over training runs (seeds) and problems, and the probability of improvement.

The report's verdicts and table intervals do not use the crossed percentile bootstrap below:
simulated at the demo's shape it covered 0.78-0.84 instead of 0.95 once training seeds vary
(3 seeds; docs/report.md "Coverage"), because a percentile interval over 3 seed values cannot be
wider than their range. They use the seed-level t-interval of :mod:`esreason.report.components`.
This module keeps the crossed bootstrap for the *probability of improvement* (a description, not a
verdict; independent methods draw their seeds independently, only nested runs share a draw) and
for reference.

With several training seeds, a method's score on a task is a table ``X [S seeds, n problems]``
(every seed's checkpoint is evaluated on the same n problems with the same sampling seed). An
interval that resamples only problems covers evaluation noise; it ignores that another
training seed gives another checkpoint. Following Agarwal et al. 2021 ("Deep Reinforcement
Learning at the Edge of the Statistical Precipice", NeurIPS; the stratified bootstrap of its
library rliable), each bootstrap replicate here

1. draws S training seeds with replacement (one draw for the whole replicate: a seed's
   checkpoint is the same on every task), and
2. draws n problems with replacement *within each task* (stratified by task, as the
   single-seed intervals of :mod:`esreason.eval.bootstrap` do),

and takes the mean of the crossed table over the drawn seeds x drawn problems. With weights
``w [S]`` (how often each seed was drawn) and ``v [n]`` (how often each problem was drawn)
the replicate's task mean is ``sum_{s,p} w_s v_p X[s, p] / sum_{s,p} w_s v_p [X[s, p] known]``.
Task means are averaged with equal weight per task; the interval is the percentile interval
of the replicates.

Pairing. A difference ``A - B`` uses the same drawn problems for both sides (paired by
problem). When both methods were trained with the same seeds, the same seed draw is used for
both (paired by seed: seed s of ES and seed s of GRPO share the data order, and ES->GRPO
seed s starts from the ES stage of seed s); a method evaluated once (Base, a checkpoint) has
S = 1 and contributes problem noise only. With S = 1 on both sides the replicate is exactly
the problem-only bootstrap (:func:`esreason.report.stats.bootstrap_task_average`).

Probability of improvement (Agarwal et al. 2021, section 4.3): ``P(A > B)`` is the chance
that A scores higher than B on a random problem of a random task, each side with a random
training seed of its own, ties counting one half:
``P = mean_t mean_p mean_{s, s'} ([X_A[s, p] > X_B[s', p]] + 1/2 [X_A[s, p] = X_B[s', p]])``.
0.5 means no difference; its interval comes from the same two-level replicates.

We implement these on numpy rather than depend on rliable: the computations are a few lines,
rliable is archived upstream, and its API takes (runs x tasks) score matrices, not the
crossed (seeds x problems) tables and the pairing by problem that our evaluation provides.
"""

from __future__ import annotations

import zlib
from functools import lru_cache
from typing import Mapping

import numpy as np


def problem_indices(seed: int, task: str, n: int, resamples: int) -> np.ndarray:
    """Resampled problem indices [resamples, n], deterministic in (seed, task, n)."""
    rng = np.random.default_rng(np.random.SeedSequence([seed % 2**63, zlib.crc32(task.encode()), n]))
    return rng.integers(0, n, size=(resamples, n))


def seed_indices(seed: int, stream: str, n_seeds: int, resamples: int) -> np.ndarray:
    """Resampled training-seed indices [resamples, S], deterministic in (seed, stream, S); the
    problem streams (named by task) never coincide with these (prefix ``seeds:``)."""
    rng = np.random.default_rng(np.random.SeedSequence(
        [seed % 2**63, zlib.crc32(f"seeds:{stream}".encode()), n_seeds]))
    return rng.integers(0, n_seeds, size=(resamples, n_seeds))


def draw_counts(indices: np.ndarray, size: int) -> np.ndarray:
    """How often each of ``size`` items was drawn in each replicate: [R, size] float64."""
    r = indices.shape[0]
    flat = (indices + size * np.arange(r)[:, None]).ravel()  # replicate-major bins
    return np.bincount(flat, minlength=r * size).reshape(r, size).astype(np.float64)


@lru_cache(maxsize=64)
def _problem_counts(seed: int, task: str, n: int, resamples: int) -> np.ndarray:
    """:func:`draw_counts` of :func:`problem_indices` (cached: every metric of a task reuses them)."""
    out = draw_counts(problem_indices(seed, task, n, resamples), n)
    out.setflags(write=False)
    return out


def grid_means(x: np.ndarray, w: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Replicate means of the table ``x [S, n]`` under seed weights ``w [R, S]`` and problem
    weights ``v [R, n]``; NaN cells (no value) are left out of numerator and denominator."""
    known = ~np.isnan(x)  # [S, n]
    filled = np.where(known, x, 0.0)
    seed_sum = np.zeros(v.shape)  # [R, n]: sum_s w_s X[s, p] (a loop over the few seeds: no BLAS call)
    seed_den = np.zeros(v.shape)
    for s in range(x.shape[0]):
        seed_sum += w[:, s:s + 1] * filled[s]
        seed_den += w[:, s:s + 1] * known[s]
    num = np.einsum("rp,rp->r", seed_sum, v)  # [R]
    den = np.einsum("rp,rp->r", seed_den, v)  # [R]
    return np.divide(num, den, out=np.full(num.shape, np.nan), where=den > 0)


def _percentile(values: np.ndarray, level: float) -> tuple[float | None, float | None]:
    values = values[~np.isnan(values)]
    if values.size == 0:
        return None, None
    lo, hi = np.quantile(values, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def _as_tables(per_task: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    out = {}
    for task, x in per_task.items():
        x = np.asarray(x, dtype=np.float64)
        out[task] = x[None, :] if x.ndim == 1 else x  # [S, n]
    return out


def _weights(seed: int, stream: str, n_seeds: int, resamples: int) -> np.ndarray:
    if n_seeds == 1:
        return np.ones((resamples, 1))
    return draw_counts(seed_indices(seed, stream, n_seeds, resamples), n_seeds)


def replicate_differences(per_task_a: Mapping[str, np.ndarray], per_task_b: Mapping[str, np.ndarray] | None,
                          paired_seeds: bool, resamples: int, seed: int) -> np.ndarray:
    """Two-level replicates [R] of ``mean_t (mean A_t - mean B_t)`` (B None: of ``mean_t mean A_t``).

    per_task_a/b: ``{task: X [S, n]}`` over the same problems in the same order per task (a 1-D
    array is one seed). paired_seeds: A and B were trained with the same seeds, in the same row
    order; the same seed draw is then used for both.
    """
    a = _as_tables(per_task_a)
    b = _as_tables(per_task_b) if per_task_b is not None else None
    s_a = next(iter(a.values())).shape[0]
    w_a = _weights(seed, "a", s_a, resamples)
    w_b = None
    if b is not None:
        s_b = next(iter(b.values())).shape[0]
        w_b = w_a if (paired_seeds and s_b == s_a) else _weights(seed, "b", s_b, resamples)
    total = np.zeros(resamples)
    for task, xa in a.items():
        v = _problem_counts(seed, task, xa.shape[1], resamples)  # [R, n]
        total += grid_means(xa, w_a, v)
        if b is not None:
            total -= grid_means(b[task], w_b, v)  # type: ignore[arg-type]
    return total / len(a)


def two_level_interval(per_task_a: Mapping[str, np.ndarray], per_task_b: Mapping[str, np.ndarray] | None = None,
                       paired_seeds: bool = False, level: float = 0.95, resamples: int = 50_000,
                       seed: int = 0) -> tuple[float | None, float | None]:
    """Percentile interval of :func:`replicate_differences` (B None: of A's task average)."""
    if not per_task_a or resamples < 1:
        return None, None
    return _percentile(replicate_differences(per_task_a, per_task_b, paired_seeds, resamples, seed), level)


def _pi_table(xa: np.ndarray, xb: np.ndarray) -> np.ndarray:
    """[S_a, S_b, n]: 1 where A beats B on the problem, 1/2 on a tie, NaN where either is unknown."""
    a, b = xa[:, None, :], xb[None, :, :]
    out = (a > b).astype(np.float64) + 0.5 * (a == b)
    return np.where(np.isnan(a) | np.isnan(b), np.nan, out)


def probability_of_improvement(per_task_a: Mapping[str, np.ndarray], per_task_b: Mapping[str, np.ndarray],
                               paired_seeds: bool = False, level: float = 0.95, resamples: int = 50_000,
                               seed: int = 0) -> tuple[float | None, float | None, float | None]:
    """``P(A > B)`` on a random problem and seeds (module docstring) with its two-level interval.

    Returns (value, low, high); the interval is (None, None) when ``resamples`` is 0.
    """
    a, b = _as_tables(per_task_a), _as_tables(per_task_b)
    if not a:
        return None, None, None
    tables = {t: _pi_table(a[t], b[t]) for t in a}  # [S_a, S_b, n]
    point = float(np.mean([np.nanmean(c) for c in tables.values()]))
    if resamples < 1:
        return point, None, None
    from esreason.report.exact import exact_distribution
    from esreason.report.resample import CHUNK, cdf_knots, knots_interval, problem_counts

    s_a, s_b = next(iter(a.values())).shape[0], next(iter(b.values())).shape[0]
    if s_a == s_b == 1:  # one seed a side: a task average of per-problem values, its exact bootstrap
        dist = exact_distribution({t: c[0, 0] for t, c in tables.items()})
        if dist is not None:
            return (point, *knots_interval(cdf_knots(*dist), level))
    w_a = _weights(seed, "a", s_a, resamples)
    w_b = w_a if (paired_seeds and s_a == s_b) else _weights(seed, "b", s_b, resamples)
    total = np.zeros(resamples)
    for task, c in tables.items():
        counts = problem_counts(seed, task, c.shape[2], resamples)  # [R, n] uint8, drawn in chunks
        known = ~np.isnan(c)
        filled, mask = np.where(known, c, 0.0), known.astype(np.float64)
        for lo in range(0, resamples, CHUNK):
            v = counts[lo:lo + CHUNK].astype(np.float64)
            wa, wb = w_a[lo:lo + CHUNK], w_b[lo:lo + CHUNK]
            num = np.einsum("rs,ru,rsu->r", wa, wb, np.einsum("sup,rp->rsu", filled, v))
            den = np.einsum("rs,ru,rsu->r", wa, wb, np.einsum("sup,rp->rsu", mask, v))
            total[lo:lo + CHUNK] += np.divide(num, den, out=np.full(num.shape, np.nan), where=den > 0)
    lo_ci, hi_ci = _percentile(total / len(tables), level)
    return point, lo_ci, hi_ci


def variance_text(n_seeds: int, problems: list[int]) -> str:
    """What an interval covers: ``"3 training seeds × 256 problems"`` or
    ``"1 training seed: evaluation noise only"`` (problems: per task; a range when they differ)."""
    if n_seeds <= 1:
        return "1 training seed: evaluation noise only"
    lo, hi = (min(problems), max(problems)) if problems else (0, 0)
    count = f"{lo}" if lo == hi else f"{lo}–{hi}"
    per = " per task" if len(problems) > 1 else ""
    return f"{n_seeds} training seeds × {count} problems{per}"
