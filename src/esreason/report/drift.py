"""Gain vs forgetting: in-domain Pass@1 gain, held-out Pass@1 change and off-task KL per method.

Section 9 of the report (docs/report.md, docs/offtask.md). Per trained method (every method but Base):

- **in-domain gain**: Pass@1 minus Base's, averaged equally over the in-domain tasks;
- **held-out change**: the same over the held-out tasks (retention: negative = forgotten);
  both with the report's paired intervals (:func:`esreason.report.stats.paired_difference`: the exact
  problem bootstrap with one training seed, the seed-level t-interval with several);
- **off-task KL**: the mean over off-task rows of the mean token KL(base || tuned) from
  ``EXP/offtask/`` (:mod:`esreason.analysis.offtask.run`), in nats per token. Interval: one training
  seed, the 95 % percentile bootstrap over rows (50,000 Monte Carlo resamples, the report's count: KL
  values lie on no lattice, and can sit far below the exact bootstrap's 1e-5 grid); several seeds,
  the seed-level t-interval over the seeds x rows table (:func:`esreason.report.components.seed_interval`);
- **relative L2 drift** ||theta - theta_0|| / ||theta_0|| (mean over seeds; no interval: it is not a sample).

The table is written as Markdown (``report.md``), LaTeX (``offtask_drift.tex``) and JSON
(``report.json`` ``tables.offtask_drift``); the figure is :mod:`esreason.report.drift_plot`.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from esreason.report.cells import Cell
from esreason.report.components import Estimate, seed_interval
from esreason.report.hierarchical import variance_text
from esreason.report.load import EXPERIMENT_FILE, Experiment, evaluated
from esreason.report.resample import RESAMPLES, task_average_replicates
from esreason.report.stats import paired_difference

TABLE = "offtask_drift"


@dataclass
class DriftRow:
    """One method's point in the gain-vs-forgetting plane (fractions; KL in nats per token)."""

    method: str
    label: str
    gain: Cell | None
    heldout: Cell | None
    kl: Cell | None
    relative_l2: float | None

    def as_dict(self) -> dict[str, Any]:
        return {"label": self.label, "in_domain_gain_pass@1": None if self.gain is None else self.gain.as_dict(),
                "heldout_change_pass@1": None if self.heldout is None else self.heldout.as_dict(),
                "offtask_kl": None if self.kl is None else self.kl.as_dict(), "relative_l2": self.relative_l2}


@dataclass
class DriftTable:
    """Every method's row, the task sets behind them and what the off-task set was."""

    rows: list[DriftRow]
    in_domain: list[str]
    held_out: list[str]
    offtask: dict[str, Any] | None
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"in_domain": self.in_domain, "held_out": self.held_out, "offtask": self.offtask,
                "kl_direction": None if self.offtask is None else self.offtask.get("direction"),
                "units": {"gain/change": "fraction (report.md shows percentage points)", "offtask_kl": "nats/token"},
                "rows": {r.method: r.as_dict() for r in self.rows}}


def _offtask_index(exp: Experiment) -> dict[str, Any] | None:
    try:
        raw = json.loads((exp.root / EXPERIMENT_FILE).read_text())
    except (OSError, ValueError):
        return None
    index = raw.get("offtask") if isinstance(raw, dict) else None
    return index if isinstance(index, dict) and isinstance(index.get("methods"), dict) else None


def _read_run(path: Path) -> tuple[dict[str, float], float | None] | None:
    """{row id: mean token KL} and the relative L2 drift of one off-task file (None: unreadable)."""
    try:
        data = json.loads(path.read_text())
        per_row = {str(r["id"]): float(r["kl_sum"]) / int(r["tokens"]) for r in data["rows"] if int(r["tokens"]) > 0}
    except (OSError, ValueError, KeyError, TypeError, ZeroDivisionError):
        return None
    rel = data.get("relative_l2")
    return per_row, (float(rel) if isinstance(rel, (int, float)) else None)


def kl_cell(runs: list[dict[str, float]], level: float, seed: int) -> Cell | None:
    """Mean token KL over rows (mean over seeds) with its interval (see the module docstring)."""
    ids = [i for i in runs[0] if all(i in r for r in runs)]
    if not ids:
        return None
    x = np.array([[r[i] for i in ids] for r in runs], dtype=np.float64)  # [S, n]
    value = float(x.mean())
    label = variance_text(len(runs), [len(ids)])
    if len(runs) > 1:
        est = seed_interval([(1.0, {"offtask": x})], label)
    else:
        reps = task_average_replicates({"offtask": x[0]}, RESAMPLES, seed)
        est = Estimate(value, "percentile", label, replicates=reps)
    if est is None:
        return Cell(value, None, None, len(ids))
    lo, hi = est.interval(level)
    return Cell(value, lo, hi, len(ids), estimate=est)


def drift_table(exp: Experiment) -> DriftTable | None:
    """The table, or None when the experiment has no base method or no trained method."""
    base = exp.by_role("base")
    methods = [m for m in evaluated(exp) if exp.methods[m].role != "base"]
    if base is None or exp.methods[base].summary is None or not methods:
        return None
    tasks = [t for t in exp.tasks if t in exp.methods[base].summary.get("tasks", {})]
    in_domain = [t for t in tasks if t in exp.in_domain]
    held = [t for t in tasks if t in exp.held_out and t not in exp.in_domain]
    index = _offtask_index(exp)
    level, _, boot_seed = exp.bootstrap_settings()
    notes: list[str] = []
    if index is None:
        notes.append("no off-task drift in experiment.json (the experiment names no analysis.offtask); "
                     "the gain-vs-forgetting table has no KL column")
    rows = []
    for m in methods:
        kl, rel = None, None
        entry = (index or {}).get("methods", {}).get(m)
        if entry is not None:
            files = [entry["file"]] if "file" in entry else [entry["seeds"][s] for s in sorted(entry.get("seeds", {}))]
            runs = [_read_run(exp.root / f) for f in files]
            if runs and all(r is not None for r in runs):
                kl = kl_cell([r[0] for r in runs], level, boot_seed)  # type: ignore[index]
                rels = [r[1] for r in runs if r[1] is not None]  # type: ignore[index]
                rel = float(np.mean(rels)) if rels else None
            else:
                notes.append(f"{exp.label(m)}: an off-task file of {files} is missing or unreadable")
        elif index is not None:
            notes.append(f"{exp.label(m)}: no off-task KL in experiment.json")
        rows.append(DriftRow(m, exp.label(m), paired_difference(exp, m, base, in_domain, "pass@1") if in_domain
                             else None, paired_difference(exp, m, base, held, "pass@1") if held else None, kl, rel))
    return DriftTable(rows, in_domain, held, index, notes)


def _pp(cell: Cell | None) -> str:
    if cell is None or cell.value is None:
        return "–"
    ci = "" if cell.low is None else f" [{100 * cell.low:+.1f}, {100 * cell.high:+.1f}]"
    return f"{100 * cell.value:+.1f}{ci}"


def _kl(cell: Cell | None) -> str:
    """Three significant digits of the value, the interval at the same decimals."""
    if cell is None or cell.value is None:
        return "–"
    v = abs(cell.value)
    d = 3 if v == 0 or not math.isfinite(v) else max(3, 2 - math.floor(math.log10(v)))
    ci = "" if cell.low is None else f" [{cell.low:.{d}f}, {cell.high:.{d}f}]"
    return f"{cell.value:.{d}f}{ci}"


def drift_rows(table: DriftTable) -> tuple[list[str], list[list[str]]]:
    """Header and rows for Markdown and LaTeX (pp for Pass@1, nats per token for KL)."""
    header = ["Method", "In-domain Pass@1 gain (pp)", "Held-out Pass@1 change (pp)", "Off-task KL (nats/token)",
              "Relative L2 drift"]
    rows = [[r.label, _pp(r.gain), _pp(r.heldout), _kl(r.kl),
             "–" if r.relative_l2 is None else f"{r.relative_l2:.3e}"] for r in table.rows]
    return header, rows


def caption(table: DriftTable) -> str:
    off = table.offtask or {}
    src = (f"{off.get('rows')} off-task rows ({off.get('source')}, {off.get('tokens')} scored tokens)"
           if off else "no off-task set")
    return (f"Gain vs forgetting. In-domain gain: Pass@1 minus Base averaged over "
            f"{', '.join(table.in_domain) or 'none'}; "
            f"held-out change: the same over {', '.join(table.held_out) or 'none'} (95% paired intervals). Off-task "
            f"KL: mean over {src} of the mean token {off.get('direction', 'KL(base || tuned)')} in nats, with a 95% "
            f"interval over rows (and training seeds, with several). Relative L2: ||theta - theta_0|| / ||theta_0||.")


def drift_section(table: DriftTable | None, files: dict[str, Path], tex: dict[str, str]) -> list[str]:
    """The report's section 9 (Markdown lines)."""
    out = ["## 9. Gain vs forgetting (off-task drift)", "",
           "How much each method gained in-domain against what it lost elsewhere: held-out Pass@1 (tasks "
           "outside training) and the token KL divergence from the base model on off-task text (docs/offtask.md).",
           ""]
    if table is None:
        return out + ["_Not available (needs a base method and a trained method)._", ""]
    from esreason.report import markdown

    out += [markdown.simple_markdown(*drift_rows(table)), "", caption(table), ""]
    if "drift" in files:
        out += [markdown.image(files["drift"].name, "gain vs forgetting"), ""]
    if TABLE in tex:
        out += [f"LaTeX: [`{tex[TABLE]}`]({tex[TABLE]})", ""]
    return out
