"""The problem bootstrap's distribution computed exactly, by convolution: no resamples, no Monte
Carlo error.

The report's one-seed interval (a level or a paired difference, one task or the equal-weight
average over tasks) is the percentile interval of the *problem bootstrap*: each task's n problems
are drawn with replacement and the drawn values averaged (:mod:`esreason.report.resample`). As
the number of resamples grows, the replicates' distribution tends to the distribution of

    A = (1/T) sum_t (1/n_t) sum_{i=1..n_t} X_ti,   X_ti drawn uniformly from task t's values,

a sum of independent draws, whose distribution is the convolution of the draws' distributions.
This module computes that distribution directly, so no endpoint depends on a resample count: every draw's value
``x / (n_t T)`` is placed on a grid of spacing ``h``; the characteristic function of the sum is
the product over tasks of (one draw's DFT) ** n_t; one inverse FFT gives the mass of every grid
point. The percentile endpoints are then read off the same continuity-corrected CDF the Monte
Carlo path uses (:func:`esreason.report.resample.cdf_knots`), so an endpoint no longer moves
between bootstrap seeds at all.

The grid (what makes it exact or nearly so):

- **Lattice values** (0/1 scores such as Pass@32 or Maj@K, Pass@1 over m samples: multiples of
  1/m, and their paired differences): every draw is an integer multiple of
  ``1 / (T lcm_t(n_t m_t))``; that spacing is the grid, so the distribution is *exact* (to the
  FFT's rounding, ~1e-15 per grid point).
- **Other values** (the unbiased Pass@K for 1 < K < samples): ``h = GRID`` = 1e-5 (0.001 pp) with
  linear binning: a value's mass is split between its two neighbouring grid points so that every
  draw keeps its mean exactly; the only change is a variance added per draw of at most h^2/4,
  which moved no 95 % endpoint of the demo by more than 0.0005 pp against a 10x finer grid
  (``scripts/interval_stability.py``; the tests compare with h = 1e-6).

The FFT is circular: the grid window is centred on the mean and is wide enough that Hoeffding's
bound on the mass outside it is below 1e-16 (:func:`_half_width`), so nothing wraps around.

Where this is not used: a task with a missing value (NaN) makes a replicate's mean a ratio (the
drawn known values over their count), which is not a sum of independent draws; those intervals
keep the Monte Carlo bootstrap at the report's resample count (:mod:`esreason.report.resample`).
"""

from __future__ import annotations

import math
from typing import Mapping

import numpy as np

#: Grid spacing (fraction: 1e-5 = 0.001 pp) for values that lie on no small lattice.
GRID = 1e-5
#: The largest denominator m tried when looking for a lattice 1/m under a task's values.
MAX_DENOMINATOR = 1024
#: A lattice finer than this is treated as no lattice (binned at ``GRID``; the continuity
#: correction at that spacing is below 1e-4 pp).
FINEST_LATTICE = 1e-6
#: Mass outside the circular window allowed by the tail bound (so nothing measurable wraps around).
TAIL = 1e-16
#: Grid points with less mass than this (FFT rounding is ~1e-15) are not atoms of the distribution.
ATOM = 1e-13


def lattice_denominator(x: np.ndarray, max_m: int = MAX_DENOMINATOR) -> int | None:
    """The smallest m <= ``max_m`` with every ``x * m`` an integer (to 1e-9), else None."""
    for m in range(1, max_m + 1):
        y = x * m
        if np.all(np.abs(y - np.rint(y)) < 1e-9):
            return m
    return None


def _spacing(per_task: Mapping[str, np.ndarray]) -> tuple[float, bool]:
    """(grid spacing h in units of the task average, whether every draw sits exactly on it)."""
    t = len(per_task)
    lcm = 1
    for x in per_task.values():
        m = lattice_denominator(x)
        if m is None:
            return GRID, False
        lcm = math.lcm(lcm, x.size * m)
    h = 1.0 / (t * lcm)
    return (h, True) if h >= FINEST_LATTICE else (GRID, False)


def _half_width(per_task: Mapping[str, np.ndarray], h: float) -> int:
    """Grid points either side of the centre that hold all but ``TAIL`` of the mass.

    Hoeffding: a sum of independent draws, draw i ranging over c_i, leaves its mean by more than s
    with probability at most 2 exp(-2 s^2 / sum c_i^2). Each task's draws are centred on an
    integer shift of their mean (at most half a grid point off), which adds n_t / 2; binning adds
    one grid point to each draw's range.
    """
    t = len(per_task)
    sum_c2 = 0.0
    drift = 0.0
    for x in per_task.values():
        c = (float(x.max() - x.min())) / (x.size * t * h) + 1.0
        sum_c2 += x.size * c * c
        drift += x.size / 2
    s = math.sqrt(sum_c2 * math.log(2.0 / TAIL) / 2.0)
    return int(math.ceil(s + drift)) + 2


def exact_distribution(per_task: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray] | None:
    """The problem bootstrap's distribution of the equal-weight task average of ``per_task``.

    per_task: ``{task: values [n_t]}`` (float, no NaN, n_t >= 1). Returns the atoms (sorted task
    averages, float64 [k]) and their masses (float64 [k], summing to 1); None when a task is empty
    or holds a NaN (the caller then resamples).
    """
    if not per_task:
        return None
    xs = {k: np.asarray(v, dtype=np.float64).ravel() for k, v in per_task.items()}
    if any(x.size == 0 or np.isnan(x).any() for x in xs.values()):
        return None
    t = len(xs)
    h, exact = _spacing(xs)
    half = _half_width(xs, h)
    width = 1 << int(math.ceil(math.log2(2 * half + 1)))
    spectrum = np.ones(width // 2 + 1, dtype=np.complex128)
    shift = 0  # sum over tasks of n_t * (the integer centre of a draw), in grid points
    for x in xs.values():
        n = x.size
        v = x / (n * t * h)  # one draw's contribution to the average, in grid points [n]
        centre = int(np.rint(v.mean()))
        v = v - centre
        shift += n * centre
        one = np.zeros(width)  # one draw's distribution on the circular grid [width]
        if exact:
            np.add.at(one, np.rint(v).astype(np.int64) % width, 1.0 / n)
        else:
            lo = np.floor(v)
            w = v - lo  # linear binning: mass w at lo + 1, 1 - w at lo (keeps the draw's mean)
            np.add.at(one, lo.astype(np.int64) % width, (1.0 - w) / n)
            np.add.at(one, (lo.astype(np.int64) + 1) % width, w / n)
        spectrum *= np.fft.rfft(one) ** n
    mass = np.fft.irfft(spectrum, width)  # [width]: index j holds offset j (mod width) from the centre
    offsets = np.arange(width)
    offsets[offsets > width // 2] -= width
    order = np.argsort(offsets)
    offsets, mass = offsets[order], mass[order]
    keep = mass > ATOM
    mass = mass[keep]
    atoms = (shift + offsets[keep]) * h
    return atoms, mass / mass.sum()
