"""The report's problem bootstrap: one resample count, drawn in chunks as count matrices.

Every percentile interval the report computes (a single training seed, or Base alone) resamples
problems with replacement within each task, ``RESAMPLES`` times. A replicate is a row of draw
counts ``v [n]`` (how often each problem was drawn), so a replicate mean is ``v @ x / v @ 1``: a
matrix-vector product, not a gather of ``R x n`` values. The counts are drawn in chunks of
``CHUNK`` replicates, each chunk from its own stream ``(seed, task, n, chunk)``, and kept as
uint8 (a count above 255 among n >= 2 problems is not drawn in practice; it is checked), so
50,000 replicates of 256 problems take 12.8 MB per task and a report stays at a few seconds.

Why 50,000 (``RESAMPLES``): the Monte Carlo error of a 2.5 % percentile endpoint is about
2.7 sd / sqrt(R) (sd: the replicates' spread). Measured on the demo (docs/report.md, "Stable
endpoints", ``scripts/interval_stability.py``): at 1,000 resamples the printed endpoints moved by
up to 0.13 pp between bootstrap seeds; at 50,000 by at most 0.03 pp, inside the 0.05 pp we
state (``STABILITY_PP``). rliable uses the same count.
"""

from __future__ import annotations

import zlib
from functools import lru_cache

import numpy as np

#: The report's one resample count (percentile intervals, probability of improvement).
RESAMPLES = 50_000
#: Replicates per drawn chunk.
CHUNK = 5_000
#: The largest endpoint movement between bootstrap seeds at ``RESAMPLES`` that the report states
#: (fraction: 0.0005 = 0.05 pp); a "holds" whose endpoint is closer than this to 0 is borderline.
STABILITY = 0.0005


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


def replicate_means(x: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Replicate means [R] of the values ``x [n]`` (NaN: no value, left out) under ``counts [R, n]``."""
    known = ~np.isnan(x)
    filled = np.where(known, x, 0.0)
    num = np.empty(counts.shape[0])
    den = np.empty(counts.shape[0])
    for lo in range(0, counts.shape[0], CHUNK):
        c = counts[lo:lo + CHUNK].astype(np.float64)
        num[lo:lo + CHUNK] = c @ filled
        den[lo:lo + CHUNK] = c @ known.astype(np.float64)
    return np.divide(num, den, out=np.full(num.shape, np.nan), where=den > 0)


def task_average_replicates(per_task: dict[str, np.ndarray], resamples: int = RESAMPLES, seed: int = 0) -> np.ndarray:
    """Replicates [R] of the equal-weight mean over tasks of per-problem values (problems resampled
    within each task; NaN where a replicate has no value on some task)."""
    total = np.zeros(resamples)
    for task, x in per_task.items():
        x = np.asarray(x, dtype=np.float64)
        total += replicate_means(x, problem_counts(seed, task, x.size, resamples))
    return total / max(len(per_task), 1)


def percentile(values: np.ndarray, level: float) -> tuple[float | None, float | None]:
    """The equal-tailed percentile interval of the replicates (NaN replicates left out)."""
    values = values[~np.isnan(values)]
    if values.size == 0:
        return None, None
    lo, hi = np.quantile(values, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def percentile_p(values: np.ndarray) -> float | None:
    """Two-sided p-value of "mean 0" read off the replicates: 2 min(P(r <= 0), P(r >= 0)), the
    level at which the percentile interval starts to contain 0 (so it agrees with the interval)."""
    values = values[~np.isnan(values)]
    if values.size == 0:
        return None
    return float(min(1.0, 2.0 * min(np.mean(values <= 0.0), np.mean(values >= 0.0))))
