"""Seed-level intervals: a two-level variance-components t-interval over training seeds and problems.

Estimand. Tasks are fixed; problems are drawn from each task's population; training seeds are
drawn from the seed population; responses are sampled at the stated temperature. A method's
score on a task is a table ``X [S seeds, n problems]`` (each seed's checkpoint evaluated on the
same problems). The estimate of ``A - B`` is ``mean_t (mean X_A[t] - mean X_B[t])``.

Model (crossed random effects, per method): ``X[s, p] = mu + u_p + a_s + r_sp`` with a problem
effect ``u`` (shared by every seed, correlated between methods: the same problem), a seed effect
``a`` (the training run) and a residual ``r`` (seed x problem interaction plus sampling noise).
For independent training runs of A and B the variance of the estimate is

    V = Var(mean_p (u^A_p - u^B_p)) + sum_m [ sigma^2_a,m / S_m + sigma^2_r,m / (S_m n) ]

(per task, averaged over tasks with weight 1/T^2). It is estimated without double counting:

- the *problem term* ``sum_t var_p(D_t) / (n_t T^2)`` with ``D_t[p] = mean_s X_A[t][s, p] -
  mean_s X_B[t][s, p]`` (it holds u and sigma^2_r / S_m);
- per trained method with S_m > 1 the *seed term* ``max(0, var_s(a_s) / S_m - sum_t MS_res,t /
  (n_t T^2 S_m))``: ``a_s`` is seed s's task-averaged score, whose variance over seeds is
  sigma^2_a + sum_t sigma^2_r / (n_t T^2); the residual mean square ``MS_res`` (two-way ANOVA
  without replication) removes the residual part the problem term already holds. A negative
  estimate is truncated at 0 (the usual variance-components rule).

The interval is ``estimate ± t_{(1+level)/2, df} sqrt(V)`` with Welch–Satterthwaite df over the
mean squares (seed terms have S_m - 1 df; so 3 seeds give few df and a wide interval, as they
must). Base, evaluated once, has no seed term; a method trained with one seed has none either
and then the interval covers evaluation noise only (the report uses the problem bootstrap of
:mod:`esreason.report.resample` there). Seeds are paired only for *nested* runs (a composition
against its own first stage: ES->GRPO seed s continues ES seed s): the two tables are
subtracted seed by seed first and the difference table is one "method". Independent methods
(ES and GRPO) are never paired by seed index.

Coverage (``esreason.report.coverage``; tests/test_intervals.py; table in docs/report.md):
0.96-0.98 at S = 3 and 5 with seed sd 0, 1 and 2 pp (1,000 simulated experiments per cell), where the
crossed percentile bootstrap this replaces covered 0.78-0.98.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from esreason.report.tdist import t_quantile, t_two_sided_p

#: A signed side of a difference: (+1 or -1, {task: X [..., S, n]}).
Side = tuple[float, Mapping[str, np.ndarray]]


@dataclass(frozen=True)
class Moments:
    """Estimate, variance and Welch–Satterthwaite df (arrays over any leading batch axes)."""

    value: np.ndarray
    var: np.ndarray
    df: np.ndarray


def _ms_res(x: np.ndarray) -> np.ndarray:
    """Residual mean square of two-way ANOVA without replication on ``x [..., S, n]``."""
    s, n = x.shape[-2], x.shape[-1]
    r = x - x.mean(-1, keepdims=True) - x.mean(-2, keepdims=True) + x.mean((-2, -1), keepdims=True)
    return (r ** 2).sum((-2, -1)) / ((s - 1) * (n - 1))


def moments(sides: Sequence[Side], cap_df: bool = True) -> Moments:
    """:class:`Moments` of ``sum_side sign * mean_t mean X`` (module docstring); tables without NaN.

    Every side has the same tasks with the same problems in the same order (paired by problem);
    leading axes before (S, n) are a batch (the coverage simulation passes many experiments at once).
    """
    tasks = list(sides[0][1])
    n_tasks = len(tasks)
    value = 0.0
    var_prob = 0.0
    denom = 0.0
    for t in tasks:
        d = sum(sign * np.asarray(tab[t], dtype=np.float64).mean(-2) for sign, tab in sides)  # [..., n]
        n = d.shape[-1]
        value = value + d.mean(-1) / n_tasks
        term = d.var(-1, ddof=1) / (n * n_tasks ** 2)
        var_prob = var_prob + term
        denom = denom + term ** 2 / (n - 1)
    var = var_prob
    seed_df = 0.0
    for _, tab in sides:
        x0 = np.asarray(tab[tasks[0]])
        s = x0.shape[-2]
        if s < 2:
            continue
        a = sum(np.asarray(tab[t], dtype=np.float64).mean(-1) for t in tasks) / n_tasks  # [..., S]
        raw = a.var(-1, ddof=1) / s
        corr = sum(_ms_res(np.asarray(tab[t], dtype=np.float64)) / (np.asarray(tab[t]).shape[-1] * n_tasks ** 2)
                   for t in tasks) / s
        res_df = (s - 1) * sum(np.asarray(tab[t]).shape[-1] - 1 for t in tasks)
        comp = raw - corr
        positive = comp > 0
        var = var + np.where(positive, comp, 0.0)
        denom = denom + np.where(positive, raw ** 2 / (s - 1) + corr ** 2 / res_df, 0.0)
        seed_df = seed_df + np.where(positive, s - 1.0, 0.0)
    var = np.asarray(var, dtype=np.float64)
    denom = np.asarray(denom, dtype=np.float64)
    df = np.divide(var ** 2, denom, out=np.full(var.shape, np.inf), where=denom > 0)
    if cap_df:
        seed_df = np.asarray(seed_df, dtype=np.float64)
        df = np.where(seed_df > 0, np.minimum(df, seed_df), df)
    return Moments(np.asarray(value, dtype=np.float64), var, df)


@dataclass(frozen=True)
class Estimate:
    """A difference (or a level) with what its interval needs, at any level.

    kind: ``"t"`` (seed-level variance components: ``se``, ``df``) or ``"percentile"`` (problem
    bootstrap: its exact distribution as CDF knots ``cdf`` (:mod:`esreason.report.exact`), or Monte
    Carlo ``replicates`` where a value is missing). label: what the interval covers, in words.
    """

    value: float
    kind: str
    label: str
    se: float | None = None
    df: float | None = None
    replicates: np.ndarray | None = None
    cdf: tuple[np.ndarray, np.ndarray] | None = None

    def interval(self, level: float = 0.95) -> tuple[float | None, float | None]:
        """The equal-tailed ``level`` interval (None, None when there is none)."""
        if self.kind == "t":
            if self.se is None or self.df is None or not math.isfinite(self.se):
                return None, None
            half = t_quantile((1 + level) / 2, self.df) * self.se
            return self.value - half, self.value + half
        from esreason.report.resample import knots_interval, percentile

        if self.cdf is not None:
            return knots_interval(self.cdf, level)
        if self.replicates is None:
            return None, None
        return percentile(self.replicates, level)

    def p_value(self) -> float | None:
        """Two-sided p-value of "difference 0" matching :meth:`interval` (excludes 0 at level 1 - p)."""
        if self.kind == "t":
            if self.se is None or self.df is None:
                return None
            if self.se == 0:
                return 1.0 if self.value == 0 else 0.0
            return t_two_sided_p(self.value / self.se, self.df)
        from esreason.report.resample import knots_p, percentile_p

        if self.cdf is not None:
            return knots_p(self.cdf)
        if self.replicates is None:
            return None
        return percentile_p(self.replicates)

    def as_dict(self) -> dict[str, object]:
        lo, hi = self.interval()
        return {"value": self.value, "ci_low": lo, "ci_high": hi, "method": self.kind, "se": self.se,
                "df": None if self.df is None or not math.isfinite(self.df) else self.df,
                "p": self.p_value(), "covers": self.label}


def _complete(sides: Sequence[Side]) -> list[Side] | None:
    """The sides restricted, per task, to the problems every seed of every side has (None if a task
    is left with fewer than 2)."""
    tasks = list(sides[0][1])
    keep = {}
    for t in tasks:
        ok = np.ones(np.asarray(sides[0][1][t]).shape[-1], dtype=bool)
        for _, tab in sides:
            ok &= ~np.isnan(np.asarray(tab[t], dtype=np.float64)).any(0)
        if ok.sum() < 2:
            return None
        keep[t] = ok
    return [(sign, {t: np.asarray(tab[t], dtype=np.float64)[:, keep[t]] for t in tasks}) for sign, tab in sides]


def as_table(x: np.ndarray) -> np.ndarray:
    """A per-problem vector (one seed) as a [1, n] table; a table unchanged."""
    x = np.asarray(x, dtype=np.float64)
    return x[None, :] if x.ndim == 1 else x


def seed_interval(sides: Sequence[Side], label: str) -> Estimate | None:
    """The seed-level t :class:`Estimate` of ``sum sign * mean_t mean X`` over real tables (NaN
    problems dropped); None when no task keeps two problems."""
    sides = [(sign, {t: as_table(x) for t, x in tab.items()}) for sign, tab in sides]
    complete = _complete(sides)
    if complete is None:
        return None
    m = moments(complete)
    return Estimate(float(m.value), "t", label, se=float(math.sqrt(max(float(m.var), 0.0))), df=float(m.df))
