"""Which figures a report draws, from what data (drawing itself: :mod:`esreason.report.plots`)."""

from __future__ import annotations

from pathlib import Path

from esreason.report import plots
from esreason.report.compute import Parts
from esreason.report.load import REFERENCE_ROLES, Experiment, evaluated
from esreason.report.tables import table_tasks


def draw_figures(exp: Experiment, parts: Parts, out: Path) -> tuple[dict[str, Path], list[str]]:
    """Draw every figure that has data into ``out``; (figure key -> PNG path, notes on what was left out)."""
    methods = evaluated(exp)
    style = plots.styles({m: exp.label(m) for m in exp.methods}, {m: s.role for m, s in exp.methods.items()})
    names = plots.file_names()
    files: dict[str, Path] = {}
    notes: list[str] = []
    title = f"{exp.name} ({exp.model})" if exp.model else exp.name
    tasks, _ = table_tasks(exp, methods)

    reference = [m for m in methods if exp.methods[m].role in REFERENCE_ROLES]
    pairs = [(a, b) for a, b in exp.pairs if b in tasks]
    notes += [f"pair {a} -> {b}: no results for {b}; left out of the bar chart" for a, b in exp.pairs if b not in tasks]
    if pairs and reference:
        metrics = [f"pass@{k}" for k in exp.ks]
        cells = {(m, t, metric): c for m in reference for _, t in pairs for metric in metrics
                 if (c := exp.cell(m, t, metric)) is not None}
        files["bars"] = plots.plot_pair_bars(pairs, metrics, cells, reference, style, out / names["bars"],
                                             f"Train → test pairs: {title}")
    elif not exp.pairs:
        notes.append("no train->test pairs in experiment.json; no bar chart")

    if parts.profiles:
        files["profiles"] = plots.plot_profiles(parts.profiles, methods, style, out / names["profiles"],
                                                f"Pass@K over K: {title}")
    if parts.panels:
        files["pareto"] = plots.plot_pareto(parts.panels, style, out / names["pareto"],
                                            f"Pass@1 vs Pass@{parts.panels[0].k} Pareto fronts: {title}")
    if parts.drift is not None:
        from esreason.report.drift_plot import plot_drift

        drawn = plot_drift(parts.drift, style, out / names["drift"], f"Gain vs forgetting: {title}")
        if drawn is not None:
            files["drift"] = drawn
    if parts.curves is not None:
        files["training"] = plots.plot_training(parts.curves, style, out / names["training"],
                                                f"Training dynamics: {title}")
    else:
        notes.append("no training metrics found; no training-curves figure")
    return files, notes
