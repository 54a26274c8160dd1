"""The report's problem bootstrap: one resample count, drawn in chunks as count matrices.

Every percentile interval the report computes (a single training seed, or Base alone) resamples
problems with replacement within each task, ``RESAMPLES`` times. A replicate is a row of draw
counts ``v [n]`` (how often each problem was drawn), so a replicate mean is ``v @ x / v @ 1``: a
matrix-vector product, not a gather of ``R x n`` values. The counts are drawn in chunks of
``CHUNK`` replicates, each chunk from its own stream ``(seed, task, n, chunk)``, and kept as
uint8 (a count above 255 among n >= 2 problems is not drawn in practice; it is checked), so
50,000 replicates of 256 problems take 12.8 MB per task and a report stays at a few seconds.

Why 50,000 (``RESAMPLES``): the Monte Carlo error of a 2.5 % percentile endpoint is about
2.7 sd / sqrt(R) (sd: the replicates' spread). Endpoints are read off a continuity-corrected
CDF (:func:`smoothed_cdf`): 0/1 scores put a task's replicate means on a lattice, and a plain
percentile jumps whole lattice steps (0.39 pp at 256 problems) between bootstrap seeds at any
resample count. Measured on the demo (docs/report.md, "Stable endpoints",
``scripts/interval_stability.py``), see ``STABILITY_MEASURED``: the task-averaged differences behind
the verdicts move by at most 0.03 pp; the per-task cells (descriptions) by up to 0.12 pp, which
would take about 300,000 resamples (the movement falls as 1/sqrt(R)). rliable uses 50,000.
"""

from __future__ import annotations

import zlib
from functools import lru_cache

import numpy as np

#: The report's one resample count (percentile intervals, probability of improvement).
RESAMPLES = 50_000
#: Replicates per drawn chunk.
CHUNK = 5_000
#: The largest endpoint movement between bootstrap seeds at ``RESAMPLES`` that the report states for
#: the intervals behind its verdicts, task-averaged differences (fraction: 0.0005 = 0.05 pp; measured
#: 0.029 pp over 10 bootstrap seeds on the demo); a "holds" whose endpoint is closer than this to 0 is
#: borderline. Wider, descriptive intervals move more: see :data:`STABILITY_MEASURED`.
STABILITY = 0.0005
#: Measured on the demo (``scripts/interval_stability.py runs/demo3 --boot-seeds 10``, Base and GRPO
#: seed 0, pass@1/16/32, 2026-11-26): the largest range of an endpoint over 10 bootstrap seeds at
#: 50,000 resamples, in pp, per kind of interval (at 1,000 resamples: 0.26 / 0.57 / 0.44 / 1.07).
STABILITY_MEASURED = {"difference, task average": 0.029, "difference, one task": 0.090,
                      "level, task average": 0.081, "level, one task": 0.121}


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


def smoothed_cdf(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The replicates' CDF with every distinct value's mass spread evenly between the midpoints to its
    neighbours (a continuity correction), as knots ``(x [k+1], F [k+1])`` of a piecewise-linear CDF.

    Replicate means of 0/1 scores (Pass@32 on one task) lie on a lattice of spacing 1/n (0.39 pp at
    n = 256); the plain percentile then jumps a whole lattice step when Monte Carlo noise moves the
    2.5 % point across an atom, whatever the resample count. Spread over its lattice cell, an atom's
    mass moves the endpoint continuously, by (CDF noise) / density. For replicates that are all
    distinct this is the plain percentile to within half a gap between neighbouring replicates.
    """
    u, counts = np.unique(values, return_counts=True)
    cum = np.cumsum(counts) / values.size
    if u.size == 1:
        return np.array([u[0], u[0]]), np.array([0.0, 1.0])
    mids = (u[1:] + u[:-1]) / 2
    xs = np.concatenate([[u[0] - (u[1] - u[0]) / 2], mids, [u[-1] + (u[-1] - u[-2]) / 2]])
    return xs, np.concatenate([[0.0], cum])


def percentile(values: np.ndarray, level: float) -> tuple[float | None, float | None]:
    """The equal-tailed percentile interval of the replicates (NaN replicates left out), read off
    :func:`smoothed_cdf`."""
    values = values[~np.isnan(values)]
    if values.size == 0:
        return None, None
    xs, ps = smoothed_cdf(values)
    lo, hi = np.interp([(1 - level) / 2, (1 + level) / 2], ps, xs)
    return float(lo), float(hi)


def percentile_p(values: np.ndarray) -> float | None:
    """Two-sided p-value of "mean 0" read off the replicates: 2 min(F(0), 1 - F(0)) with F the
    :func:`smoothed_cdf`, the level at which :func:`percentile`'s interval starts to contain 0."""
    values = values[~np.isnan(values)]
    if values.size == 0:
        return None
    xs, ps = smoothed_cdf(values)
    f0 = float(np.interp(0.0, xs, ps))
    return float(min(1.0, 2.0 * min(f0, 1.0 - f0)))
