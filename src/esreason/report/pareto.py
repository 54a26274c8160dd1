"""Pass@1 - Pass@K Pareto fronts (paper Figure ``fig:rq1-deepseek-math-pareto``).

Each panel (a task, or the Average over all tasks of the Pass@K table) places every
method at (Pass@1, Pass@K); higher is better on both axes. The *reference front* is
formed by Base, GRPO and ES; the *full front* adds every other method (the sequential
compositions ES->GRPO and GRPO->ES, extra checkpoints).

Dominance (our choice, the paper does not define it): standard Pareto dominance on the
unrounded values -- a dominates b when a is at least as good on both axes and strictly
better on at least one (sometimes called *weak* dominance, as opposed to *strict*
dominance, which would require strictly better on both). Consequences: two methods at
the same point do not dominate each other and are both on the front; a method that only
matches another on one axis and loses on the other is dominated.

A method trained with several seeds sits at its mean over seeds (the fronts use those
points); its per-seed points are kept in ``seed_points`` and drawn around it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from esreason.report.load import REFERENCE_ROLES, Experiment, evaluated
from esreason.report.seeds import seed_value
from esreason.report.stats import average
from esreason.report.tables import AVERAGE_GROUP, table_tasks

Point = tuple[float, float]


def dominates(a: Point, b: Point) -> bool:
    """a Pareto-dominates b: >= on both axes and > on at least one."""
    return a[0] >= b[0] and a[1] >= b[1] and (a[0] > b[0] or a[1] > b[1])


def front(points: Mapping[str, Point]) -> list[str]:
    """Keys of the non-dominated points, ordered by Pass@1 (x) ascending, then y descending."""
    keep = [k for k, p in points.items() if not any(dominates(q, p) for j, q in points.items() if j != k)]
    return sorted(keep, key=lambda k: (points[k][0], -points[k][1]))


@dataclass
class ParetoPanel:
    """One panel: every method's point, both fronts, and who dominates whom (full set).

    added: methods outside Base/GRPO/ES on the full front at a point no reference method has.
    """

    key: str
    label: str
    k: int
    points: dict[str, Point]
    reference_front: list[str]
    full_front: list[str]
    dominated_by: dict[str, list[str]]
    added: list[str]
    seed_points: dict[str, list[Point]] = field(default_factory=dict)
    """Per training seed, the points of methods trained with several seeds (the spread behind
    their mean point; drawn, not used for the fronts)."""

    def as_dict(self) -> dict[str, Any]:
        return {"key": self.key, "label": self.label, "k": self.k,
                "points": {m: {"pass@1": x, f"pass@{self.k}": y} for m, (x, y) in self.points.items()},
                "reference_front": self.reference_front, "full_front": self.full_front,
                "dominated_by": self.dominated_by, "added_by_others": self.added,
                "seed_points": {m: [{"pass@1": x, f"pass@{self.k}": y} for x, y in pts]
                                for m, pts in self.seed_points.items()}}


def panel(key: str, label: str, k: int, points: Mapping[str, Point], roles: Mapping[str, str | None]) -> ParetoPanel:
    """Fronts of one panel from ``{method: (pass@1, pass@K)}`` and each method's role."""
    pts = dict(points)
    ref = {m: p for m, p in pts.items() if roles.get(m) in REFERENCE_ROLES}
    full = front(pts)
    dom = {m: [j for j, q in pts.items() if j != m and dominates(q, p)] for m, p in pts.items()}
    # a point "added" by a composition is a new trade-off: on the full front and not a reference point
    added = [m for m in full if roles.get(m) not in REFERENCE_ROLES and pts[m] not in ref.values()]
    return ParetoPanel(key, label, k, pts, front(ref), full, {m: d for m, d in dom.items() if d}, added)


def pareto_panels(exp: Experiment, k: int | None = None) -> tuple[list[ParetoPanel], list[str]]:
    """One panel per task of the tables plus the Average; (panels, notes).

    k: the Pass@K axis (default: the largest protocol K). Methods missing either number
    on a panel are left off it.
    """
    notes: list[str] = []
    k = max(exp.ks) if k is None else k
    methods = evaluated(exp)
    tasks, _ = table_tasks(exp, methods)
    roles = {m: exp.methods[m].role for m in methods}
    panels = []
    for key in tasks + [AVERAGE_GROUP]:
        pts: dict[str, Point] = {}
        for m in methods:
            if key == AVERAGE_GROUP:
                x, y = average(exp, m, tasks, "pass@1"), average(exp, m, tasks, f"pass@{k}")
            else:
                x, y = exp.cell(m, key, "pass@1"), exp.cell(m, key, f"pass@{k}")
            if x is None or y is None:
                notes.append(f"Pareto {key if key != AVERAGE_GROUP else 'Average'}: {exp.label(m)} lacks "
                             f"pass@1 or pass@{k}; left off")
                continue
            pts[m] = (x.value, y.value)  # type: ignore[assignment]
        if len(pts) >= 2:
            p = panel(key, "Average" if key == AVERAGE_GROUP else key, k, pts, roles)
            group = tasks if key == AVERAGE_GROUP else [key]
            for m in pts:
                seeds = [(seed_value(exp, m, s, group, "pass@1"), seed_value(exp, m, s, group, f"pass@{k}"))
                         for s in exp.seed_keys(m)]
                if seeds and all(x is not None and y is not None for x, y in seeds):
                    p.seed_points[m] = seeds  # type: ignore[assignment]
            panels.append(p)
    return panels, notes

