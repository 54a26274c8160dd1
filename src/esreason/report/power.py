"""Minimum detectable difference (MDD) per task: how small a change the evaluation can resolve.

A comparison of two methods on one task is a paired difference over problems
(:func:`esreason.report.stats.paired_difference`). With ``n`` problems and per-problem
differences ``d_i`` of standard deviation ``s``, the normal approximation of a two-sided
test at level ``alpha = 0.05`` with power ``0.80`` detects a true mean difference of

    MDD = (z_{1 - alpha/2} + z_{power}) * s / sqrt(n) = (1.960 + 0.842) * s / sqrt(n) = 2.80 * s / sqrt(n).

Two numbers per task, both for Pass@1 (the metric the first findings rest on):

- ``paired``: per trained method, ``s`` is the standard deviation (ddof 1) of that method's
  observed per-problem differences to the base model (problems matched by ``problem_id``);
  ``paired_max`` is the largest over the trained methods — the resolution the report's
  paired comparisons actually had on this task;
- ``unpaired``: ``2.80 * sqrt(2) * s_base / sqrt(n)`` with ``s_base`` the standard deviation of the
  base model's per-problem Pass@1 — the MDD of two *independent* models with the base model's
  spread, an upper bound for the paired design whenever the two models' per-problem values are
  not negatively correlated (the usual case: both find the same problems hard). Known before
  any training, so it is the number to size an evaluation with.

Per-problem Pass@1 is itself a mean over the sampled responses, so its sampling noise is part
of ``s``; the MDD therefore falls with both more problems and more samples per problem.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from esreason.report.cells import Cell
from esreason.report.load import Experiment, evaluated
from esreason.report.stats import metric_column, paired_difference

Z_ALPHA = 1.959964  # two-sided 0.05
Z_POWER = 0.841621  # power 0.80
Z_SUM = Z_ALPHA + Z_POWER
METRIC = "pass@1"


def mdd_from_sd(sd: float, n: int, paired: bool = True) -> float | None:
    """Normal-approximation MDD (fraction) at two-sided alpha 0.05 and power 0.80.

    paired: ``sd`` is the SD of the per-problem differences; otherwise ``sd`` is the per-problem
    SD of one model and the two models are taken as independent (variance doubles).
    """
    if n < 2 or not math.isfinite(sd):
        return None
    return Z_SUM * sd * (1.0 if paired else math.sqrt(2.0)) / math.sqrt(n)


@dataclass
class TaskMDD:
    """The MDD of Pass@1 on one task (fractions)."""

    task: str
    n: int
    base: float | None
    unpaired: float | None
    paired: dict[str, float] = field(default_factory=dict)

    @property
    def paired_max(self) -> float | None:
        return max(self.paired.values()) if self.paired else None

    def as_dict(self) -> dict[str, Any]:
        return {"task": self.task, "n": self.n, "base_pass@1": self.base, "mdd_unpaired": self.unpaired,
                "mdd_paired": dict(self.paired), "mdd_paired_max": self.paired_max}


def _values(rows: dict[str, dict[str, Any]], ids: Sequence[str]) -> np.ndarray:
    """Per-problem Pass@1 in ``ids`` order (NaN where missing)."""
    return metric_column(rows, ids, METRIC)


def task_mdds(exp: Experiment) -> list[TaskMDD]:
    """One :class:`TaskMDD` per task of the experiment that the base model was evaluated on."""
    base = exp.by_role("base")
    if base is None:
        return []
    trained = [m for m in evaluated(exp) if m != base]
    out = []
    for task in exp.tasks:
        rows_b = exp.problems(base, task)
        if not rows_b:
            continue
        xb = _values(rows_b, list(rows_b))
        xb = xb[~np.isnan(xb)]
        if xb.size < 2:
            continue
        cell = exp.cell(base, task, METRIC)
        row = TaskMDD(task, int(xb.size), None if cell is None else cell.value,
                      mdd_from_sd(float(np.std(xb, ddof=1)), int(xb.size), paired=False))
        for m in trained:
            rows_m = exp.problems(m, task)
            if not rows_m:
                continue
            ids = [pid for pid in rows_m if pid in rows_b]
            d = _values(rows_m, ids) - _values(rows_b, ids)
            d = d[~np.isnan(d)]
            if d.size >= 2:
                v = mdd_from_sd(float(np.std(d, ddof=1)), int(d.size), paired=True)
                if v is not None:
                    row.paired[m] = v
        out.append(row)
    return out


def task_changes(exp: Experiment, metric: str = METRIC) -> dict[str, dict[str, Cell]]:
    """``{method: {task: Cell}}``: each trained method's ``metric`` minus Base on each task, with
    the paired 95 % bootstrap interval (:func:`esreason.report.stats.paired_difference`)."""
    base = exp.by_role("base")
    if base is None:
        return {}
    out: dict[str, dict[str, Cell]] = {}
    for m in evaluated(exp):
        if m == base:
            continue
        for task in exp.tasks:
            d = paired_difference(exp, m, base, [task], metric)
            if d is not None:
                out.setdefault(m, {})[task] = d
    return out
