"""``build_report``: every table, figure and finding of an experiment, written to one directory.

Outputs (default ``EXP/report/``)::

    report.md            protocol header, findings, all tables (with interval tables), figures
    report.json          every number of every table with its interval, fronts, Pass@K profiles, curves,
                         findings
    pass_at_k.tex  maj_at_k.tex  heldout_change.tex  below_base.tex  pareto_fronts.tex  offtask_drift.tex
    pairs_bars.png  passk_profiles.png  pareto.png  training_curves.png  gain_vs_forgetting.png
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from esreason.errors import UserError
from esreason.io.atomic import atomic_write_text
from esreason.report import document, latex, markdown, plots
from esreason.report.budget import budget_json
from esreason.report.compute import Parts, compute
from esreason.report.drift import TABLE as DRIFT_TABLE, caption as drift_caption, drift_rows
from esreason.report.figures import draw_figures
from esreason.report.findings import Finding
from esreason.report.load import Experiment, load_experiment

REPORT_KIND = "esreason-report"


@dataclass
class ReportResult:
    """What :func:`build_report` wrote and computed.

    files: output name -> path. tables: table name -> the dict stored in ``report.json``.
    """

    out_dir: Path
    files: dict[str, Path]
    tables: dict[str, dict[str, Any]]
    findings: list[Finding]
    notes: list[str]
    experiment: Experiment = field(repr=False)

    @property
    def markdown(self) -> Path:
        """``report.md``."""
        return self.files["markdown"]

    @property
    def json_path(self) -> Path:
        """``report.json``."""
        return self.files["json"]

    def finding(self, fid: str) -> Finding | None:
        """The finding with id ``fid`` (see :mod:`esreason.report.findings`), or None."""
        return next((f for f in self.findings if f.id == fid), None)


def _report_json(exp: Experiment, parts: Parts, files: dict[str, Path], notes: Sequence[str]) -> dict[str, Any]:
    """The content of ``report.json`` (fractions, intervals, marks, fronts, curves, findings, notes)."""
    return {
        "kind": REPORT_KIND, "version": 1,
        "experiment": {"name": exp.name, "dir": str(exp.root), "model": exp.model, "train_task": exp.train_task,
                       "in_domain": exp.in_domain, "held_out": exp.held_out, "protocol": exp.protocol,
                       "methods": {m.key: {"label": m.label, "kind": m.kind, "role": m.role,
                                           "checkpoint": m.checkpoint} for m in exp.methods.values()}},
        "tables": _tables_dict(parts),
        "pareto": [p.as_dict() for p in parts.panels],
        "passk_profiles": {label: {m: p.as_dict() for m, p in panel.items()}
                           for label, panel in parts.profiles.items()},
        "training": parts.curves.as_dict() if parts.curves else None,
        "findings": [f.as_dict() for f in parts.findings],
        "mdd": {"metric": "pass@1", "alpha": 0.05, "power": 0.8, "method": "normal approximation, "
                "(z_0.975 + z_0.8) * sd / sqrt(n); paired: sd of per-problem differences to base; unpaired: "
                "sqrt(2) * sd of base per-problem values", "tasks": [r.as_dict() for r in parts.mdd]},
        "pass1_change_vs_base": {m: {t: c.as_dict() for t, c in cells.items()} for m, cells in parts.changes.items()},
        "figures": {k: p.name for k, p in files.items() if p.suffix == ".png"},
        "budget": budget_json(exp.root),
        "conventions": {"values": "fractions in [0, 1] (the Markdown/LaTeX show x100)",
                        "marks": markdown.MARK_LEGEND,
                        "pareto": "a dominates b: >= on both axes, > on at least one (unrounded)",
                        "significance": "Holm over the family of claims, family-wise error 0.05 (report.family)",
                        "estimand": document.estimand_line(exp, exp.protocol)[2:],
                        "family": document.family_line()[2:],
                        "stability": document.stability_line(exp.bootstrap_settings()[1])[2:]},
        "notes": list(notes),
    }


def _tables_dict(parts: Parts) -> dict[str, dict[str, Any]]:
    out = {t.name: t.as_dict() for t in (parts.pass_table, parts.maj_table, parts.change) if t is not None}
    if parts.below is not None:
        out["below_base"] = parts.below.as_dict()
    if parts.drift is not None:
        out[DRIFT_TABLE] = parts.drift.as_dict()
    return out


def _write_tex(exp: Experiment, parts: Parts, out: Path) -> dict[str, str]:
    """One ``.tex`` per table; returns table name -> file name."""
    written: dict[str, str] = {}
    for t in (parts.pass_table, parts.maj_table, parts.change):
        if t is not None:
            atomic_write_text(out / f"{t.name}.tex", latex.table_latex(t, f"tab:esreason-{t.name.replace('_', '-')}"))
            written[t.name] = f"{t.name}.tex"
    if parts.below is not None:
        header, rows = document.below_rows(exp, parts.below)
        atomic_write_text(out / "below_base.tex", latex.simple_latex(
            header, rows, f"Pass@K below the base model at K in {parts.below.ks}; significant: 95% paired "
                          f"bootstrap interval below 0.", "tab:esreason-below-base"))
        written["below_base"] = "below_base.tex"
    if parts.panels:
        header, rows = document.pareto_rows(exp, parts.panels)
        atomic_write_text(out / "pareto_fronts.tex", latex.simple_latex(
            header, rows, f"Pass@1-Pass@{parts.panels[0].k} Pareto fronts (a dominates b: >= on both, > on one).",
            "tab:esreason-pareto-fronts"))
        written["pareto_fronts"] = "pareto_fronts.tex"
    if parts.drift is not None:
        atomic_write_text(out / f"{DRIFT_TABLE}.tex", latex.simple_latex(
            *drift_rows(parts.drift), drift_caption(parts.drift), "tab:esreason-offtask-drift"))
        written[DRIFT_TABLE] = f"{DRIFT_TABLE}.tex"
    return written


TEX_NAMES = ("pass_at_k.tex", "maj_at_k.tex", "heldout_change.tex", "below_base.tex", "pareto_fronts.tex",
             f"{DRIFT_TABLE}.tex")


def _remove_stale(out_dir: Path, written: dict[str, Path]) -> None:
    """Delete report files of an earlier run that this run did not write (only our own file names)."""
    keep = {p.name for p in written.values()}
    for name in list(plots.file_names().values()) + list(TEX_NAMES):
        if name not in keep and (out_dir / name).is_file():
            (out_dir / name).unlink()


def build_report(directory: str | Path, out: str | Path | None = None, *, pareto_k: int | None = None,
                 large_ks: Sequence[int] | None = None, figures: bool = True) -> ReportResult:
    """Load the experiment in ``directory`` and write its report to ``out`` (default ``directory/report``).

    pareto_k: the Pass@K axis of the Pareto fronts (default: the largest protocol K).
    large_ks: the Ks of the below-base count (default: protocol Ks above 1).
    figures: False writes the tables, findings and JSON only (no PNGs; seconds faster).
    """
    exp = load_experiment(directory)
    available = sorted(set(exp.ks) | set(exp.eval_ks()))
    if pareto_k is not None and pareto_k not in available:
        raise UserError(f"--pareto-k {pareto_k}: not an evaluated K of {exp.root} (available: {available})")
    if large_ks is not None and (not large_ks or any(k not in available or k < 2 for k in large_ks)):
        raise UserError(f"--large-k {list(large_ks)}: each K must be > 1 and evaluated (available: {available})")
    out_dir = Path(out) if out is not None else exp.root / "report"
    if out_dir.exists() and not out_dir.is_dir():
        raise UserError(f"report output {out_dir} exists and is not a directory")
    from esreason.io.lock import directory_lock

    with directory_lock(out_dir, what="report directory"):  # reads need no lock; one writer per report
        return _write_report(exp, out_dir, pareto_k=pareto_k, large_ks=large_ks, figures=figures)


def _write_report(exp: Any, out_dir: Path, *, pareto_k: int | None, large_ks: Sequence[int] | None,
                  figures: bool) -> ReportResult:
    """:func:`build_report` under the report directory's lock."""
    out_dir.mkdir(parents=True, exist_ok=True)
    parts = compute(exp, pareto_k, large_ks)
    files, fig_notes = draw_figures(exp, parts, out_dir) if figures else ({}, ["figures not drawn (--no-figures)"])
    notes = list(dict.fromkeys(parts.notes + fig_notes + exp.notes))
    tex = _write_tex(exp, parts, out_dir)
    files.update({f"tex:{k}": out_dir / v for k, v in tex.items()})
    _remove_stale(out_dir, files)
    atomic_write_text(out_dir / "report.md", document.render_markdown(exp, parts, files, tex, notes))
    payload = _report_json(exp, parts, files, notes)
    atomic_write_text(out_dir / "report.json", json.dumps(payload, indent=2) + "\n")
    files["markdown"], files["json"] = out_dir / "report.md", out_dir / "report.json"
    return ReportResult(out_dir, files, payload["tables"], parts.findings, notes, exp)
