"""Percentile-bootstrap confidence intervals over problems.

The paper reports point estimates: "Reported task scores are arithmetic means over
problems, with each problem weighted equally; multi-task averages likewise assign equal
weight to each benchmark" (appendix "Evaluation Metrics"). We add an interval to every
number, since the benchmarks are small (AIME: 30 problems) and sampling noise is large.

Method: problems are resampled with replacement, ``resamples`` times (default 1000), and
the interval is the ``(1 - level) / 2`` and ``(1 + level) / 2`` quantiles of the
resampled means (percentile bootstrap, default 95 %). For a suite average, problems are
resampled *within each task* and the resampled task means are averaged with equal
weights, mirroring how the point estimate is formed. The resampling indices of a task
depend only on (seed, task name, number of problems), so every metric of a task is
resampled with the same problems (paired intervals) and a rerun gives identical bounds.

Missing values (a metric a problem does not have, e.g. entropy when nothing was
generated) are left out of that metric's means; a task with no value for a metric is
left out of that metric's suite average.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np


@dataclass(frozen=True)
class Estimate:
    """A mean with its bootstrap interval; ``n`` = problems (task) or tasks (suite) averaged."""

    value: float | None
    low: float | None
    high: float | None
    n: int

    def as_dict(self) -> dict[str, float | int | None]:
        return {"value": self.value, "ci_low": self.low, "ci_high": self.high, "n": self.n}


class Bootstrap:
    """Seeded percentile bootstrap for task means and equal-weight suite averages."""

    def __init__(self, resamples: int = 1000, level: float = 0.95, seed: int = 0) -> None:
        if not isinstance(resamples, int) or resamples < 1:
            raise ValueError(f"resamples must be an integer >= 1, got {resamples!r}")
        if not 0 < level < 1:
            raise ValueError(f"level must be in (0, 1), got {level!r}")
        self.resamples = resamples
        self.level = level
        self.seed = seed
        self._cache: dict[tuple[str, int], np.ndarray] = {}

    def indices(self, task: str, n: int) -> np.ndarray:
        """Resampled problem indices of ``task``: int64 [resamples, n]."""
        key = (task, n)
        if key not in self._cache:
            rng = np.random.default_rng(np.random.SeedSequence([self.seed % 2**63, zlib.crc32(task.encode()), n]))
            self._cache[key] = rng.integers(0, n, size=(self.resamples, n))
        return self._cache[key]

    def _resampled_means(self, task: str, values: Sequence[float | None]) -> tuple[float, np.ndarray] | None:
        """(point mean, resampled means [resamples] with NaN where a resample has no value)."""
        x = np.array([np.nan if v is None else float(v) for v in values], dtype=np.float64)  # [n]
        present = ~np.isnan(x)
        if not present.any():
            return None
        draws = x[self.indices(task, len(x))]  # [resamples, n]
        counts = (~np.isnan(draws)).sum(axis=1)  # [resamples]
        sums = np.nansum(draws, axis=1)
        means = np.divide(sums, counts, out=np.full(len(sums), np.nan), where=counts > 0)
        return float(x[present].mean()), means

    def _interval(self, means: np.ndarray) -> tuple[float | None, float | None]:
        means = means[~np.isnan(means)]
        if means.size == 0:
            return None, None
        lo, hi = np.quantile(means, [(1 - self.level) / 2, (1 + self.level) / 2])
        return float(lo), float(hi)

    def task(self, task: str, values: Sequence[float | None]) -> Estimate:
        """Mean over problems of one task with its interval (None values left out)."""
        out = self._resampled_means(task, values)
        if out is None:
            return Estimate(None, None, None, 0)
        point, means = out
        lo, hi = self._interval(means)
        return Estimate(point, lo, hi, sum(v is not None for v in values))

    def suite(self, values_by_task: Mapping[str, Sequence[float | None]]) -> Estimate:
        """Equal-weight average of task means; problems resampled within each task."""
        points, draws = [], []
        for task, values in values_by_task.items():
            out = self._resampled_means(task, values)
            if out is None:
                continue
            points.append(out[0])
            draws.append(out[1])
        if not points:
            return Estimate(None, None, None, 0)
        stacked = np.vstack(draws)  # [tasks, resamples]
        with np.errstate(invalid="ignore"):
            means = stacked.mean(axis=0)  # NaN when one task's resample had no value
        lo, hi = self._interval(means)
        return Estimate(float(np.mean(points)), lo, hi, len(points))
