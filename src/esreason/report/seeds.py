"""A method trained with several seeds, read as one row of the report.

``experiment.json`` of an experiment with ``seeds`` holds, per trained method, one entry per
training seed (``methods.<m>.seeds.<s>``: its eval directory, checkpoint and training stages).
The report shows such a method as one row whose numbers pool the seeds:

- a cell's point estimate is the mean over seeds of the per-seed values (equal weight per
  seed, each an equal-weight mean over problems);
- its interval is the seed-level variance-components t-interval over seeds and problems
  (:mod:`esreason.report.components`);
- the per-problem rows (:meth:`esreason.report.load.Experiment.problems`) are per-problem
  means over seeds; the per-seed rows stay available for the seed-aware statistics.

The per-seed numbers themselves (one column per seed in the findings, per-seed points and
bands in the figures) come from each seed's own summary.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from esreason.report.components import seed_interval
from esreason.report.hierarchical import variance_text
from esreason.report.stats import metric_column


@dataclass
class SeedRun:
    """One training seed of a method: its evaluation and training stages."""

    seed: str
    eval_dir: Path
    summary: dict[str, Any]
    training: list[Any] = field(default_factory=list)
    """:class:`esreason.report.load.Stage` of this seed's run."""


def _number(x: Any) -> float | None:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    return float(x) if np.isfinite(x) else None


def mean_rows(runs: Sequence[Mapping[str, Mapping[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Per-problem rows averaged over seeds: every numeric field's mean over the seeds that have
    the problem and the field (problems in the first seed's order; problems of later seeds only
    are appended)."""
    ids = list(dict.fromkeys(pid for rows in runs for pid in rows))
    out = {}
    for pid in ids:
        present = [rows[pid] for rows in runs if pid in rows]
        row: dict[str, Any] = {"problem_id": pid}
        for key in dict.fromkeys(k for r in present for k in r):
            vals = [v for v in (_number(r.get(key)) for r in present) if v is not None]
            if vals:
                row[key] = float(np.mean(vals))
        out[pid] = row
    return out


def _entry(values: list[float], lo: float | None, hi: float | None, n: int) -> dict[str, Any]:
    return {"value": float(np.mean(values)), "ci_low": lo, "ci_high": hi, "n": n}


def _seed_ci(tables: Mapping[str, np.ndarray], n_seeds: int, level: float) -> tuple[float | None, float | None]:
    """The seed-level interval of one method's task average (None, None when it cannot be formed)."""
    est = seed_interval([(1.0, tables)], variance_text(n_seeds, [t.shape[-1] for t in tables.values()]))
    return (None, None) if est is None else est.interval(level)


def pooled_summary(runs: Sequence[SeedRun], problems: Mapping[str, Sequence[Mapping[str, Any]] | None]
                   ) -> dict[str, Any]:
    """One eval summary for a method trained with several seeds (module docstring).

    runs: the seeds in order. problems: ``{task: [rows of seed 1, rows of seed 2, ...]}`` (None
    for a task whose files are incomplete: its cells get no interval). Only metrics every seed
    reports are pooled; a task some seed lacks is left out.
    """
    first = runs[0].summary
    boot = first.get("bootstrap") or {}
    level = float(boot.get("level", 0.95))
    tasks = [t for t in first.get("tasks", {}) if all(t in r.summary.get("tasks", {}) for r in runs)]
    tables: dict[str, dict[str, np.ndarray]] = {}  # metric -> {task: [S, n]}
    out_tasks: dict[str, Any] = {}
    for t in tasks:
        per_seed = [r.summary["tasks"][t].get("metrics", {}) for r in runs]
        metrics = [m for m in per_seed[0] if all(_number((p.get(m) or {}).get("value")) is not None
                                                 for p in per_seed)]
        rows = problems.get(t)
        ids = list(rows[0]) if rows else []
        cells = {}
        for m in metrics:
            values = [float(p[m]["value"]) for p in per_seed]
            lo = hi = None
            if rows:
                table = np.stack([metric_column(r, ids, m) for r in rows])  # [S, n]
                tables.setdefault(m, {})[t] = table
                lo, hi = _seed_ci({t: table}, len(runs), level)
            cells[m] = _entry(values, lo, hi, len(ids) or int(per_seed[0][m].get("n") or 0))
        out_tasks[t] = {"num_problems": len(ids) or first["tasks"][t].get("num_problems"), "metrics": cells}
    avg_tasks = [t for t in (first.get("average") or {}).get("tasks") or tasks if t in out_tasks]
    avg: dict[str, Any] = {"tasks": avg_tasks, "metrics": {}}
    for m in (out_tasks[avg_tasks[0]]["metrics"] if avg_tasks else {}):
        if not all(m in out_tasks[t]["metrics"] for t in avg_tasks):
            continue
        values = [float(np.mean([out_tasks[t]["metrics"][m]["value"] for t in avg_tasks]))]
        per = tables.get(m, {})
        lo, hi = (_seed_ci({t: per[t] for t in avg_tasks}, len(runs), level)
                  if all(t in per for t in avg_tasks) else (None, None))
        avg["metrics"][m] = _entry(values, lo, hi, len(avg_tasks))
    return {**{k: v for k, v in first.items() if k not in ("tasks", "average")}, "tasks": out_tasks,
            "average": avg, "seeds": [r.seed for r in runs]}


class SeedView:
    """One training seed of an experiment, seen as a single-seed experiment: a method trained with
    several seeds answers with seed ``seed``'s own summary and problem rows; the others as usual.
    The statistics of :mod:`esreason.report.stats` on this view are the problem-only ones."""

    def __init__(self, exp: Any, seed: str) -> None:
        self.exp, self.seed = exp, seed

    def _seeded(self, method: str) -> bool:
        return bool(self.exp.seed_keys(method))

    def cell(self, method: str, task: str, metric: str) -> Any:
        if self._seeded(method):
            return self.exp.seed_cell(method, self.seed, task, metric)
        return self.exp.cell(method, task, metric)

    def average_cell(self, method: str, metric: str) -> Any:
        return None if self._seeded(method) else self.exp.average_cell(method, metric)

    def summary_average_tasks(self, method: str) -> list[str]:
        return [] if self._seeded(method) else self.exp.summary_average_tasks(method)

    def problems(self, method: str, task: str) -> dict[str, dict[str, Any]] | None:
        if not self._seeded(method):
            return self.exp.problems(method, task)
        runs = self.exp.seed_problems(method, task)
        keys = self.exp.seed_keys(method)
        return None if runs is None or self.seed not in keys else runs[keys.index(self.seed)]

    def bootstrap_settings(self) -> tuple[float, int, int]:
        return self.exp.bootstrap_settings()

    def seed_keys(self, method: str) -> list[str]:
        return []

    def seed_problems(self, method: str, task: str) -> list[dict[str, dict[str, Any]]] | None:
        rows = self.problems(method, task)
        return None if rows is None else [rows]


def per_seed_seeds(exp: Any, a: str, b: str) -> list[str]:
    """The seeds over which ``a - b`` has a per-seed value: the shared seeds when both were trained
    with seeds (none if their seed lists differ), else the seeds of whichever side has them."""
    ka, kb = exp.seed_keys(a), exp.seed_keys(b)
    if ka and kb:
        return ka if ka == kb else []
    return ka or kb


def per_seed_differences(exp: Any, a: str, b: str, tasks: Sequence[str], metric: str) -> list[tuple[str, Any]]:
    """``[(seed, Cell of a - b)]`` per training seed, each with its problem-only paired interval."""
    from esreason.report.stats import paired_difference

    return [(s, paired_difference(SeedView(exp, s), a, b, tasks, metric)) for s in per_seed_seeds(exp, a, b)]


def variance_source(exp: Any, methods: Sequence[str | None], tasks: Sequence[str], metric: str = "pass@1",
                    has_interval: bool = True) -> str:
    """What the pooled interval of a comparison among ``methods`` covers (``variance_text``);
    ``"no interval"`` when there is none (``has_interval`` False)."""
    if not has_interval:
        return "no interval"
    present = [m for m in methods if m is not None]
    n_seeds = max([len(exp.seed_keys(m)) for m in present] + [1])
    problems = []
    for t in tasks:
        cells = [exp.cell(m, t, metric) for m in present]
        ns = [c.n for c in cells if c is not None and c.n]
        if ns:
            problems.append(min(ns))
    return variance_text(n_seeds, problems)


def seed_value(exp: Any, method: str, seed: str, tasks: Sequence[str], metric: str) -> float | None:
    """One training seed's ``metric``: on one task, or the equal-weight mean over ``tasks``
    (None when the seed lacks the metric on one of them)."""
    cells = [exp.seed_cell(method, seed, t, metric) for t in tasks]
    if not cells or any(c is None or c.value is None for c in cells):
        return None
    return float(np.mean([c.value for c in cells]))
