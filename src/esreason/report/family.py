"""The family of claims a report checks, and Holm's correction over it.

Family. Every paper claim that the report tests with an interval is one member: ES improves
average Pass@1 over Base; ES improves average Pass@K (all large K together); GRPO has the larger
average Pass@1; ES has the larger average Pass@K (all large K together); GRPO falls below Base
at every large K on most tasks; the held-out Pass@K change is positive under ES and negative
under GRPO; and, with several training seeds, held-out entropy falls more under GRPO. Claims
without an interval (the Pareto front; entropy with one seed) are descriptions outside the
family. The per-(task, K) comparisons, the per-seed verdicts and P(improvement) are
descriptions too (uncorrected).

Error rate. Holm's step-down procedure (Holm 1979) controls the family-wise error rate — the
chance of declaring any claim "holds" or "contradicted" when it is false — at ``ALPHA`` = 0.05.
With m members sorted by p-value, p_(1) <= ... <= p_(m), the adjusted p-value is
``max_{j <= i} min(1, (m - j + 1) p_(j))`` and a claim is significant when it is <= 0.05.

One p-value per claim (``ClaimTest``): a claim is a conjunction of parts, grouped.

- One group (a claim with two views, Pass@16 and Pass@32, or two parts, ES up and GRPO down):
  it holds only if every part holds, so its p-value is the largest of the parts' (the
  intersection–union test: two views give one confirmation, never two). It is contradicted if
  any part is contradicted: Bonferroni over the parts whose point estimate opposes the claim.
- k of T groups ("on most tasks": k = floor(T/2) + 1 of T tasks, each at every large K): each
  task's p-value is its parts' largest; the claim's is ``min(1, (T - k + 1) p_[k])`` with p_[k]
  the k-th smallest (if only k - 1 tasks were truly below, one of any k rejected tasks is a
  true null, and there are at most T - k + 1 of them).

A part's p-value is two-sided and matches its interval (:meth:`Estimate.p_value`): the interval
at level 1 - p just touches 0. Borderline: a claim that holds after Holm whose interval end at
its Holm level (alpha / (m - rank + 1); with k of T, divided by T - k + 1 again) is closer to 0
than the bootstrap's stated stability (:data:`esreason.report.resample.STABILITY`, 0.05 pp).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from esreason.report.components import Estimate
from esreason.report.resample import STABILITY
from esreason.report.verdicts import AGREES, BORDERLINE, CONTRADICTED, HOLDS, INCONCLUSIVE

ALPHA = 0.05
CORRECTION = "Holm step-down over the family (family-wise error rate 0.05)"


@dataclass(frozen=True)
class Part:
    """One view or part of a claim: an estimate and the claimed sign (+1 increase, -1 decrease)."""

    estimate: Estimate
    direction: int

    @property
    def agrees(self) -> bool:
        return self.direction * self.estimate.value > 0

    @property
    def opposes(self) -> bool:
        return self.direction * self.estimate.value < 0

    def margin(self, alpha: float) -> float:
        """The direction-adjusted interval end nearest 0 at level 1 - alpha (> 0: excludes 0 in the claimed
        direction); -inf without an interval."""
        lo, hi = self.estimate.interval(1 - alpha)
        if lo is None or hi is None:
            return float("-inf")
        return lo if self.direction > 0 else -hi


@dataclass
class ClaimTest:
    """The test behind one family member: groups of parts, of which ``need`` groups must hold."""

    groups: list[list[Part]]
    need: int = 1
    case: str = field(init=False, default="none")
    """``"for"`` (the p-value tests the claim), ``"against"`` (tests its contradiction) or ``"none"``."""
    p: float = field(init=False, default=1.0)

    def __post_init__(self) -> None:
        ps = {id(pt): pt.estimate.p_value() for g in self.groups for pt in g}
        if any(v is None for v in ps.values()):
            raise ValueError("every part of a claim test needs an interval")
        t = len(self.groups)
        if t == 1 and self.need == 1:
            parts = self.groups[0]
            if all(pt.agrees for pt in parts):
                self.case, self.p = "for", max(ps[id(pt)] for pt in parts)  # type: ignore[type-var]
            elif any(pt.opposes for pt in parts):
                against = [ps[id(pt)] for pt in parts if pt.opposes]
                self.case, self.p = "against", min(1.0, len(against) * min(against))  # type: ignore[type-var]
            return
        fac = t - self.need + 1
        p_for = sorted(max(ps[id(pt)] for pt in g) if all(pt.agrees for pt in g) else 1.0 for g in self.groups)
        p_against = sorted(max(ps[id(pt)] for pt in g) if all(pt.opposes for pt in g) else 1.0
                           for g in self.groups)
        if sum(all(pt.agrees for pt in g) for g in self.groups) >= self.need:
            self.case, self.p = "for", min(1.0, fac * p_for[self.need - 1])  # type: ignore[operator]
        elif sum(all(pt.opposes for pt in g) for g in self.groups) >= self.need:
            self.case, self.p = "against", min(1.0, fac * p_against[self.need - 1])  # type: ignore[operator]

    def margin(self, alpha: float) -> float:
        """The claim's interval end nearest 0 at the level its test uses for ``alpha`` (module docstring)."""
        if len(self.groups) == 1 and self.need == 1:
            return min(pt.margin(alpha) for pt in self.groups[0])
        a = alpha / (len(self.groups) - self.need + 1)
        per_group = sorted((min(pt.margin(a) for pt in g) for g in self.groups), reverse=True)
        return per_group[self.need - 1]

    @property
    def point_agrees(self) -> bool:
        """The point estimates read in the claimed direction (every part; k of T groups)."""
        return sum(all(pt.agrees for pt in g) for g in self.groups) >= self.need


@dataclass(frozen=True)
class Decision:
    """A family member's verdict after the correction, with the numbers behind it."""

    verdict: str
    p: float
    p_holm: float
    rank: int
    family_size: int
    level: float
    margin: float | None

    def as_dict(self) -> dict[str, Any]:
        return {"p": self.p, "p_holm": self.p_holm, "rank": self.rank, "family_size": self.family_size,
                "holm_alpha": self.level, "margin_at_holm_level": self.margin, "correction": CORRECTION}


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm-adjusted p-values, in the input order."""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    out = [1.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        out[i] = running
    return out


def decide(tests: Sequence[ClaimTest], alpha: float = ALPHA, stability: float = STABILITY) -> list[Decision]:
    """The verdict of every member of the family ``tests`` after Holm (module docstring)."""
    m = len(tests)
    ps = [t.p for t in tests]
    adjusted = holm(ps)
    order = sorted(range(m), key=lambda i: ps[i])
    out: list[Decision | None] = [None] * m
    for rank, i in enumerate(order, start=1):
        t = tests[i]
        level = alpha / (m - rank + 1)
        margin = None
        if adjusted[i] <= alpha and t.case == "for":
            margin = t.margin(level)
            verdict = HOLDS if margin >= stability else BORDERLINE
        elif adjusted[i] <= alpha and t.case == "against":
            verdict = CONTRADICTED
        else:
            verdict = AGREES if t.point_agrees else INCONCLUSIVE
        out[i] = Decision(verdict, ps[i], adjusted[i], rank, m, level, margin)
    return out  # type: ignore[return-value]
