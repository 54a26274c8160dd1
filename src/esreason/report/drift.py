"""Gain vs forgetting: in-domain Pass@1 gain, held-out Pass@1 change and off-task KL per method.

Section 9 of the report (docs/report.md, docs/offtask.md). Per trained method (every method but Base):

- **in-domain gain**: Pass@1 minus Base's, averaged equally over the in-domain tasks;
- **held-out change**: the same over the held-out tasks (retention: negative = forgotten);
  both with the report's paired intervals (:func:`esreason.report.stats.paired_difference`: the exact
  problem bootstrap with one training seed, the seed-level t-interval with several);
- **off-task KL**, two figures from the per-row sums of ``EXP/offtask/`` (:mod:`esreason.analysis.offtask.run`):
  *per sequence*, the mean over rows of each row's KL(base || tuned) summed over its tokens (nats per
  response: the estimate of the sequence-level KL the chain rule gives on the base model's own samples,
  docs/offtask.md); *per token*, the mean over rows of each row's mean token KL (nats per token:
  length-normalised, every row weighs the same whatever its length). Interval of each: one training
  seed, the 95 % percentile bootstrap over rows (50,000 Monte Carlo resamples, the report's count: KL
  values lie on no lattice, and can sit far below the exact bootstrap's 1e-5 grid); several seeds,
  the seed-level t-interval over the seeds x rows table (:func:`esreason.report.components.seed_interval`);
- **relative L2 drift** ||theta - theta_0|| / ||theta_0|| (mean over seeds; no interval: it is not a sample).

With several training seeds the table is followed by one row per (method, seed) with problem-only
intervals (evaluation noise only, :func:`esreason.report.seeds.per_seed_differences`): with two or
three seeds the seed-level intervals are wide by construction (1-2 degrees of freedom and the
detection floor of :mod:`esreason.report.components`), and the per-seed rows show what each seed did.

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
from esreason.report.seeds import per_seed_differences
from esreason.report.stats import paired_difference

TABLE = "offtask_drift"


@dataclass
class DriftRow:
    """One method's point in the gain-vs-forgetting plane (fractions; KL per token in nats per token, per
    sequence in nats per response)."""

    method: str
    label: str
    gain: Cell | None
    heldout: Cell | None
    kl: Cell | None
    """Off-task KL per token: the mean over rows of each row's mean token KL (length-normalised)."""
    relative_l2: float | None
    per_seed: dict[str, "DriftRow"] = field(default_factory=dict)
    """Training seed -> this method's row on that seed alone (problem-only intervals); empty for one seed."""
    kl_sequence: Cell | None = None
    """Off-task KL per sequence: the mean over rows of each row's KL summed over its tokens."""

    def as_dict(self) -> dict[str, Any]:
        def d(c: Cell | None) -> dict[str, Any] | None:
            return None if c is None else c.as_dict()

        out = {"label": self.label, "in_domain_gain_pass@1": d(self.gain), "heldout_change_pass@1": d(self.heldout),
               "offtask_kl_per_token": d(self.kl), "offtask_kl_per_sequence": d(self.kl_sequence),
               "relative_l2": self.relative_l2}
        if self.per_seed:
            out["per_seed"] = {k: r.as_dict() for k, r in self.per_seed.items()}
        return out


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
                "units": {"gain/change": "fraction (report.md shows percentage points)",
                          "offtask_kl_per_token": "nats/token (mean over rows of each row's token mean)",
                          "offtask_kl_per_sequence": "nats/response (mean over rows of each row's sum over tokens)"},
                "rows": {r.method: r.as_dict() for r in self.rows}}


def _offtask_index(exp: Experiment) -> dict[str, Any] | None:
    try:
        raw = json.loads((exp.root / EXPERIMENT_FILE).read_text())
    except (OSError, ValueError):
        return None
    index = raw.get("offtask") if isinstance(raw, dict) else None
    return index if isinstance(index, dict) and isinstance(index.get("methods"), dict) else None


@dataclass(frozen=True)
class OfftaskRun:
    """One off-task file: per row id, the mean token KL and the KL summed over tokens; the relative L2 drift."""

    per_token: dict[str, float]
    per_sequence: dict[str, float]
    relative_l2: float | None


def _read_run(path: Path) -> OfftaskRun | None:
    """One off-task file's per-row figures (None: unreadable)."""
    try:
        data = json.loads(path.read_text())
        rows = [(str(r["id"]), float(r["kl_sum"]), int(r["tokens"])) for r in data["rows"]]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    rel = data.get("relative_l2")
    return OfftaskRun({i: kl / n for i, kl, n in rows if n > 0}, {i: kl for i, kl, n in rows if n > 0},
                      float(rel) if isinstance(rel, (int, float)) else None)


def kl_cell(runs: list[dict[str, float]], level: float, seed: int) -> Cell | None:
    """Mean over rows of a per-row KL figure (mean over seeds) with its interval (see the module docstring)."""
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
        kl, kl_seq, rel, by_seed = None, None, None, {}
        entry = (index or {}).get("methods", {}).get(m)
        if entry is not None:
            files = {None: entry["file"]} if "file" in entry else dict(sorted(entry.get("seeds", {}).items()))
            runs = {s: _read_run(exp.root / f) for s, f in files.items()}
            if runs and all(r is not None for r in runs.values()):
                kl = kl_cell([r.per_token for r in runs.values()], level, boot_seed)  # type: ignore[union-attr]
                kl_seq = kl_cell([r.per_sequence for r in runs.values()], level, boot_seed)  # type: ignore[union-attr]
                rels = [r.relative_l2 for r in runs.values() if r.relative_l2 is not None]  # type: ignore[union-attr]
                rel = float(np.mean(rels)) if rels else None
                by_seed = {str(s): r for s, r in runs.items() if s is not None}
            else:
                notes.append(f"{exp.label(m)}: an off-task file of {list(files.values())} is missing or unreadable")
        elif index is not None:
            notes.append(f"{exp.label(m)}: no off-task KL in experiment.json")
        row = DriftRow(m, exp.label(m), paired_difference(exp, m, base, in_domain, "pass@1") if in_domain else None,
                       paired_difference(exp, m, base, held, "pass@1") if held else None, kl, rel,
                       kl_sequence=kl_seq)
        if len(exp.seed_keys(m)) > 1:
            row.per_seed = _per_seed(exp, m, base, in_domain, held, by_seed, level, boot_seed)
        rows.append(row)
    return DriftTable(rows, in_domain, held, index, notes)


def _per_seed(exp: Experiment, m: str, base: str, in_domain: list[str], held: list[str],
              kl_runs: dict[str, OfftaskRun], level: float, boot_seed: int) -> dict[str, DriftRow]:
    """``m``'s row on each of its training seeds alone (problem-only intervals)."""
    gains = dict(per_seed_differences(exp, m, base, in_domain, "pass@1")) if in_domain else {}
    helds = dict(per_seed_differences(exp, m, base, held, "pass@1")) if held else {}
    out = {}
    for s in exp.seed_keys(m):
        run = kl_runs.get(s)
        out[s] = DriftRow(m, f"{exp.label(m)} (seed {s})", gains.get(s), helds.get(s),
                          None if run is None else kl_cell([run.per_token], level, boot_seed),
                          None if run is None else run.relative_l2,
                          kl_sequence=None if run is None else kl_cell([run.per_sequence], level, boot_seed))
    return out


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


def drift_rows(table: DriftTable, per_seed: bool = False) -> tuple[list[str], list[list[str]]]:
    """Header and rows for Markdown and LaTeX (pp for Pass@1, nats per token for KL); ``per_seed``: one
    row per (method, training seed) instead of one per method."""
    header = ["Method", "In-domain Pass@1 gain (pp)", "Held-out Pass@1 change (pp)",
              "Off-task KL per sequence (nats/response)", "Off-task KL per token (nats/token)", "Relative L2 drift"]
    rows = [r for row in table.rows for r in row.per_seed.values()] if per_seed else table.rows
    return header, [[r.label, _pp(r.gain), _pp(r.heldout), _kl(r.kl_sequence), _kl(r.kl),
                     "–" if r.relative_l2 is None else f"{r.relative_l2:.3e}"] for r in rows]


def seeds_text(table: DriftTable) -> list[str]:
    """The per-seed table (Markdown lines), or nothing when no method has several training seeds."""
    if not any(r.per_seed for r in table.rows):
        return []
    from esreason.report import markdown

    return ["Per training seed (intervals over problems and off-task rows only: evaluation noise, not the "
            "variance between training runs):", "", markdown.simple_markdown(*drift_rows(table, per_seed=True)), ""]


def caption(table: DriftTable) -> str:
    off = table.offtask or {}
    src = (f"{off.get('rows')} off-task rows ({off.get('source')}, {off.get('tokens')} scored tokens)"
           if off else "no off-task set")
    return (f"Gain vs forgetting. In-domain gain: Pass@1 minus Base averaged over "
            f"{', '.join(table.in_domain) or 'none'}; "
            f"held-out change: the same over {', '.join(table.held_out) or 'none'} (95% paired intervals). Off-task "
            f"{off.get('direction', 'KL(base || tuned)')} over {src}: per sequence, the mean over rows of each row's "
            f"KL summed over its tokens (nats per response; the sequence-level KL on the base model's samples); per "
            f"token, the mean over rows of each row's mean token KL (nats per token, length-normalised); each with a "
            f"95% interval over rows (and training seeds, with several). Relative L2: ||theta - theta_0|| / "
            f"||theta_0||.")


def drift_section(table: DriftTable | None, files: dict[str, Path], tex: dict[str, str]) -> list[str]:
    """The report's section 9 (Markdown lines)."""
    out = ["## 9. Gain vs forgetting (off-task drift)", "",
           "How much each method gained in-domain against what it lost elsewhere: held-out Pass@1 (tasks "
           "outside training) and the KL divergence from the base model on off-task text, per sequence and per "
           "token (docs/offtask.md).",
           ""]
    if table is None:
        return out + ["_Not available (needs a base method and a trained method)._", ""]
    from esreason.report import markdown

    out += [markdown.simple_markdown(*drift_rows(table)), "", caption(table), ""] + seeds_text(table)
    if "drift" in files:
        out += [markdown.image(files["drift"].name, "gain vs forgetting"), ""]
    if TABLE in tex:
        out += [f"LaTeX: [`{tex[TABLE]}`]({tex[TABLE]})", ""]
    return out
