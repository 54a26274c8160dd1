"""Reports of ``esreason experiment sweep``: checkpoint table (markdown, LaTeX), held-out
endpoint table and the trajectory plot (paper appendix "Population-Size Scaling
Trajectories"). Pure formatting and plotting: the runs and the smoothing live in
:mod:`esreason.experiments.sweep` and :mod:`esreason.experiments.smoothing`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from esreason.experiments.smoothing import PAPER_BETA, CheckpointTable

HELDOUT_METRICS = ("greedy_acc", "pass@", "maj@")
"""Prefixes of the held-out metrics in heldout.md / sweep.json (all of them: RUN/eval/<suite>/summary.json)."""


@dataclass(frozen=True)
class Trajectory:
    """Per-update mean reward x_t (t = 1..T), its smoothing s_t and the residual band."""

    raw: np.ndarray
    smoothed: np.ndarray
    band: np.ndarray


def _num(x: float | None, digits: int = 4) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def table_markdown(table: CheckpointTable, param: str) -> str:
    """Checkpoint table: smoothed reward per update and value; within-tolerance cells marked."""
    head = [f"{lab} (ref.)" if lab == table.reference else lab for lab in table.labels]
    lines = [f"| update | {' | '.join(head)} |", "|---:|" + "---:|" * len(head)]
    for u, row in zip(table.updates, table.cells):
        cells = []
        for lab, c in zip(table.labels, row):
            text = f"**{_num(c.smoothed)}** ✓" if c.within else _num(c.smoothed)
            if c.gap is not None and lab != table.reference:
                text += f" (gap {c.gap:+.4f})"
            cells.append(text)
        lines.append(f"| {u} | {' | '.join(cells)} |")
    note = (f"Smoothed mean reward (debiased EMA, weight {PAPER_BETA}) for {param}. "
            f"✓ and bold: within {table.tolerance:g} of the reference; gap = reference - value.")
    return "\n".join(lines) + "\n\n" + note + "\n"


def table_latex(table: CheckpointTable, param: str) -> str:
    """The paper's table style: ``\\cellcolor{gray!25}`` on values within tolerance of the reference.

    Needs ``\\usepackage{booktabs}`` and ``\\usepackage[table]{xcolor}``.
    """
    def esc(s: str) -> str:
        return s.replace("_", r"\_").replace("%", r"\%").replace("&", r"\&")

    head = [f"{esc(lab)} (ref.)" if lab == table.reference else esc(lab) for lab in table.labels]
    rows = []
    for u, row in zip(table.updates, table.cells):
        cells = [r"\cellcolor{gray!25}{" + _num(c.smoothed) + "}" if c.within else _num(c.smoothed) for c in row]
        rows.append(f"        {u} & " + " & ".join(cells) + r" \\")
    gaps = []
    if table.reference is not None:
        for u, row in zip(table.updates, table.cells):
            cells = ["--" if lab == table.reference or c.gap is None else f"{c.gap:+.4f}"
                     for lab, c in zip(table.labels, row)]
            gaps.append(f"        {u} & " + " & ".join(cells) + r" \\")
    body = [r"% esreason experiment sweep; needs \usepackage{booktabs} and \usepackage[table]{xcolor}",
            r"\begin{tabular}{l" + "c" * len(table.labels) + "}", r"    \toprule",
            f"    Update & {' & '.join(head)} " + r"\\", r"    \midrule", *rows]
    if gaps:
        body += [r"    \midrule", r"    \multicolumn{" + str(len(table.labels) + 1) + r"}{l}{Gap to reference} \\",
                 *gaps]
    caption = (f"% Smoothed mean reward ({esc(param)}), debiased exponential smoothing with weight {PAPER_BETA}; "
               f"shading: within {table.tolerance:g} of the reference.")
    return "\n".join(body + [r"    \bottomrule", r"\end{tabular}", caption]) + "\n"


def heldout_rows(summaries: Mapping[str, Any]) -> list[tuple[str, str, dict[str, dict[str, Any]]]]:
    """(task, metric, {label: estimate dict}) for the headline held-out metrics of every endpoint."""
    from esreason.eval.aggregate import AVERAGE

    first = next(iter(summaries.values()))
    tasks = list(first.tasks) + ([AVERAGE] if len(first.tasks) > 1 else [])
    names = [n for n in first.names if n.startswith(HELDOUT_METRICS) and not n.endswith("_expected")]
    return [(t, n, {lab: s.estimates[t][n].as_dict() for lab, s in summaries.items()})
            for t in tasks for n in names]


def heldout_markdown(rows: Sequence[tuple[str, str, dict[str, dict[str, Any]]]], reference: str) -> str:
    labels = list(rows[0][2]) if rows else []
    head = [f"{lab} (ref.)" if lab == reference else lab for lab in labels]
    lines = [f"| task | metric | {' | '.join(head)} |", "|---|---|" + "---:|" * len(labels)]
    for task, metric, ests in rows:
        cells = []
        for lab in labels:
            e = ests[lab]
            ci = f" [{e['ci_low']:.3f}, {e['ci_high']:.3f}]" if e.get("ci_low") is not None else ""
            cells.append(f"{_num(e['value'], 3)}{ci}")
        name = "average" if task.startswith("__") else task
        lines.append(f"| {name} | {metric} | {' | '.join(cells)} |")
    return "\n".join(lines) + "\n\nEndpoint evaluation; brackets: 95% bootstrap interval over problems.\n"


def plot_trajectories(trajs: Mapping[str, Trajectory], reference: str, param: str, checkpoints: Sequence[int],
                      window: int, path: Path, seeds: Mapping[str, Sequence[np.ndarray]] | None = None) -> Path:
    """Smoothed reward vs update, one line per value, shaded s_t +- local std of x_t - s_t;
    ``seeds[value]``: each training seed's smoothed reward (thin lines of the value's colour)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    styles = ("-", "--", "-.", ":")
    longest = max(len(t.raw) for t in trajs.values())
    for i, (label, tr) in enumerate(trajs.items()):
        x = np.arange(1, len(tr.raw) + 1)
        name = f"{label} (ref.)" if label == reference else label
        (line,) = ax.plot(x, tr.smoothed, styles[i % len(styles)], lw=2.2 if label == reference else 1.6,
                          label=f"{param}={name}")
        ax.fill_between(x, tr.smoothed - tr.band, tr.smoothed + tr.band, color=line.get_color(), alpha=0.18, lw=0)
        for run in (seeds or {}).get(label, []):
            ax.plot(np.arange(1, len(run) + 1), run, color=line.get_color(), lw=0.6, alpha=0.6)
    for u in checkpoints:
        if u <= longest:
            ax.axvline(u, color="0.6", lw=0.8, ls=":")
    ax.set_xlabel("update")
    ax.set_ylabel("smoothed mean reward")
    ax.set_title(f"{param}: debiased EMA (weight {PAPER_BETA}); band ±1 local std of raw − smoothed "
                 f"(window {window})" + ("; thin: one training seed" if any((seeds or {}).values()) else ""),
                 fontsize=9)
    ax.set_xlim(1, max(longest, 2))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    from esreason.io import atomic_save_figure

    return atomic_save_figure(fig, path)
