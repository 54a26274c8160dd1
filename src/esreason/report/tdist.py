"""Student's t distribution without scipy: CDF, two-sided p-value and quantile.

The report's seed-level intervals (:mod:`esreason.report.components`) are t-intervals with
Welch–Satterthwaite degrees of freedom (any real df > 0), so a table of integer quantiles is
not enough. The CDF uses the regularised incomplete beta function,

    P(T <= t) = 1 - I_x(df/2, 1/2) / 2   for t >= 0,   x = df / (df + t^2),

evaluated by its continued fraction (Lentz's method; Press et al., *Numerical Recipes*, 3rd
ed., section 6.4); the quantile inverts the CDF by safeguarded Newton steps to 1e-12. Checked in
tests/test_intervals.py against closed forms (df 1: Cauchy; df 2: t / sqrt(2 + t^2)) and
the printed table values (t_0.975 = 12.706, 4.303, 2.776, 2.228, 2.042 at df 1, 2, 4, 10, 30).
"""

from __future__ import annotations

import math

_EPS = 1e-15
_TINY = 1e-300


def _beta_cf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz)."""
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > _TINY else _TINY)
    h = d
    for m in range(1, 500):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > _TINY else _TINY)
        c = 1.0 + aa / c if abs(1.0 + aa / c) > _TINY else _TINY
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > _TINY else _TINY)
        c = 1.0 + aa / c if abs(1.0 + aa / c) > _TINY else _TINY
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < _EPS:
            break
    return h


def incomplete_beta(a: float, b: float, x: float) -> float:
    """Regularised incomplete beta I_x(a, b) for a, b > 0 and 0 <= x <= 1."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    ln_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    front = math.exp(ln_front)
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _beta_cf(a, b, x) / a
    return 1.0 - front * _beta_cf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with ``df`` > 0 degrees of freedom (df = inf: the normal)."""
    if df <= 0 or math.isnan(df):
        raise ValueError(f"degrees of freedom must be > 0, got {df!r}")
    if math.isinf(df):
        return 0.5 * math.erfc(-t / math.sqrt(2.0))
    tail = 0.5 * incomplete_beta(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def t_two_sided_p(t: float, df: float) -> float:
    """Two-sided p-value of the statistic ``t``: P(|T| >= |t|)."""
    if math.isinf(df):
        return math.erfc(abs(t) / math.sqrt(2.0))
    return min(1.0, incomplete_beta(df / 2.0, 0.5, df / (df + t * t)))


def t_pdf(t: float, df: float) -> float:
    """Density of Student's t with ``df`` degrees of freedom."""
    if math.isinf(df):
        return math.exp(-0.5 * t * t) / math.sqrt(2.0 * math.pi)
    ln = (math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
          - (df + 1) / 2 * math.log1p(t * t / df))
    return math.exp(ln)


def t_quantile(q: float, df: float) -> float:
    """The ``q`` quantile of Student's t with ``df`` degrees of freedom (0 < q < 1): Newton steps on
    :func:`t_cdf` from the normal quantile, kept inside a bisection bracket, to 1e-12."""
    if not 0.0 < q < 1.0:
        raise ValueError(f"quantile level must be in (0, 1), got {q!r}")
    if q == 0.5:
        return 0.0
    if q < 0.5:
        return -t_quantile(1.0 - q, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < q:
        lo, hi = hi, hi * 2.0
        if hi > 1e12:
            return math.inf
    x = min(max(_normal_quantile(q), lo), hi)
    for _ in range(100):
        f = t_cdf(x, df) - q
        if f < 0:
            lo = x
        else:
            hi = x
        step = f / max(t_pdf(x, df), 1e-300)
        nxt = x - step
        if not lo < nxt < hi:
            nxt = 0.5 * (lo + hi)
        if abs(nxt - x) < 1e-12 * max(1.0, abs(x)) or hi - lo < 1e-12 * max(1.0, hi):
            return nxt
        x = nxt
    return x


def _normal_quantile(q: float) -> float:
    """Standard normal quantile by bisection on erfc (a starting point for :func:`t_quantile`)."""
    lo, hi = -40.0, 40.0
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        if 0.5 * math.erfc(-mid / math.sqrt(2.0)) < q:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)
