"""Verdicts that mean what they say: one word per paper claim, decided by an interval.

The report's own verdicts are decided after Holm's correction over the family of claims
(:mod:`esreason.report.family`); the rules below are the *uncorrected* reading of one interval,
used for descriptions (each training seed alone, each (task, K) of the below-base count) and
as the building block of the family's tests. ``borderline`` (:data:`BORDERLINE`) is a "holds"
whose interval end lies within the bootstrap's stated stability (0.05 pp) of 0.

A claim "X > Y" (or "X < Y") is checked on the difference d = X - Y with its 95 %
paired-bootstrap interval [low, high] (:func:`esreason.report.stats.paired_difference`).
With ``direction = +1`` for a claimed increase and ``-1`` for a claimed decrease, and
d, low, high multiplied by ``direction`` so that the claim reads "d > 0":

===============================  ===============================================
verdict                          rule (on the direction-adjusted numbers)
===============================  ===============================================
``holds``                        low > 0 (the interval excludes 0 in the claimed direction)
``contradicted``                 high < 0 (the interval excludes 0 the other way)
``not significant (point         the interval contains 0 (or there is none) and d > 0
estimate in the claimed
direction)``
``inconclusive``                 the interval contains 0 (or there is none) and d <= 0
``not tested``                   a method or number is missing
===============================  ===============================================

Boundaries: an interval end exactly at 0 does not exclude 0 (low == 0 is not "holds",
high == 0 is not "contradicted"); a point estimate of exactly 0 does not agree with
either direction. Without an interval nothing can be significant, so a claim is at best "not
significant (point estimate in the claimed direction)" — the verdict never rounds a point
estimate up to "holds", and the words cannot be read as support.

A claim made of several parts (the paper's held-out change: ES up *and* GRPO down) is
combined by :func:`combine`: contradicted if any part is, holds only if every part
does, agrees if every part at least agrees, else inconclusive.
"""

from __future__ import annotations

HOLDS = "holds"
BORDERLINE = "borderline"
AGREES = "not significant (point estimate in the claimed direction)"
INCONCLUSIVE = "inconclusive"
CONTRADICTED = "contradicted"
NOT_TESTED = "not tested"
VERDICTS = (HOLDS, BORDERLINE, AGREES, INCONCLUSIVE, CONTRADICTED, NOT_TESTED)


def interval_verdict(value: float | None, low: float | None, high: float | None, direction: int = 1) -> str:
    """The verdict on the claim ``direction * value > 0`` given its interval [low, high].

    value: point estimate of the difference (None: not tested). low/high: the interval
    ends (None: no interval). direction: +1 (claimed increase) or -1 (claimed decrease).
    """
    if direction not in (1, -1):
        raise ValueError(f"direction must be +1 or -1, got {direction!r}")
    if value is None:
        return NOT_TESTED
    v = direction * value
    if low is not None and high is not None:
        lo, hi = sorted((direction * low, direction * high))
        if lo > 0:
            return HOLDS
        if hi < 0:
            return CONTRADICTED
    return AGREES if v > 0 else INCONCLUSIVE


def point_verdict(agrees: bool | None) -> str:
    """The verdict on a claim that has no interval: at best :data:`AGREES` (not significant)."""
    if agrees is None:
        return NOT_TESTED
    return AGREES if agrees else INCONCLUSIVE


def combine(parts: list[str]) -> str:
    """The verdict of a conjunction of claims (see the module docstring)."""
    if not parts or NOT_TESTED in parts:
        return NOT_TESTED
    if CONTRADICTED in parts:
        return CONTRADICTED
    if all(p == HOLDS for p in parts):
        return HOLDS
    if all(p in (HOLDS, AGREES) for p in parts):
        return AGREES
    return INCONCLUSIVE
