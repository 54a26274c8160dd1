"""``esreason analyze coverage RUN``: the coverage rows of a run and their tables.

Reads ``RUN/metrics.jsonl``, keeps the updates that logged the ``coverage/...``
diagnostics of :mod:`esreason.es_loop.coverage`, and builds the per-update table, the
Proposition 1 table (the margin m_K against K sqrt(eps/2), the bound on J_K(pi_theta+))
and the JSON payload. Figures are in :mod:`esreason.analysis.coverage.plots`.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from esreason.analysis.tables import Table, fmt, fmt_sci
from esreason.errors import UserError

PREFIX = "coverage/"
_TABLE_COLUMNS = [("p_bar", "p_bar"), ("p_centre", "p_θ"), ("P_pop", "P_pop"), ("P_same", "P_same"),
                  ("gap", "gap"), ("gap_null", "gap null"), ("JS_succ", "JS_succ"),
                  ("JS_succ_null", "JS_succ null"), ("JS_succ_local", "JS_succ local"),
                  ("cov_wp", "Cov(z,p)"), ("selection_gain", "p_w − p_bar")]




def load_coverage_rows(run: str | Path) -> list[dict[str, Any]]:
    """Rows of ``RUN/metrics.jsonl`` that hold coverage metrics: {'step': t, key: value} with
    the ``coverage/`` prefix removed. UserError when the run or its metrics are missing."""
    from esreason.io.metrics import read_metrics

    path = Path(run)
    metrics = path / "metrics.jsonl" if path.is_dir() else path
    if not metrics.is_file():
        raise UserError(f"no metrics file at {metrics} (expected a run directory with metrics.jsonl)")
    rows = []
    for row in read_metrics(metrics):
        cov = {k[len(PREFIX):]: v for k, v in row.items() if k.startswith(PREFIX)}
        if cov:
            rows.append({"step": row["step"], **cov})
    if not rows:
        raise UserError(f"{metrics} has no coverage metrics; train with coverage.every > 0 "
                        "(e.g. --set coverage.every=5), see docs/coverage.md")
    return rows


def coverage_ks(rows: Sequence[dict[str, Any]]) -> list[int]:
    ks = {int(k.split("/")[1][1:]) for r in rows for k in r if k.startswith("prop1/K") and k.endswith("/margin")}
    return sorted(ks)


def _mean(rows: Sequence[dict[str, Any]], key: str) -> float | None:
    vals = [float(r[key]) for r in rows if isinstance(r.get(key), (int, float)) and math.isfinite(float(r[key]))]
    return float(np.mean(vals)) if vals else None


def _cell(key: str, value: float | None) -> str:
    """Gaps can be tiny (N p_bar (1 - p_bar)^(N-1) vanishes for large N): scientific notation there."""
    return fmt_sci(value, 2) if key.startswith("gap") else fmt(value)


def coverage_report(rows: Sequence[dict[str, Any]], run: str) -> tuple[list[Table], dict[str, Any]]:
    """Tables (per update, and Proposition 1 per K) and the JSON payload of a run's coverage rows."""
    t1 = Table(f"Population coverage diagnostics of {Path(run).name}",
               ["update"] + [label for _, label in _TABLE_COLUMNS],
               caption="Success estimates use the verifier's correctness (not the format reward). "
                       "'null' = mean of the statistic when member labels are permuted (finite-sample "
                       "floor); JS in nats. Last row: mean over the logged updates.")
    for r in rows:
        t1.add(r["step"], *[_cell(k, r.get(k) if isinstance(r.get(k), (int, float)) else None)
                            for k, _ in _TABLE_COLUMNS])
    t1.add("mean", *[_cell(k, _mean(rows, k)) for k, _ in _TABLE_COLUMNS])
    ks = coverage_ks(rows)
    t2 = Table("Proposition 1: margin m_K against K·sqrt(eps_succ/2) (means over logged updates)",
               ["K", "eps_succ", "J_K(w)", "J_K(θ)", "J_K(θ+)", "m_K", "K·sqrt(eps/2)",
                "condition held", "bound on J_K(θ+)", "bound held"],
               caption="condition held: share of updates with m_K > K sqrt(eps/2) (eq. "
                       "rq1-positive-transfer-margin); bound held: share with J_K(θ+) >= "
                       "J_K(w) - K sqrt(eps/2) (eq. rq1-center-transfer-bound), on the estimates; "
                       "w = the reward-weighted mixture pi_w of Lemma 3.")
    summary: dict[str, Any] = {}
    for k in ks:
        pre = f"prop1/K{k}/"
        held = [r[pre + "J_updated"] >= r[pre + "bound"] for r in rows if pre + "bound" in r]
        entry = {"eps_succ": _mean(rows, "prop1/eps_succ"), "J_w": _mean(rows, pre + "J_w"),
                 "J_centre": _mean(rows, pre + "J_centre"), "J_updated": _mean(rows, pre + "J_updated"),
                 "margin": _mean(rows, pre + "margin"), "slack": _mean(rows, pre + "slack"),
                 "condition_share": _mean(rows, pre + "condition"),
                 "bound": _mean(rows, pre + "bound"),
                 "bound_held_share": float(np.mean(held)) if held else None}
        summary[f"K{k}"] = entry
        t2.add(k, fmt(entry["eps_succ"]), fmt(entry["J_w"]), fmt(entry["J_centre"]), fmt(entry["J_updated"]),
               fmt(entry["margin"]), fmt(entry["slack"]), fmt(entry["condition_share"], 2), fmt(entry["bound"]),
               fmt(entry["bound_held_share"], 2))
    payload = {"run": str(run), "updates": [r["step"] for r in rows], "rows": list(rows),
               "means": {k: _mean(rows, k) for k in sorted({k for r in rows for k in r} - {"step"})},
               "prop1": summary,
               "notes": ["coverage metrics are estimates from finite samples; see docs/coverage.md"]}
    return [t1, t2], payload


__all__ = ["PREFIX", "coverage_report", "coverage_ks", "load_coverage_rows"]
