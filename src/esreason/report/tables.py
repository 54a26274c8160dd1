"""The report's tables as data: cells with intervals plus the paper's emphasis marks.

- :func:`metric_table` ``"pass"``: the Pass@K table in the layout of the paper's Tables
  ``tab:rq1-instruct-final`` / ``tab:rq1-deepseek-math``: rows = methods, column groups =
  tasks (in-domain first, then held-out) and an Average over *all* tasks of the table,
  sub-columns @1, @K2, @K3 (the protocol's Ks).
- :func:`metric_table` ``"maj"``: the same layout for Maj@K (paper appendix
  ``app:majority-vote-results``), K > 1 only (Maj@1 is Pass@1).
- :func:`heldout_change_table`: post-training minus base, averaged equally over the
  held-out tasks only (paper Table ``tab:rq2-heldout-change``), with paired intervals.

Emphasis (the paper's captions): in each task cell the best of Base/GRPO/ES is
underlined; in the Average group the best of all methods is bold and the second best
is shaded. Our conventions where the paper is silent: values are compared at the
displayed precision (percent with one decimal), so numbers that print the same are
tied and ties are all marked; "second best" is the second-highest *distinct* displayed
value (dense ranking), so two methods tied for best are both bold and the next value
is shaded; marks need at least two candidates with a value and are left out when all
candidates tie (nothing stands out).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from esreason.report.load import REFERENCE_ROLES, Cell, Experiment, evaluated
from esreason.report.stats import average, paired_difference

AVERAGE_GROUP = "__average__"
DIGITS = 1  # decimals of the displayed percentages

CellKey = tuple[str, str, str]  # (method, group, metric)


@dataclass(frozen=True)
class Group:
    """A column group: a task (or the average) and its sub-columns ``(metric, header)``."""

    key: str
    label: str
    columns: tuple[tuple[str, str], ...]


@dataclass
class Table:
    """A methods-by-columns table of :class:`Cell` values (fractions) with marks.

    signed: the values are changes (rendered with a sign, in percentage points).
    """

    name: str
    title: str
    caption: str
    groups: list[Group]
    rows: list[str]
    labels: dict[str, str]
    cells: dict[CellKey, Cell]
    underline: set[CellKey] = field(default_factory=set)
    bold: set[CellKey] = field(default_factory=set)
    shade: set[CellKey] = field(default_factory=set)
    signed: bool = False
    notes: list[str] = field(default_factory=list)

    def get(self, method: str, group: str, metric: str) -> Cell | None:
        return self.cells.get((method, group, metric))

    def as_dict(self) -> dict[str, Any]:
        """Every number with its interval, and the marks, for ``report.json``."""
        rows = {}
        for m in self.rows:
            rows[m] = {"label": self.labels[m], "cells": {
                g.key: {metric: {**cell.as_dict(), "underline": (m, g.key, metric) in self.underline,
                                 "bold": (m, g.key, metric) in self.bold, "shade": (m, g.key, metric) in self.shade}
                        for metric, _ in g.columns if (cell := self.get(m, g.key, metric)) is not None}
                for g in self.groups}}
        return {"name": self.name, "title": self.title, "caption": self.caption,
                "unit": "fraction (change)" if self.signed else "fraction",
                "groups": [{"key": g.key, "label": g.label, "columns": [list(c) for c in g.columns]}
                           for g in self.groups],
                "rows": rows, "notes": list(self.notes)}


# ---------------------------------------------------------------------- marks


def displayed(value: float, digits: int = DIGITS) -> float:
    """The value as the tables print it (percent, ``digits`` decimals): the key for ties."""
    return float(f"{value * 100:.{digits}f}")


def rank_marks(values: Mapping[str, float | None], digits: int = DIGITS) -> tuple[set[str], set[str]]:
    """(best, second best) keys among ``values`` at the displayed precision.

    Ties are all marked; second best is the second-highest distinct displayed value. With
    fewer than two values, or when all values tie (no method stands out), nothing is marked.
    """
    shown = {k: displayed(v, digits) for k, v in values.items() if v is not None}
    levels = sorted(set(shown.values()), reverse=True)
    if len(shown) < 2 or len(levels) < 2:
        return set(), set()
    best = {k for k, v in shown.items() if v == levels[0]}
    second = {k for k, v in shown.items() if len(levels) > 1 and v == levels[1]}
    return best, second


# ---------------------------------------------------------------------- Pass@K / Maj@K tables


def _family_metrics(exp: Experiment, family: str) -> list[tuple[str, str]]:
    if family == "pass":
        return [(f"pass@{k}", f"@{k}") for k in exp.ks]
    if family == "maj":
        return [(f"maj@{k}", f"M@{k}") for k in exp.ks if k > 1]
    raise ValueError(f"unknown metric family {family!r}")


def table_tasks(exp: Experiment, methods: Sequence[str]) -> tuple[list[str], list[str]]:
    """(tasks with a result for at least one method, notes about the others)."""
    tasks, notes = [], []
    for t in exp.tasks:
        if any(t in (exp.methods[m].summary or {}).get("tasks", {}) for m in methods):
            tasks.append(t)
        else:
            notes.append(f"task {t} has no results for any method; left out of the tables")
    return tasks, notes


def metric_table(exp: Experiment, family: str = "pass") -> Table | None:
    """The Pass@K (``family="pass"``) or Maj@K (``"maj"``) table; None when nothing to show."""
    methods = evaluated(exp)
    tasks, notes = table_tasks(exp, methods)
    metrics = _family_metrics(exp, family)
    present = [(metric, head) for metric, head in metrics
               if any(exp.cell(m, t, metric) is not None for m in methods for t in tasks)]
    notes += [f"{metric} is in no summary; column left out"
              for metric, head in metrics if (metric, head) not in present]
    if not methods or not tasks or not present:
        return None
    cols = tuple(present)
    groups = [Group(t, t, cols) for t in tasks] + [Group(AVERAGE_GROUP, "Average", cols)]
    cells: dict[CellKey, Cell] = {}
    for m in methods:
        for t in tasks:
            for metric, _ in cols:
                c = average(exp, m, [t], metric)  # the summary's value, the report's interval
                if c is not None:
                    cells[(m, t, metric)] = Cell(c.value, c.low, c.high, (exp.cell(m, t, metric) or c).n,
                                                 estimate=c.estimate)
        for metric, _ in cols:
            c = average(exp, m, tasks, metric)
            if c is not None:
                cells[(m, AVERAGE_GROUP, metric)] = c
            elif any((m, t, metric) in cells for t in tasks):
                notes.append(f"{exp.label(m)}: no Average {metric} (missing on some task)")
    table = Table(name=f"{family}_at_k", title="Pass@K" if family == "pass" else "Maj@K",
                  caption=_caption(exp, family, tasks), groups=groups, rows=methods,
                  labels={m: exp.label(m) for m in methods}, cells=cells, notes=notes)
    _mark(table, exp)
    return table


def _caption(exp: Experiment, family: str, tasks: Sequence[str]) -> str:
    what = "Pass@K" if family == "pass" else "Maj@K (plurality vote over the first K samples)"
    held = [t for t in tasks if t in exp.held_out and t not in exp.in_domain]
    return (f"{what} results (×100) of {exp.model or exp.name}; in-domain: "
            f"{', '.join(t for t in tasks if t in exp.in_domain) or 'none'}; held-out: {', '.join(held) or 'none'}. "
            f"Average: equal weight over all {len(tasks)} tasks. Underlining marks the best Base/GRPO/ES result in "
            f"each task cell; bold and shading mark the best and second-best Average across all methods.")


def _mark(table: Table, exp: Experiment) -> None:
    reference = [m for m in table.rows if exp.methods[m].role in REFERENCE_ROLES]
    for g in table.groups:
        for metric, _ in g.columns:
            if g.key == AVERAGE_GROUP:
                vals = {m: _v(table.get(m, g.key, metric)) for m in table.rows}
                best, second = rank_marks(vals)
                table.bold |= {(m, g.key, metric) for m in best}
                table.shade |= {(m, g.key, metric) for m in second}
            else:
                best, _ = rank_marks({m: _v(table.get(m, g.key, metric)) for m in reference})
                table.underline |= {(m, g.key, metric) for m in best}


def _v(cell: Cell | None) -> float | None:
    return None if cell is None else cell.value


# ---------------------------------------------------------------------- held-out change


def trained_methods(exp: Experiment) -> list[str]:
    """Evaluated methods other than the base model, in display order."""
    return [m for m in evaluated(exp) if exp.methods[m].role != "base"]


def heldout_change_table(exp: Experiment) -> Table | None:
    """Post minus base averaged equally over the held-out tasks (paper Table ``tab:rq2-heldout-change``).

    Columns: changes of Pass@1, each Pass@K and each Maj@K (K > 1). Intervals: paired
    bootstrap over problems (:func:`esreason.report.stats.paired_difference`). None
    without a base method or held-out tasks.
    """
    base = exp.by_role("base")
    tasks, _ = table_tasks(exp, evaluated(exp))  # held-out tasks nobody has results for are left out (noted)
    held = [t for t in tasks if t in exp.held_out and t not in exp.in_domain]
    if base is None or exp.methods[base].summary is None or not held:
        return None
    methods = trained_methods(exp)
    pass_cols = tuple((f"pass@{k}", f"Δ@{k}") for k in exp.ks)
    maj_cols = tuple((f"maj@{k}", f"ΔM@{k}") for k in exp.ks if k > 1)
    groups = [Group("pass", "Pass changes", pass_cols)] + ([Group("maj", "Majority-vote changes", maj_cols)]
                                                           if maj_cols else [])
    cells: dict[CellKey, Cell] = {}
    notes = []
    for m in methods:
        for g in groups:
            for metric, _ in g.columns:
                c = paired_difference(exp, m, base, held, metric)
                if c is None:
                    notes.append(f"{exp.label(m)}: no {metric} change (missing on a held-out task for it or base)")
                else:
                    cells[(m, g.key, metric)] = c
    if not methods:
        return None
    return Table(name="heldout_change", title="Held-out change vs base",
                 caption=(f"Held-out performance changes (post-training minus {exp.label(base)}, percentage points), "
                          f"averaged equally over the {len(held)} held-out tasks ({', '.join(held)}). Brackets: 95% "
                          f"paired bootstrap intervals over problems{' and training seeds' if exp.n_seeds > 1 else ''}. "
                          f"Positive values denote gains."),
                 groups=groups, rows=methods, labels={m: exp.label(m) for m in methods}, cells=cells,
                 signed=True, notes=notes)


# ---------------------------------------------------------------------- below-base count


@dataclass(frozen=True)
class Comparison:
    """One (method, task, K) comparison of Pass@K against the base model."""

    method: str
    task: str
    k: int
    value: float
    base: float
    diff: Cell
    below: bool
    significant: bool | None
    test: str

    def as_dict(self) -> dict[str, Any]:
        return {"method": self.method, "task": self.task, "k": self.k, "value": self.value, "base": self.base,
                "diff": self.diff.as_dict(), "below": self.below, "significant": self.significant,
                "test": self.test}


@dataclass
class BelowBase:
    """Counts of Pass@K falling below base at large K (paper RQ1: GRPO "in 15 of 18 comparisons").

    counts rows: per trained method and scope (``held_out`` tasks or ``all`` tasks of the
    table): comparisons = tasks x large Ks, how many are below base, how many of those are
    significant, and the paper's per-task criterion (below base at *every* large K).
    """

    ks: list[int]
    scopes: dict[str, list[str]]
    labels: dict[str, str]
    comparisons: list[Comparison]
    counts: list[dict[str, Any]]
    notes: list[str]

    def as_dict(self) -> dict[str, Any]:
        return {"name": "below_base", "ks": self.ks, "scopes": self.scopes, "counts": self.counts,
                "comparisons": [c.as_dict() for c in self.comparisons], "notes": self.notes,
                "significance": "paired bootstrap over problems: 95% interval of (method - base) entirely "
                                "below 0; fallback when problems.jsonl is missing: the summary intervals "
                                "do not overlap"}


def default_large_ks(exp: Experiment) -> list[int]:
    """The protocol's Ks above 1 (the paper: 16 and 32)."""
    return [k for k in exp.ks if k > 1]


def below_base(exp: Experiment, large_ks: Sequence[int] | None = None) -> BelowBase | None:
    """Every (trained method, task, large K) comparison with base, and the counts per scope."""
    base = exp.by_role("base")
    if base is None or exp.methods[base].summary is None:
        return None
    ks = sorted(large_ks) if large_ks is not None else default_large_ks(exp)
    if not ks:
        return None
    tasks, _ = table_tasks(exp, evaluated(exp))
    held = [t for t in tasks if t in exp.held_out and t not in exp.in_domain]
    scopes = {"held_out": held, "all": tasks}
    methods = trained_methods(exp)
    if not methods:
        return None
    comps: list[Comparison] = []
    notes: list[str] = []
    for m in methods:
        for t in tasks:
            for k in ks:
                c = _compare(exp, m, base, t, k)
                if c is None:
                    notes.append(f"{exp.label(m)}: no pass@{k} comparison on {t} (missing value)")
                else:
                    comps.append(c)
    counts = []
    for m in methods:
        for scope, scope_tasks in scopes.items():
            mine = [c for c in comps if c.method == m and c.task in scope_tasks]
            if not mine:
                continue
            per_task = {t: [c for c in mine if c.task == t] for t in scope_tasks}
            complete = {t: cs for t, cs in per_task.items() if len(cs) == len(ks)}
            counts.append({"method": m, "label": exp.label(m), "scope": scope, "comparisons": len(mine),
                           "below": sum(c.below for c in mine),
                           "significant": sum(bool(c.below and c.significant) for c in mine),
                           "tasks": len(complete),
                           "tasks_below_all_k": sum(all(c.below for c in cs) for cs in complete.values())})
    return BelowBase(ks=ks, scopes=scopes, labels={m: exp.label(m) for m in methods}, comparisons=comps,
                     counts=counts, notes=notes)


def _compare(exp: Experiment, method: str, base: str, task: str, k: int) -> Comparison | None:
    metric = f"pass@{k}"
    a, b = exp.cell(method, task, metric), exp.cell(base, task, metric)
    if a is None or b is None:
        return None
    diff = paired_difference(exp, method, base, [task], metric)
    assert diff is not None  # both cells exist
    below = a.value < b.value  # type: ignore[operator]
    if diff.high is not None:
        test = "seed-level t" if diff.estimate is not None and diff.estimate.kind == "t" else "paired bootstrap"
        return Comparison(method, task, k, a.value, b.value, diff, below,  # type: ignore[arg-type]
                          below and diff.high < 0, test)
    if a.high is not None and b.low is not None:
        return Comparison(method, task, k, a.value, b.value, diff, below,  # type: ignore[arg-type]
                          below and a.high < b.low, "summary intervals")
    return Comparison(method, task, k, a.value, b.value, diff, below, None, "none")  # type: ignore[arg-type]

