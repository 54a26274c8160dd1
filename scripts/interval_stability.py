"""How far the report's percentile endpoints move between bootstrap seeds.

    python scripts/interval_stability.py EXP [--boot-seeds 10] [--resamples 1000,50000]

The report reads its one-seed intervals off the bootstrap's exact distribution
(:mod:`esreason.report.exact`); the ``"report"`` entry measures that path (it moves by 0 between
bootstrap seeds unless a value is missing and it falls back to resampling) and its grid error (the
largest endpoint change when the grid for non-lattice values is refined 10x). The entries per
resample count measure the Monte Carlo bootstrap it replaced, for comparison.

For every evaluation of the experiment EXP (Base and every training seed of every method, each
read as a one-seed evaluation: the intervals the report bootstraps) and every metric of
``--metrics`` (default pass@1, pass@16, pass@32): the 95 % percentile interval per task and of the
task average, and of the paired difference to Base, with problems resampled as the report does
(:mod:`esreason.report.resample`). Each is computed under ``--boot-seeds`` bootstrap seeds; the
movement of an endpoint is its range (max - min) over those seeds. Prints JSON: per resample
count, the largest and the median movement over every endpoint (percentage points), and the
largest per kind (level or difference to Base; per task or task average).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from esreason.report.load import read_problems
import esreason.report.exact as exact
from esreason.report.resample import percentile, task_average_replicates
from esreason.report.stats import bootstrap_estimate
from esreason.report.stats import metric_column


def _evals(exp: Path) -> dict[str, Path]:
    record = json.loads((exp / "experiment.json").read_text())
    out = {}
    for key, m in record["methods"].items():
        if m.get("eval"):
            out[key] = exp / m["eval"]
        for seed, entry in (m.get("seeds") or {}).items():
            out[f"{key}/seed{seed}"] = exp / entry["eval"]
    return out


def _columns(eval_dir: Path, metric: str, ids: dict[str, list[str]] | None = None) -> dict[str, np.ndarray] | None:
    out = {}
    for task_dir in sorted(p for p in eval_dir.iterdir() if (p / "problems.jsonl").is_file()):
        rows = read_problems(task_dir / "problems.jsonl")
        cols = list(rows) if ids is None else ids[task_dir.name]
        out[task_dir.name] = metric_column(rows, cols, metric)
    return out or None


def _movement(ends: dict[str, list[tuple[float, float]]]) -> dict[str, object]:
    """The range of every endpoint over the bootstrap seeds, summarised (pp)."""
    moves: list[float] = []
    worst = ("", 0.0)
    by_kind: dict[str, list[float]] = {}
    for name, pairs in ends.items():
        arr = np.array(pairs, dtype=np.float64)  # [B, 2]
        rng = 100 * (arr.max(0) - arr.min(0))
        moves += rng.tolist()
        kind = ("difference" if " - base " in name else "level") + (" average" if name.endswith("average")
                                                                    else " per task")
        by_kind.setdefault(kind, []).extend(rng.tolist())
        if rng.max() > worst[1]:
            worst = (name, float(rng.max()))
    return {"max": float(np.max(moves)), "median": float(np.median(moves)),
            "p95": float(np.quantile(moves, 0.95)), "worst": worst[0],
            "max_by_kind": {k: float(np.max(v)) for k, v in by_kind.items()},
            "endpoints_by_kind": {k: len(v) for k, v in by_kind.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("experiment", type=Path)
    ap.add_argument("--boot-seeds", type=int, default=10)
    ap.add_argument("--resamples", default="1000,50000")
    ap.add_argument("--metrics", default="pass@1,pass@16,pass@32")
    args = ap.parse_args()
    evals = _evals(args.experiment)
    base_dir = evals.get("base")
    intervals: dict[str, dict[str, np.ndarray]] = {}  # name -> {task: per-problem values}
    for name, d in evals.items():
        if not d.is_dir():
            continue
        for metric in args.metrics.split(","):
            cols = _columns(d, metric)
            if cols is None:
                continue
            for task, x in cols.items():
                intervals[f"{name} {metric} {task}"] = {task: x}
            intervals[f"{name} {metric} average"] = cols
            if base_dir is not None and name != "base":
                ids = {t: list(read_problems(d / t / "problems.jsonl")) for t in cols}
                base = _columns(base_dir, metric, ids)
                if base is not None and set(base) == set(cols):
                    diff = {t: cols[t] - base[t] for t in cols}
                    for task, x in diff.items():
                        intervals[f"{name} - base {metric} {task}"] = {task: x}
                    intervals[f"{name} - base {metric} average"] = diff
    result = {"intervals": len(intervals), "boot_seeds": args.boot_seeds, "movement_pp": {}}

    def shipped(per_task: dict[str, np.ndarray], b: int) -> tuple[float, float]:
        return bootstrap_estimate(0.0, per_task, "", 50_000, b).interval(0.95)  # type: ignore[union-attr]

    for r in ["report"] + [int(v) for v in args.resamples.split(",") if v]:
        ends = {name: [] for name in intervals}
        for b in range(args.boot_seeds):
            for name, per_task in intervals.items():
                ends[name].append(shipped(per_task, b) if r == "report"
                                  else percentile(task_average_replicates(per_task, r, b), 0.95))
        result["movement_pp"][str(r)] = _movement(ends)
        print(json.dumps({r: result["movement_pp"][str(r)]}), flush=True)
    coarse = {name: shipped(pt, 0) for name, pt in intervals.items()}
    grid, exact.GRID = exact.GRID, exact.GRID / 10
    fine = {name: shipped(pt, 0) for name, pt in intervals.items()}
    exact.GRID = grid
    result["report_grid_error_pp"] = float(100 * max(np.abs(np.subtract(coarse[k], fine[k])).max() for k in coarse))
    result["report_resampled"] = sum(exact.exact_distribution(pt) is None for pt in intervals.values())
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
