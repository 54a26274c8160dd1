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
- per trained method with S_m > 1 the *seed term*: the ANOVA estimate ``var_s(a_s) / S_m -
  sum_t MS_res,t / (n_t T^2 S_m)`` (``a_s`` is seed s's task-averaged score, whose variance over
  seeds is sigma^2_a + sum_t sigma^2_r / (n_t T^2); the residual mean square ``MS_res`` of two-way
  ANOVA without replication removes the residual part the problem term already holds), but never
  less than the *detection floor* below.

The interval is ``estimate ± t_{(1+level)/2, df} sqrt(V)`` with Welch–Satterthwaite df over the
mean squares, capped at the seeds' df ``sum_m (S_m - 1)`` over every method with a seed term
(so 3 seeds give few df and a wide interval, as they must).

Detection floor. The usual variance-components rule truncates a negative ANOVA
estimate at 0 (Searle, Casella & McCulloch 1992, *Variance Components*), and Satterthwaite df
then lose the zero component: under that rule alone the term becomes 0 *and* its
S - 1 df leave the cap, so at S = 3 the interval falls to evaluation noise with normal quantiles
(about 1.5 pp wide instead of 5.8 in the demo's shape) while its label still says "3 training
seeds"; against Base such intervals cover 0.38-0.75 at 1-2 pp of seed spread. With S - 1 = 2 df a
truncated estimate says little: the seed mean square ``raw`` is ``E[raw] chi^2_{S-1} / (S-1)``,
so it falls below the residual part ``corr`` with probability ``F_{chi^2_{S-1}}((S-1) corr /
E[raw])`` - 5 % even when sigma^2_a / S is 18.5 times ``corr`` at S = 3. Two changes:

- the df cap is the *containment* df (SAS PROC MIXED DDFM=CONTAIN): it counts every seeded
  method's S_m - 1 whatever its estimate, since the seeds' df are a property of the design, not
  of the estimate (Barr et al. 2013 show why dropping a random effect that was estimated at 0
  makes tests anticonservative);
- the seed term is floored at ``U = corr ((S-1) / chi^2_{0.05, S-1} - 1)``: the seed variance
  that S seeds detect (give a positive estimate) with 95 % probability, i.e. the largest seed
  variance a truncated estimate still fails to reject at 5 %. It is the one-sided 95 % upper
  limit of sigma^2_a / S from the seed mean square's chi^2 (the ``H_1`` term of the modified
  large-sample limits, Burdick & Graybill 1992, *Confidence Intervals on Variance Components*,
  with the residual's thousands of df taken as known) evaluated at the truncation point ``raw =
  corr``: the largest upper limit any truncated data set can give. It depends on the residual
  only, not on how far below the boundary the 2-df seed spread fell (chance, mostly). The floor
  applies to *every* seed term (``max(estimate, U)``), not only to truncated ones, so the interval
  stays continuous and monotone in the seed spread: flooring only truncated terms would leave the
  barely positive ones (same information) at 0.80 coverage at 2 pp. A floored term enters the
  Satterthwaite sum as a seed variance with S - 1 df. It shrinks as S grows (U / corr: 18.5 at S
  = 3, 4.6 at S = 5, 1.7 at S = 10) and is 0 when seeds agree on every problem (``corr = 0``).

Cost: the interval over-covers (0.99-1.00) when the seed spread is below the floor (0-1 pp at S =
3 in the demo's shape: a 3-seed interval is then about 6 pp wide, not 1.5-3): 3 seeds cannot show
a seed spread that small, and the interval says so.

Base, evaluated once, has no seed term; a method trained with one seed has none either and then
the interval covers evaluation noise only (the report uses the problem bootstrap of
:mod:`esreason.report.resample` there). Seeds are paired only for *nested* runs (a composition
against its own first stage: ES->GRPO seed s continues ES seed s): the two tables are
subtracted seed by seed first and the difference table is one "method". Independent methods
(ES and GRPO) are never paired by seed index.

Coverage (``esreason.report.coverage``; tests/test_intervals.py; table in docs/report.md, with
the coverage of the intervals whose ANOVA seed estimate was <= 0): 0.958-1.000 at S = 3 and 5
with seed sd 0, 1 and 2 pp (4,000 simulated experiments per cell), 0.907-1.000 among the
truncated intervals, where the crossed percentile bootstrap this replaces covered 0.78-0.98.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Mapping, Sequence

import numpy as np

from esreason.report.tdist import t_quantile, t_two_sided_p

#: A signed side of a difference: (+1 or -1, {task: X [..., S, n]}).
Side = tuple[float, Mapping[str, np.ndarray]]

#: Probability with which S seeds must detect a seed variance (a positive ANOVA estimate) before
#: the seed term may fall below it (module docstring, "Detection floor").
DETECTION = 0.95


@dataclass(frozen=True)
class Moments:
    """Estimate, variance and Welch–Satterthwaite df (arrays over any leading batch axes)."""

    value: np.ndarray
    var: np.ndarray
    df: np.ndarray
    truncated: np.ndarray
    """True where some method's ANOVA seed estimate is <= 0 (the old rule set the term to 0)."""
    floored: np.ndarray
    """True where some method's seed term is the detection floor (its estimate was below it)."""


def chi2_cdf(x: float, k: float) -> float:
    """P(chi^2_k <= x): the regularised lower incomplete gamma P(k/2, x/2), by its power series
    (Abramowitz & Stegun 6.5.29); meant for x up to a few times k."""
    if x <= 0:
        return 0.0
    a, y = k / 2, x / 2
    term = total = 1.0 / a
    i = 0
    while term > 1e-16 * total:
        i += 1
        term *= y / (a + i)
        total += term
    return min(1.0, math.exp(-y + a * math.log(y) - math.lgamma(a)) * total)


def chi2_quantile(q: float, k: float) -> float:
    """The q quantile of chi^2_k for 0 < q <= 0.5 (bisection on :func:`chi2_cdf`; the median is
    below k)."""
    if not 0 < q <= 0.5 or k <= 0:
        raise ValueError(f"chi2_quantile needs 0 < q <= 0.5 and k > 0, got q={q!r}, k={k!r}")
    lo, hi = 0.0, float(k)
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if chi2_cdf(mid, k) < q else (lo, mid)
        if hi - lo <= 1e-14 * hi:
            break
    return 0.5 * (lo + hi)


@lru_cache(maxsize=64)
def floor_factor(seeds: int) -> float:
    """``U / corr = (S-1) / chi^2_{1-DETECTION, S-1} - 1``: the detection floor of the seed term
    in units of its residual correction (module docstring); 18.5 at S = 3, 4.6 at S = 5."""
    return (seeds - 1) / chi2_quantile(1 - DETECTION, seeds - 1) - 1


def _ms_res(x: np.ndarray) -> np.ndarray:
    """Residual mean square of two-way ANOVA without replication on ``x [..., S, n]``."""
    s, n = x.shape[-2], x.shape[-1]
    r = x - x.mean(-1, keepdims=True) - x.mean(-2, keepdims=True) + x.mean((-2, -1), keepdims=True)
    return (r ** 2).sum((-2, -1)) / ((s - 1) * (n - 1))


def moments(sides: Sequence[Side], cap_df: bool = True) -> Moments:
    """:class:`Moments` of ``sum_side sign * mean_t mean X`` (module docstring); tables without NaN.

    cap_df: cap the df at the seeds' containment df (shipped); False gives plain Satterthwaite
    (the coverage simulation's reference).

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
    truncated = np.zeros(np.shape(value), dtype=bool)
    floored = np.zeros(np.shape(value), dtype=bool)
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
        floor = corr * floor_factor(s)
        estimated = comp > floor
        var = var + np.where(estimated, comp, floor)
        denom = denom + np.where(estimated, raw ** 2 / (s - 1) + corr ** 2 / res_df, floor ** 2 / (s - 1))
        truncated = truncated | (comp <= 0)
        floored = floored | ~estimated
        seed_df += s - 1.0  # containment: the design's seed df, whatever the estimate
    var = np.asarray(var, dtype=np.float64)
    denom = np.asarray(denom, dtype=np.float64)
    df = np.divide(var ** 2, denom, out=np.full(var.shape, np.inf), where=denom > 0)
    if cap_df and seed_df > 0:
        df = np.minimum(df, seed_df)
    return Moments(np.asarray(value, dtype=np.float64), var, df, truncated, floored)


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
