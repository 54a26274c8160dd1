"""Pass@K over every K = 1..M the samples support: the report's Pass@K profiles (figure and
``report.json`` ``passk_profiles``).

An evaluation draws M samples per problem and keeps each problem's correct count c
(``problems.jsonl``, key ``correct``). The unbiased estimator
(:func:`esreason.eval.metrics.pass_at_k`, paper appendix "Evaluation Metrics") turns c into Pass@K
for *every* K from 1 to M, so a profile is not limited to the protocol's Ks (the tables' columns):

- on one task, Pass@K is the mean over its problems of pass_at_k(M, c, K);
- on the average panel, the equal-weight mean over the tasks;
- for a method trained with several seeds, the mean of its seeds' profiles (each seed's own
  problems), and every seed's profile is kept for the thin per-seed lines.

This is the tables' aggregation, so a profile passes through the table's value at every tabulated
K; those Ks keep their table cells (value and 95% interval) as the figure's marks. When the problem
files are missing, hold no integer counts, or do not reproduce the table's values at the tabulated
Ks (files from another evaluation), the profile falls back to the tabulated Ks alone, with a note.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Mapping, Sequence

import numpy as np

from esreason.eval.metrics import pass_at_k
from esreason.report.cells import Cell
from esreason.report.load import Experiment, evaluated
from esreason.report.seeds import seed_value
from esreason.report.stats import average
from esreason.report.tables import AVERAGE_GROUP, table_tasks

#: Label of the average panel.
AVERAGE_LABEL = "Average (all tasks)"
#: |profile - table value| allowed at a tabulated K. Both are float64 means of the same per-problem
#: estimator values, summed in a different order: they differ by about n * 2**-52 (n problems),
#: far below this; a larger gap means the problem files belong to another evaluation.
AGREE = 1e-9


@dataclass(frozen=True)
class Profile:
    """Pass@K of one method on one panel (a task, or the task average)."""

    values: dict[int, float]
    """K -> Pass@K (fraction), ascending: every K from 1 to ``samples``, or the tabulated Ks only."""
    marks: dict[int, Cell]
    """Tabulated K -> the table's cell there (value and interval)."""
    samples: int | None = None
    """M, when ``values`` holds every K from 1 to M; None for the tabulated-K fallback."""
    seeds: tuple[dict[int, float], ...] = ()
    """One profile per training seed (methods trained with several seeds; else empty)."""

    def as_dict(self) -> dict[str, Any]:
        return {"samples": self.samples, "pass_at_k": {str(k): v for k, v in self.values.items()},
                "marks": {str(k): c.as_dict() for k, c in self.marks.items()},
                "seeds": [{str(k): v for k, v in s.items()} for s in self.seeds]}


@lru_cache(maxsize=8)
def estimator_table(m: int) -> np.ndarray:
    """pass_at_k(m, c, K) for c = 0..m (rows) and K = 1..m (columns): float64 [m + 1, m], read-only."""
    table = np.array([[pass_at_k(m, c, k) for k in range(1, m + 1)] for c in range(m + 1)], dtype=np.float64)
    table.setflags(write=False)
    return table


def counts_profile(counts: Sequence[int], m: int) -> np.ndarray:
    """Mean Pass@K over problems with correct counts ``counts`` (each in 0..m), K = 1..m: float64 [m]."""
    hist = np.bincount(np.asarray(counts, dtype=np.int64), minlength=m + 1)  # problems per c [m + 1]
    return hist @ estimator_table(m) / len(counts)


def correct_counts(rows: Mapping[str, Mapping[str, Any]], m: int) -> list[int] | None:
    """Each problem's correct count from its ``problems.jsonl`` row; None when a row has none, or a
    count that is not an integer in 0..m."""
    out = []
    for row in rows.values():
        c = row.get("correct")
        if isinstance(c, bool) or not isinstance(c, (int, float)) or c != int(c) or not 0 <= c <= m:
            return None
        out.append(int(c))
    return out or None


def samples_of(exp: Experiment, method: str) -> int | None:
    """M of ``method``'s evaluation (its summary's protocol, else the experiment's)."""
    summary = exp.methods[method].summary or {}
    m = (summary.get("protocol") or {}).get("samples", exp.protocol.get("samples"))
    return m if isinstance(m, int) and not isinstance(m, bool) and m >= 1 else None


def _seed_profiles(exp: Experiment, method: str, group: Sequence[str], m: int) -> list[np.ndarray] | None:
    """Per training seed (one entry without seeds): the equal-weight task mean of the task profiles
    over ``group``, float64 [m] each; None when a task's counts are unavailable."""
    per_task = []
    for task in group:
        runs = exp.seed_problems(method, task)
        counts = [correct_counts(rows, m) for rows in runs] if runs else None
        if not counts or any(c is None for c in counts):
            return None
        per_task.append([counts_profile(c, m) for c in counts])  # type: ignore[arg-type]
    if len({len(p) for p in per_task}) != 1:
        return None
    return [np.mean([p[s] for p in per_task], axis=0) for s in range(len(per_task[0]))]


def _marks(exp: Experiment, method: str, group: Sequence[str], is_average: bool) -> dict[int, Cell]:
    out = {}
    for k in exp.eval_ks(method):
        metric = f"pass@{k}"
        cell = average(exp, method, list(group), metric) if is_average else exp.cell(method, group[0], metric)
        if cell is not None and cell.value is not None:
            out[k] = cell
    return out


def _profile(exp: Experiment, method: str, group: Sequence[str], is_average: bool) -> tuple[Profile | None, bool]:
    """(the profile, whether it covers every K); None when the method has no value on the panel."""
    marks = _marks(exp, method, group, is_average)
    if not marks:  # no table value on this panel (a task the method's summary lacks): no profile either
        return None, True
    m = samples_of(exp, method)
    seeds = _seed_profiles(exp, method, group, m) if m is not None else None
    if seeds is not None:
        mean = np.mean(seeds, axis=0)  # [m]
        if all(k <= m and abs(mean[k - 1] - c.value) <= AGREE for k, c in marks.items()):  # type: ignore[operator]
            values = {k: float(mean[k - 1]) for k in range(1, m + 1)}  # type: ignore[operator]
            per_seed = tuple({k: float(s[k - 1]) for k in range(1, m + 1)} for s in seeds) if len(seeds) > 1 else ()
            return Profile(values, marks, m, per_seed), True
    keys = exp.seed_keys(method)
    per_seed = tuple({k: v for k in marks if (v := seed_value(exp, method, s, list(group), f"pass@{k}")) is not None}
                     for s in keys) if len(keys) > 1 else ()
    return Profile({k: float(c.value) for k, c in sorted(marks.items())}, marks, None, per_seed), False  # type: ignore


def passk_profiles(exp: Experiment) -> tuple[dict[str, dict[str, Profile]], list[str]]:
    """``{panel label: {method: Profile}}`` per task (the tables' tasks) and on the average, with notes
    naming the methods whose profile fell back to the tabulated Ks."""
    methods = evaluated(exp)
    tasks, _ = table_tasks(exp, methods)
    out: dict[str, dict[str, Profile]] = {}
    partial: dict[str, list[str]] = {}
    for key in tasks + [AVERAGE_GROUP]:
        is_average = key == AVERAGE_GROUP
        label = AVERAGE_LABEL if is_average else key
        group = tasks if is_average else [key]
        out[label] = {}
        for m in methods:
            profile, full = _profile(exp, m, group, is_average)
            if profile is not None:
                out[label][m] = profile
                if not full and not is_average:
                    partial.setdefault(m, []).append(key)
    notes = [f"Pass@K profile of {exp.label(m)} on {', '.join(ts)}: drawn at the tabulated K only (its "
             "problems.jsonl is missing, has no correct counts, or does not reproduce the summary's values)"
             for m, ts in partial.items()]
    return ({label: panel for label, panel in out.items() if panel} if tasks else {}), notes


__all__ = ["AVERAGE_LABEL", "Profile", "correct_counts", "counts_profile", "estimator_table", "passk_profiles",
           "samples_of"]
