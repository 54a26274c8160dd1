"""The calibration's steadiness check: medians, their spread, and a bound.

Every per-repetition constant of a calibrated plan (seconds per update of each trained kind, per
periodic held-out evaluation, per checkpoint, per evaluation call of each task) is the *median* of
several samples taken in the calibration run, so one stalled update or one slow first call does
not set it. Its *spread* is ``(max - min) / median`` over those samples: 0 for a machine that did
the same work in the same time every time. On a small machine shared with other processes (2 cores
beside the calibration) single samples of the same work differed by 3-10x, and a plan built from
them missed the run by 3-4x; the spread makes that visible, and :func:`check` refuses to
print a plan whose material constants spread more than a bound.

Deviation from a statistician's choice: with 3-5 samples an IQR is no better estimated than the
range, and the range is the conservative reading (one sample far off is reported).
"""

from __future__ import annotations

import statistics
from typing import Any, Sequence

from esreason.errors import UserError

MAX_SPREAD = 0.5
"""Default bound on a constant's ``(max - min) / median`` (``esreason experiment plan --calibrate
--max-spread X``). Half the median: wider than the work's own update-to-update variation (the
demo's ES updates generate 19.3-20.6 k tokens, 7 %; on an idle machine the demo's per-stage times
land within 0.87-1.14 of the plan, docs/measurements.md), narrower than the 3-10x stalls of a machine
shared with other processes, where a plan cannot hold."""

MATERIAL_SHARE = 0.05
"""A constant is checked only when the plan terms it prices make up at least this share of the
planned total: a noisy constant of 1 % of the plan (the demo's verification per problem, its
0.1 s checkpoint) cannot move the total by more than 1 %."""


def median(samples: Sequence[float]) -> float:
    """The median of ``samples`` (0.0 for none: a term the run does not have, e.g. ``eval.every: 0``)."""
    return float(statistics.median(samples)) if samples else 0.0


def spread(samples: Sequence[float]) -> float | None:
    """``(max - min) / median``, or None with fewer than 2 samples or a median of 0 (nothing to compare)."""
    if len(samples) < 2:
        return None
    mid = statistics.median(samples)
    return None if mid <= 0 else (max(samples) - min(samples)) / mid


def describe(samples: Sequence[float]) -> dict[str, Any]:
    """One constant for the plan JSON: its median, range, number of samples and spread."""
    s = spread(samples)
    sig = lambda x: float(f"{x:.4g}")  # noqa: E731  four significant digits: seconds per token are ~1e-4
    return {"median": sig(median(samples)), "min": sig(min(samples)) if samples else None,
            "max": sig(max(samples)) if samples else None, "n": len(samples),
            "spread": None if s is None else round(s, 3)}


def check(constants: dict[str, Sequence[float]], used_s: dict[str, float], total_s: float,
          bound: float = MAX_SPREAD) -> list[str]:
    """Refuse (UserError) a plan whose material constants spread more than ``bound``.

    constants: samples per constant name (``es.decode``, ``eval.call.demo-add``, ...).
    used_s: seconds of the plan each constant prices (constants absent here are not material).
    Returns the names of the constants that were checked."""
    if not bound > 0:
        raise UserError(f"--max-spread: expected a number > 0, got {bound!r}")
    checked, bad = [], []
    for name, samples in constants.items():
        if total_s <= 0 or used_s.get(name, 0.0) < MATERIAL_SHARE * total_s:
            continue
        s = spread(samples)
        if s is None:
            continue
        checked.append(name)
        if s > bound:
            bad.append(f"{name} varies by {s:.2f} ({len(samples)} samples, {min(samples):.3g}-{max(samples):.3g} s, "
                       f"median {median(samples):.3g} s; {100 * used_s[name] / total_s:.0f} % of the plan)")
    if bad:
        raise UserError(f"calibration not steady: {'; '.join(bad)}; the bound is {bound:g} ((max - min) / median, "
                        "--max-spread). The machine did the same work at different speeds (other processes on "
                        "its cores?): rerun the calibration on an idle machine, or pass --max-spread to accept a "
                        "plan built from these medians")
    return checked


#: Bootstrap draws of :func:`interval` (fixed seed: the same samples give the same interval).
DRAWS = 2000


def interval(constants: dict[str, Sequence[float]], used_s: dict[str, float], total_s: float,
             level: float = 0.9) -> dict[str, Any]:
    """The calibration's own spread, carried to the plan's total: every bootstrap draw resamples each
    constant's samples (with replacement), takes their median, and scales the seconds that constant
    prices by it over the median used; the total's ``level`` interval over the draws. A constant with
    one sample, or that prices nothing, is held fixed. ``half_width``: half the interval over the total."""
    import numpy as np

    rng = np.random.Generator(np.random.PCG64(0))
    draws = np.full(DRAWS, float(total_s))
    for name, samples in constants.items():
        mid, seconds = median(samples), used_s.get(name, 0.0)
        if len(samples) < 2 or mid <= 0 or seconds <= 0:
            continue
        values = np.asarray(samples, dtype=np.float64)
        resampled = np.median(values[rng.integers(0, len(values), size=(DRAWS, len(values)))], axis=1)
        draws += seconds * (resampled / mid - 1.0)
    low, high = (float(np.quantile(draws, q)) for q in ((1 - level) / 2, (1 + level) / 2))
    return {"level": level, "low_s": round(low, 1), "high_s": round(high, 1),
            "half_width": round((high - low) / 2 / total_s, 4) if total_s > 0 else None}


__all__ = ["DRAWS", "MATERIAL_SHARE", "MAX_SPREAD", "check", "describe", "interval", "median", "spread"]
