"""The report's intervals (issue 25): t quantiles without scipy, the seed-level variance-components
interval against hand computations, its coverage by simulation at the demo's shape, the resample
count's stability, Holm over the family of claims and the verdict words."""

from __future__ import annotations

import math

import numpy as np
import pytest

from esreason.report.components import Estimate, moments, seed_interval
from esreason.report.coverage import Shape, coverage
from esreason.report.tdist import t_cdf, t_quantile, t_two_sided_p

# ----------------------------------------------------------------------------- t distribution


@pytest.mark.parametrize(("df", "q975"), [(1, 12.706205), (2, 4.302653), (3, 3.182446), (4, 2.776445),
                                          (10, 2.228139), (30, 2.042272), (math.inf, 1.959964)])
def test_t_quantiles_match_the_printed_table(df, q975):
    assert t_quantile(0.975, df) == pytest.approx(q975, abs=2e-6)
    assert t_quantile(0.025, df) == pytest.approx(-q975, abs=2e-6)


def test_t_cdf_matches_closed_forms():
    for t in (-3.0, -0.4, 0.0, 0.7, 5.0):
        assert t_cdf(t, 1) == pytest.approx(0.5 + math.atan(t) / math.pi, abs=1e-12)  # Cauchy
        assert t_cdf(t, 2) == pytest.approx(0.5 + t / (2 * math.sqrt(2 + t * t)), abs=1e-12)
    assert t_two_sided_p(2.0, 5) == pytest.approx(0.101939, abs=1e-6)
    assert t_quantile(1 - 0.0025, 2.37) == pytest.approx(-t_quantile(0.0025, 2.37))
    assert t_cdf(t_quantile(0.99, 7.3), 7.3) == pytest.approx(0.99, abs=1e-10)  # non-integer df


# ----------------------------------------------------------------------------- variance components


def test_seed_term_is_the_between_seed_variance_minus_the_residual_part():
    # One task, 3 seeds x 4 problems, and Base on the same problems (one row).
    a = np.array([[0.5, 0.6, 0.2, 0.9],
                  [0.7, 0.6, 0.4, 0.9],
                  [0.3, 0.5, 0.3, 0.8]])
    base = np.array([[0.4, 0.5, 0.2, 0.7]])
    m = moments([(1.0, {"t": a}), (-1.0, {"t": base})], cap_df=False)
    d = a.mean(0) - base[0]  # per-problem difference of seed means
    prob = d.var(ddof=1) / 4
    rows = a.mean(1)
    resid = a - a.mean(1, keepdims=True) - a.mean(0, keepdims=True) + a.mean()
    ms_res = (resid ** 2).sum() / (2 * 3)
    seed = rows.var(ddof=1) / 3 - ms_res / (4 * 3)
    assert seed > 0
    assert float(m.value) == pytest.approx(a.mean() - base.mean())
    assert float(m.var) == pytest.approx(prob + seed)
    # Satterthwaite over the mean squares, then capped at the seeds' S - 1 = 2 df
    satt = (prob + seed) ** 2 / (prob ** 2 / 3 + (rows.var(ddof=1) / 3) ** 2 / 2 + (ms_res / 12) ** 2 / 6)
    assert float(m.df) == pytest.approx(satt)
    assert float(moments([(1.0, {"t": a}), (-1.0, {"t": base})]).df) == pytest.approx(min(satt, 2.0))


def test_a_constant_seed_shift_is_seed_variance_and_equal_seeds_have_none():
    rng = np.random.default_rng(0)
    x = rng.random((1, 50))
    same = np.repeat(x, 3, axis=0)  # three identical seeds: no seed term, the problem term alone
    m = moments([(1.0, {"t": same})])
    assert float(m.var) == pytest.approx(x.var(ddof=1) / 50) and math.isinf(float(m.df)) or float(m.df) > 40
    shifted = same + np.array([[-0.01], [0.0], [0.01]])  # seeds differ by a constant: pure seed effect
    m2 = moments([(1.0, {"t": shifted})])
    assert float(m2.var) == pytest.approx(x.var(ddof=1) / 50 + 0.01 ** 2 / 3)


def test_nested_runs_pair_seeds_and_independent_runs_do_not():
    # Composition seed s continues ES seed s: the seed effect cancels in the seed-by-seed difference.
    es = np.array([[0.9, 0.8, 0.7], [0.3, 0.2, 0.1]])
    comp = es + 0.1
    nested = seed_interval([(1.0, {"t": comp - es})], "nested")
    independent = seed_interval([(1.0, {"t": comp}), (-1.0, {"t": es})], "independent")
    assert nested.value == pytest.approx(0.1) and nested.se == pytest.approx(0.0, abs=1e-12)
    assert independent.se > 0.2  # the two seeds' spread enters twice


def test_estimate_interval_and_p_value_agree():
    e = Estimate(0.02, "t", "x", se=0.008, df=4.0)
    lo, hi = e.interval(0.95)
    assert lo == pytest.approx(0.02 - 2.776445 * 0.008, abs=1e-8)
    p = e.p_value()
    lo_p, _ = e.interval(1 - p)
    assert lo_p == pytest.approx(0.0, abs=1e-9)  # the interval at level 1 - p touches 0
    reps = np.linspace(-0.01, 0.05, 60001)
    b = Estimate(0.02, "percentile", "x", replicates=reps)
    assert b.p_value() == pytest.approx(2 * (1 / 6), abs=1e-4)
    assert b.interval(0.95)[0] == pytest.approx(-0.01 + 0.025 * 0.06, abs=1e-6)


# ----------------------------------------------------------------------------- coverage (issue 25)

SHAPE = Shape()  # the demo: 3 tasks x 256 problems x 32 samples, logit-normal difficulty


@pytest.mark.parametrize("seed_sd_pp", [0.0, 1.0, 2.0])
@pytest.mark.parametrize("seeds", [3, 5])
@pytest.mark.parametrize("comparison", ["independent", "base"])
def test_seed_level_interval_covers_at_3_and_5_seeds(comparison, seeds, seed_sd_pp):
    cov = coverage(SHAPE, comparison, seeds, seed_sd_pp, experiments=400)
    assert 0.92 <= cov <= 0.99, cov


@pytest.mark.parametrize("seed_sd_pp", [0.0, 2.0])
def test_one_seed_interval_covers_its_own_seed(seed_sd_pp):
    # One training seed: the interval is the problem bootstrap, labelled "evaluation noise only";
    # it covers that seed's own truth (not the population over seeds).
    cov = coverage(SHAPE, "independent", 1, seed_sd_pp, experiments=400, resamples=1000)
    assert 0.92 <= cov <= 0.99, cov
