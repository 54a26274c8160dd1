"""Averages and differences over tasks with problem-level bootstrap intervals.

The evaluation summaries already hold an interval for every task cell and for the
equal-weight average over the tasks of that evaluation. The report needs two more kinds
of interval, both computed here the way :mod:`esreason.eval.bootstrap` computes its own
(percentile bootstrap, problems resampled *within* each task, task means averaged with
equal weights, the same level, resample count and seed):

- an average over a different set of tasks (the held-out tasks only, or a table whose
  tasks differ from the evaluation's), from ``problems.jsonl``;
- a *paired* difference ``method - base`` (the held-out change table, the below-base
  count): problems are matched by ``problem_id`` and the same resampled problems are used
  for both models, so the interval reflects the difference's own variance, which is
  usually much smaller than what two overlapping marginal intervals suggest.

Point estimates always come from the summaries (task means, equal weight per task); the
problem files only supply the intervals. When a needed ``problems.jsonl`` is missing
the interval is None (the number is still reported).

With several training seeds an interval that involves a seeded method is the seed-level
variance-components t-interval of :mod:`esreason.report.components` instead; seeds are paired only
for nested runs (:func:`nested`). The percentile bootstrap here reads its endpoints off the
bootstrap's exact distribution (:mod:`esreason.report.exact`: the limit of infinitely many
resamples, computed by convolution); only where a value is missing does it draw ``RESAMPLES``
(50,000) Monte Carlo replicates in chunks (:mod:`esreason.report.resample`).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from esreason.report.cells import Cell, ExperimentView
from esreason.report.components import Estimate, seed_interval
from esreason.report.hierarchical import probability_of_improvement, variance_text
from esreason.report.exact import exact_distribution
from esreason.report.resample import RESAMPLES, cdf_knots, task_average_replicates

#: Nested runs (a composition and its own first stage, seed by seed): the only pairs whose seeds pair.
NESTED = {frozenset(("es_grpo", "es")), frozenset(("grpo_es", "grpo"))}


def bootstrap_replicates(per_task: dict[str, np.ndarray], resamples: int = RESAMPLES, seed: int = 0
                         ) -> np.ndarray | None:
    """Replicates of the equal-weight mean over tasks of per-problem values (None: a task has none)."""
    if not per_task or any(np.asarray(v).size == 0 or np.isnan(np.asarray(v, dtype=np.float64)).all()
                           for v in per_task.values()):
        return None
    return task_average_replicates(per_task, resamples, seed)


def bootstrap_estimate(value: float, per_task: dict[str, np.ndarray], label: str, resamples: int = RESAMPLES,
                       seed: int = 0) -> Estimate | None:
    """The problem bootstrap's :class:`Estimate` of the task average of ``per_task``: its exact
    distribution (:func:`esreason.report.exact.exact_distribution`, no Monte Carlo error) when no
    value is missing, else ``resamples`` Monte Carlo replicates. None when a task has no value."""
    dist = exact_distribution(per_task) if per_task else None
    if dist is not None:
        return Estimate(value, "percentile", label, cdf=cdf_knots(*dist))
    reps = bootstrap_replicates(per_task, resamples, seed)
    return None if reps is None else Estimate(value, "percentile", label, replicates=reps)


def bootstrap_task_average(per_task: dict[str, np.ndarray], level: float = 0.95, resamples: int = RESAMPLES,
                           seed: int = 0) -> tuple[float | None, float | None]:
    """Percentile interval of the equal-weight mean over tasks of per-problem values.

    per_task: ``{task: values [n_task]}`` (NaN: no value for that problem). Each task's
    problems are resampled with replacement; a resample's task mean ignores NaNs.
    """
    est = bootstrap_estimate(0.0, per_task, "", resamples, seed)  # the interval does not use the value
    return (None, None) if est is None else est.interval(level)


def nested(exp: ExperimentView, a: str, b: str) -> bool:
    """True when ``a`` and ``b`` are nested runs whose seed s pair (a composition and its own first
    stage, e.g. ES->GRPO seed s continues ES seed s) and both have the same seeds."""
    root = getattr(exp, "exp", exp)
    methods = getattr(root, "methods", {})
    roles = {getattr(methods.get(m), "role", None) for m in (a, b)}
    ka, kb = exp.seed_keys(a), exp.seed_keys(b)
    return frozenset(roles) in NESTED and len(ka) > 1 and ka == kb


def metric_column(rows: dict[str, dict], ids: Sequence[str], metric: str) -> np.ndarray:
    """Per-problem ``metric`` values in ``ids`` order as float64 (NaN where missing or not a number)."""
    out = np.full(len(ids), np.nan)
    for i, pid in enumerate(ids):
        v = rows.get(pid, {}).get(metric)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            out[i] = float(v)
    return out


def average(exp: ExperimentView, method: str, tasks: Sequence[str], metric: str) -> Cell | None:
    """Equal-weight average of ``metric`` over ``tasks`` (one task: the task cell) with the report's
    interval.

    None when any task lacks the metric (an average over fewer tasks would not compare). A method
    with several training seeds: the seed-level t-interval (:mod:`esreason.report.components`);
    otherwise the problem bootstrap at the report's resample count from ``problems.jsonl``. Without
    the problem files: the evaluation summary's own interval where it covers exactly ``tasks``, else
    none.
    """
    cells = [exp.cell(method, t, metric) for t in tasks]
    if not tasks or any(c is None for c in cells):
        return None
    value = float(np.mean([c.value for c in cells]))  # type: ignore[union-attr]
    level, resamples, seed = exp.bootstrap_settings()
    if len(exp.seed_keys(method)) > 1:
        tables = seed_tables(exp, method, tasks, metric)
        est = None if tables is None else seed_interval([(1.0, tables)], _covers(exp, [method], tables))
        return _cell(value, est, level, len(tasks))
    per_task: dict[str, np.ndarray] = {}
    for t in tasks:
        rows = exp.problems(method, t)
        if rows is None:
            break
        per_task[t] = metric_column(rows, list(rows), metric)  # file order
    else:
        est = bootstrap_estimate(value, per_task, _covers(exp, [method], per_task), resamples, seed)
        return _cell(value, est, level, len(tasks))
    if len(tasks) == 1:
        c = cells[0]
        return Cell(value, c.low, c.high, 1)  # type: ignore[union-attr]
    if sorted(exp.summary_average_tasks(method)) == sorted(tasks):
        own = exp.average_cell(method, metric)
        if own is not None:
            return Cell(value, own.low, own.high, len(tasks))
    return Cell(value, None, None, len(tasks))


def _covers(exp: ExperimentView, methods: Sequence[str], per_task: dict[str, np.ndarray]) -> str:
    """What an interval over ``methods`` covers, in words (:func:`variance_text`)."""
    n_seeds = max([len(exp.seed_keys(m)) for m in methods] + [1])
    return variance_text(n_seeds, [np.asarray(x).shape[-1] for x in per_task.values()])


def _cell(value: float, est: Estimate | None, level: float, n: int) -> Cell:
    """A :class:`Cell` at the report's point ``value`` with the interval of ``est`` (None: none)."""
    if est is None:
        return Cell(value, None, None, n)
    lo, hi = est.interval(level)
    return Cell(value, lo, hi, n, estimate=est)


def seed_tables(exp: ExperimentView, method: str, tasks: Sequence[str], metric: str,
                ids: dict[str, list[str]] | None = None) -> dict[str, np.ndarray] | None:
    """``{task: X [S seeds, n problems]}`` of per-problem ``metric`` (rows: the method's seeds in
    order; columns: ``ids[task]``, default the first seed's file order). None when a file is missing."""
    out = {}
    for t in tasks:
        runs = exp.seed_problems(method, t)
        if runs is None or not runs:
            return None
        cols = list(runs[0]) if ids is None else ids[t]
        out[t] = np.stack([metric_column(rows, cols, metric) for rows in runs])  # [S, n]
    return out


def paired_tables(exp: ExperimentView, method: str, base: str, tasks: Sequence[str], metric: str
                  ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], bool] | None:
    """Per-task tables of both methods over their common problems (by ``problem_id``), and
    whether the seeds pair (:func:`nested` runs only; independent methods never do). None when a
    ``problems.jsonl`` is missing or the two share no problem on some task."""
    ids = {}
    for t in tasks:
        rows_m, rows_b = exp.problems(method, t), exp.problems(base, t)
        if rows_m is None or rows_b is None:
            return None
        ids[t] = [pid for pid in rows_m if pid in rows_b]
        if not ids[t]:
            return None
    a, b = seed_tables(exp, method, tasks, metric, ids), seed_tables(exp, base, tasks, metric, ids)
    if a is None or b is None:
        return None
    return a, b, nested(exp, method, base)


def improvement_probability(exp: ExperimentView, method: str, other: str, tasks: Sequence[str],
                            metric: str) -> Cell | None:
    """``P(method > other)`` on a random problem and training seeds, with its two-level interval
    (:func:`esreason.report.hierarchical.probability_of_improvement`); None without problem files."""
    tables = paired_tables(exp, method, other, tasks, metric)
    if tables is None:
        return None
    level, resamples, seed = exp.bootstrap_settings()
    value, lo, hi = probability_of_improvement(*tables, level=level, resamples=resamples, seed=seed)
    return Cell(value, lo, hi, len(tasks))


def paired_difference(exp: ExperimentView, method: str, base: str, tasks: Sequence[str], metric: str) -> Cell | None:
    """``method - base`` averaged equally over ``tasks`` with a paired bootstrap interval.

    None when either side lacks the metric on some task. The interval pairs problems by
    ``problem_id`` (only problems present in both files count) and is None when a
    ``problems.jsonl`` is missing or the two share no problem.
    """
    diffs = []
    for t in tasks:
        a, b = exp.cell(method, t, metric), exp.cell(base, t, metric)
        if a is None or b is None:
            return None
        diffs.append(a.value - b.value)  # type: ignore[operator]
    if not tasks:
        return None
    value = float(np.mean(diffs))
    level, resamples, seed = exp.bootstrap_settings()
    if len(exp.seed_keys(method)) > 1 or len(exp.seed_keys(base)) > 1:
        tables = paired_tables(exp, method, base, tasks, metric)
        if tables is None:
            return Cell(value, None, None, len(tasks))
        a, b, pair = tables
        covers = _covers(exp, [method, base], a) + ("; seeds paired (nested runs)" if pair else "")
        sides = [(1.0, {t: a[t] - b[t] for t in a})] if pair else [(1.0, a), (-1.0, b)]
        return _cell(value, seed_interval(sides, covers), level, len(tasks))
    per_task = {}
    for t in tasks:
        rows_m, rows_b = exp.problems(method, t), exp.problems(base, t)
        if rows_m is None or rows_b is None:
            return Cell(value, None, None, len(tasks))
        ids = [pid for pid in rows_m if pid in rows_b]
        if not ids:
            return Cell(value, None, None, len(tasks))
        per_task[t] = metric_column(rows_m, ids, metric) - metric_column(rows_b, ids, metric)
    est = bootstrap_estimate(value, per_task, _covers(exp, [method, base], per_task), resamples, seed)
    return _cell(value, est, level, len(tasks))
