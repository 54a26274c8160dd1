"""The gain-vs-forgetting figure: in-domain Pass@1 gain (y) against off-task KL and held-out change (x).

Left panel: off-task KL(base || tuned) in nats per token (x) vs in-domain Pass@1 gain over Base in
percentage points (y). Right panel: held-out Pass@1 change (x, negative = forgotten) vs the same gain.
Base sits at the origin of both. Whiskers: the 95 % intervals of :mod:`esreason.report.drift` on both
axes. A method keeps its colour and marker from the other figures (:func:`esreason.report.plots.styles`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

from esreason.report.drift import DriftRow, DriftTable
from esreason.report.plots import Style, _legend, _method_handles, _save, plt

FILE = "gain_vs_forgetting.png"


def _err(cell, scale: float) -> tuple[float, list[list[float]] | None]:
    """(value, [[minus], [plus]] whisker lengths or None), times ``scale``."""
    v = scale * cell.value
    if cell.low is None or cell.high is None:
        return v, None
    return v, [[max(0.0, v - scale * cell.low)], [max(0.0, scale * cell.high - v)]]


def _panel(ax, rows: list[DriftRow], style: Mapping[str, Style], x_of, x_scale: float, xlabel: str) -> None:
    ax.axhline(0, color="#999999", linewidth=0.8, zorder=0)
    ax.axvline(0, color="#999999", linewidth=0.8, zorder=0)
    ax.plot([0], [0], marker="o", color="#7f7f7f", markersize=7, linestyle="none", zorder=3)
    ax.annotate("Base", (0, 0), textcoords="offset points", xytext=(5, -11), fontsize=8, color="#555555")
    for r in rows:
        xc = x_of(r)
        if xc is None or r.gain is None or xc.value is None or r.gain.value is None:
            continue
        s = style[r.method]
        x, xerr = _err(xc, x_scale)
        y, yerr = _err(r.gain, 100.0)
        ax.errorbar([x], [y], xerr=xerr, yerr=yerr, marker=s.marker, color=s.color, markersize=8,
                    linestyle="none", capsize=3, elinewidth=1.2, zorder=4)
        ax.annotate(s.label, (x, y), textcoords="offset points", xytext=(6, 5), fontsize=9, color=s.color)
    ax.set_xlabel(xlabel, fontsize=10)
    ax.set_ylabel("in-domain Pass@1 gain over Base (pp)", fontsize=10)
    ax.grid(alpha=0.3)
    ax.margins(x=0.2, y=0.15)


def plot_drift(table: DriftTable, style: Mapping[str, Style], path: Path, title: str = "") -> Path | None:
    """Draw the figure (None when no method has an in-domain gain to place)."""
    rows = [r for r in table.rows if r.gain is not None and r.gain.value is not None]
    if not rows:
        return None
    panels = []
    if any(r.kl is not None for r in rows):
        panels.append((lambda r: r.kl, 1.0, "off-task KL(base || tuned), nats per token"))
    if any(r.heldout is not None for r in rows):
        panels.append((lambda r: r.heldout, 100.0, "held-out Pass@1 change vs Base (pp)"))
    if not panels:
        return None
    fig, axes = plt.subplots(1, len(panels), figsize=(5.6 * len(panels), 4.6), squeeze=False)
    fig.subplots_adjust(wspace=0.3, top=0.86, bottom=0.16)
    for ax, (x_of, scale, xlabel) in zip(axes[0], panels):
        _panel(ax, rows, style, x_of, scale, xlabel)
    if title:
        fig.suptitle(title, fontsize=11)
    _legend(fig, _method_handles([r.method for r in rows], style), ncol=min(len(rows), 5))
    return _save(fig, Path(path))
