"""Percentile bootstrap over problems: task means and equal-weight suite averages."""

from __future__ import annotations

import numpy as np
import pytest

from esreason.eval.aggregate import AVERAGE, summarize
from esreason.eval.bootstrap import Bootstrap


def _values(seed: int, n: int, p: float) -> list[float]:
    rng = np.random.default_rng(seed)
    return [float(x) for x in (rng.random(n) < p)]


def test_task_interval_contains_point_and_is_deterministic():
    values = _values(0, 200, 0.4)
    a = Bootstrap(1000, seed=7).task("gsm8k", values)
    b = Bootstrap(1000, seed=7).task("gsm8k", values)
    assert a == b
    assert a.value == pytest.approx(np.mean(values))
    assert a.low < a.value < a.high
    # Normal approximation of a binomial mean: half-width ~ 1.96 * sqrt(p(1-p)/n) ~ 0.068.
    assert 0.04 < (a.high - a.low) / 2 < 0.1
    c = Bootstrap(1000, seed=8).task("gsm8k", values)
    assert (c.low, c.high) != (a.low, a.high)


def test_constant_values_give_a_degenerate_interval():
    est = Bootstrap(200, seed=0).task("t", [1.0] * 30)
    assert est.value == est.low == est.high == 1.0


def test_missing_values_are_left_out():
    est = Bootstrap(500, seed=0).task("t", [1.0, None, 0.0, None, 1.0, 1.0])
    assert est.value == pytest.approx(0.75) and est.n == 4
    empty = Bootstrap(500, seed=0).task("t", [None, None])
    assert empty.value is None and empty.low is None and empty.n == 0


def test_suite_average_weighs_tasks_equally_and_resamples_within_tasks():
    big = _values(1, 400, 0.8)      # mean ~0.8, 400 problems
    small = _values(2, 20, 0.2)     # mean ~0.2, 20 problems
    boot = Bootstrap(1000, seed=3)
    suite = boot.suite({"big": big, "small": small})
    assert suite.value == pytest.approx((np.mean(big) + np.mean(small)) / 2)  # not the problem-weighted mean
    assert suite.low < suite.value < suite.high
    assert suite.n == 2
    # The small task dominates the suite's uncertainty: the suite half-width is about half the small
    # task's (the average divides its spread by 2), and wider than half the big task's.
    small_task = boot.task("small", small)
    big_task = boot.task("big", big)
    width = suite.high - suite.low
    assert 0.35 * (small_task.high - small_task.low) < width < 0.7 * (small_task.high - small_task.low)
    assert width > 0.5 * (big_task.high - big_task.low)


def test_same_problem_resamples_for_every_metric_of_a_task():
    boot = Bootstrap(300, seed=0)
    assert np.array_equal(boot.indices("t", 10), boot.indices("t", 10))
    values = _values(4, 50, 0.5)
    # Identical metrics get identical intervals (paired resampling).
    assert boot.task("t", values) == boot.task("t", list(values))


def test_summarize_with_and_without_bootstrap():
    tables = {"a": [{"pass@1": 1.0}, {"pass@1": 0.0}], "b": [{"pass@1": 0.5}, {"pass@1": None}]}
    plain = summarize(tables, ["pass@1"])
    assert plain["a"]["pass@1"].value == 0.5 and plain["b"]["pass@1"].value == 0.5
    assert plain[AVERAGE]["pass@1"].value == 0.5 and plain[AVERAGE]["pass@1"].low is None
    boot = summarize(tables, ["pass@1"], Bootstrap(200, seed=0))
    assert boot[AVERAGE]["pass@1"].value == 0.5
    assert boot[AVERAGE]["pass@1"].low <= 0.5 <= boot[AVERAGE]["pass@1"].high


def test_bad_settings_are_rejected():
    with pytest.raises(ValueError):
        Bootstrap(0)
    with pytest.raises(ValueError):
        Bootstrap(100, level=1.5)
