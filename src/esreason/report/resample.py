"""The report's Monte Carlo problem bootstrap: one resample count, drawn in chunks as count matrices.

The report reads its one-seed percentile intervals off the bootstrap's *exact*
distribution (:mod:`esreason.report.exact`: the limit of infinitely many resamples, computed by
convolution), so their endpoints do not move between bootstrap seeds at all. This module draws
replicates where that is not possible: a task with a missing value (the replicate mean is then a
ratio), and the two-level bootstrap of the probability of improvement with several seeds
(:mod:`esreason.report.hierarchical`). It also holds the continuity-corrected CDF both paths read
their endpoints from (:func:`cdf_knots`).

Every such interval resamples problems with replacement within each task, ``RESAMPLES`` times. A
replicate is a row of draw counts ``v [n]`` (how often each problem was drawn), so a replicate mean
is ``v @ x / v @ 1``: a matrix-vector product, not a gather of ``R x n`` values. The counts are
drawn in chunks of ``CHUNK`` replicates, each chunk from its own stream ``(seed, task, n, chunk)``,
and kept as uint8 (a count above 255 among n >= 2 problems is not drawn in practice; it is
checked), so 50,000 replicates of 256 problems take 12.8 MB per task.

Why 50,000 (``RESAMPLES``, rliable's count): the Monte Carlo error of a 2.5 % percentile endpoint
is about 2.7 sd / sqrt(R) (sd: the replicates' spread). Measured on the demo
(``scripts/interval_stability.py``, :data:`STABILITY_MEASURED`), endpoints resampled 50,000 times
move between bootstrap seeds by up to 0.05 pp (task-averaged differences) and 0.14 pp (one task's
level); the exact path moves by 0.
"""

from __future__ import annotations

import zlib
from functools import lru_cache

import numpy as np

#: The report's one resample count (percentile intervals, probability of improvement).
RESAMPLES = 50_000
#: Replicates per drawn chunk.
CHUNK = 5_000
#: The endpoint stability the report states (fraction: 0.0005 = 0.05 pp): the largest movement of a
#: printed percentile endpoint between bootstrap seeds. The exact path (every interval without a
#: missing value) moves by 0 and its grid error is below 0.001 pp; a resampled one (a missing value)
#: by up to :data:`STABILITY_MEASURED` at ``RESAMPLES``. A "holds" whose endpoint is closer than
#: this to 0 is borderline.
STABILITY = 0.0005
#: Measured on the demo (``scripts/interval_stability.py runs/demo --boot-seeds 10``, every
#: evaluation, pass@1/16/32, 2026-11-27): the largest range of an endpoint over 10 bootstrap seeds,
#: in pp, per kind of interval: the report's path (exact) and the 50,000-resample Monte Carlo
#: bootstrap it keeps for missing values.
STABILITY_MEASURED = {
    "exact": {"difference, task average": 0.0, "difference, one task": 0.0,
              "level, task average": 0.0, "level, one task": 0.0},
    "resampled": {"difference, task average": 0.046, "difference, one task": 0.090,
                  "level, task average": 0.081, "level, one task": 0.141},
}
#: Measured with it: the largest endpoint change when the exact path's grid is refined 10x (pp;
#: measured 0.00043 over the demo's 216 endpoints).
GRID_ERROR_MEASURED = 0.0005


def _chunk_counts(seed: int, task: str, n: int, chunk: int, size: int) -> np.ndarray:
    rng = np.random.default_rng(np.random.SeedSequence([seed % 2**63, zlib.crc32(task.encode()), n, chunk]))
    idx = rng.integers(0, n, size=(size, n))
    flat = (idx + n * np.arange(size)[:, None]).ravel()
    counts = np.bincount(flat, minlength=size * n).reshape(size, n)
    if counts.max() > 255:  # pragma: no cover - needs n == 1 with > 255 ... never at n >= 2 in practice
        raise OverflowError("a problem was drawn more than 255 times in one replicate")
    return counts.astype(np.uint8)


@lru_cache(maxsize=16)
def problem_counts(seed: int, task: str, n: int, resamples: int = RESAMPLES) -> np.ndarray:
    """Draw counts [resamples, n] (uint8, read-only), deterministic in (seed, task, n); the first
    R rows of a larger count are the same draws, so more resamples only add replicates."""
    chunks = [_chunk_counts(seed, task, n, c, min(CHUNK, resamples - c * CHUNK))
              for c in range(-(-resamples // CHUNK))]
    out = np.concatenate(chunks) if chunks else np.zeros((0, n), np.uint8)
    out.setflags(write=False)
    return out


@lru_cache(maxsize=4)
def _float_counts(seed: int, task: str, n: int, resamples: int) -> np.ndarray:
    """:func:`problem_counts` as float32 (51 MB at 50,000 x 256), for one matrix product per column."""
    out = problem_counts(seed, task, n, resamples).astype(np.float32)
    out.setflags(write=False)
    return out


def replicate_means(x: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Replicate means [R] of the values ``x [n]`` (NaN: no value, left out) under ``counts [R, n]``:
    matrix-vector products (float32 products of counts <= 255 and values in [0, 1] are exact to
    ~1e-7, far below the stated stability). Without NaN every replicate draws n values, so the
    denominator is n and one product does."""
    counts_f = counts if counts.dtype != np.uint8 else counts.astype(np.float32)
    known = ~np.isnan(x)
    if known.all():
        return (counts_f @ x.astype(counts_f.dtype)).astype(np.float64) / x.size
    num = (counts_f @ np.where(known, x, 0.0).astype(counts_f.dtype)).astype(np.float64)
    den = (counts_f @ known.astype(counts_f.dtype)).astype(np.float64)
    return np.divide(num, den, out=np.full(num.shape, np.nan), where=den > 0)


@lru_cache(maxsize=128)
def _task_replicates(seed: int, task: str, resamples: int, x_bytes: bytes) -> np.ndarray:
    x = np.frombuffer(x_bytes, dtype=np.float64)
    out = replicate_means(x, _float_counts(seed, task, x.size, resamples))
    out.setflags(write=False)
    return out


def task_average_replicates(per_task: dict[str, np.ndarray], resamples: int = RESAMPLES, seed: int = 0) -> np.ndarray:
    """Replicates [R] of the equal-weight mean over tasks of per-problem values (problems resampled
    within each task; NaN where a replicate has no value on some task). A task's replicates are
    cached by its values: the tables, averages and differences of a report reuse them."""
    total = np.zeros(resamples)
    for task, x in per_task.items():
        x = np.ascontiguousarray(x, dtype=np.float64)
        total += _task_replicates(seed, task, resamples, x.tobytes())
    return total / max(len(per_task), 1)


def cdf_knots(atoms: np.ndarray, mass: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The continuity-corrected CDF of a discrete distribution (sorted distinct ``atoms [k]`` with
    ``mass [k]`` summing to 1): every atom's mass spread evenly between the midpoints to its
    neighbours, as knots ``(x [k+1], F [k+1])`` of a piecewise-linear CDF.

    Replicate means of 0/1 scores (Pass@32 on one task) lie on a lattice of spacing 1/n (0.39 pp at
    n = 256); a plain percentile then jumps a whole lattice step when Monte Carlo noise moves the
    2.5 % point across an atom, whatever the resample count. Spread over its lattice cell, an atom's
    mass moves the endpoint continuously. For replicates that are all distinct this is the plain
    percentile to within half a gap between neighbouring replicates.
    """
    cum = np.cumsum(mass)
    cum = cum / cum[-1]
    if atoms.size == 1:
        return np.array([atoms[0], atoms[0]]), np.array([0.0, 1.0])
    mids = (atoms[1:] + atoms[:-1]) / 2
    xs = np.concatenate([[atoms[0] - (atoms[1] - atoms[0]) / 2], mids, [atoms[-1] + (atoms[-1] - atoms[-2]) / 2]])
    return xs, np.concatenate([[0.0], cum])


def smoothed_cdf(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`cdf_knots` of the replicates ``values [R]`` (each distinct value an atom)."""
    u, counts = np.unique(values, return_counts=True)
    return cdf_knots(u, counts / values.size)


def knots_interval(knots: tuple[np.ndarray, np.ndarray], level: float) -> tuple[float, float]:
    """The equal-tailed ``level`` interval read off CDF knots ``(x, F)``, clipped to the smallest and
    largest atom: the continuity correction spreads the end atoms half a lattice step outward, which
    with few problems put a Pass@K interval below 0 (4 problems: [-10.5, 76.2]); no replicate lies
    there, and a proportion cannot. Clipping only shortens an end that lay outside every replicate."""
    xs, ps = knots
    lo, hi = np.interp([(1 - level) / 2, (1 + level) / 2], ps, xs)
    first, last = (xs[0] + xs[1]) / 2, (xs[-2] + xs[-1]) / 2  # the end atoms (cdf_knots' half-steps undone)
    return float(min(max(lo, first), last)), float(max(min(hi, last), first))


def knots_p(knots: tuple[np.ndarray, np.ndarray]) -> float:
    """Two-sided p-value of "mean 0": 2 min(F(0), 1 - F(0)), the level at which
    :func:`knots_interval` starts to contain 0."""
    xs, ps = knots
    f0 = float(np.interp(0.0, xs, ps))
    return float(min(1.0, 2.0 * min(f0, 1.0 - f0)))


def percentile(values: np.ndarray, level: float) -> tuple[float | None, float | None]:
    """The equal-tailed percentile interval of the replicates (NaN replicates left out), read off
    :func:`smoothed_cdf`."""
    values = values[~np.isnan(values)]
    if values.size == 0:
        return None, None
    return knots_interval(smoothed_cdf(values), level)


def percentile_p(values: np.ndarray) -> float | None:
    """Two-sided p-value of "mean 0" read off the replicates (:func:`knots_p` of
    :func:`smoothed_cdf`)."""
    values = values[~np.isnan(values)]
    if values.size == 0:
        return None
    return knots_p(smoothed_cdf(values))
