"""The gain-vs-forgetting figure: in-domain Pass@1 gain (y) against off-task KL and held-out change (x).

Panels, left to right: off-task KL(base || tuned) per sequence (summed over tokens, nats per response),
the same per token (length-normalised, nats per token), and the held-out Pass@1 change (negative =
forgotten), each (x) against the in-domain Pass@1 gain over Base in percentage points (y).
Base sits at the origin of both. Whiskers: the 95 % intervals of :mod:`esreason.report.drift` on both
axes; with several training seeds each seed is drawn faint with its problem-only whiskers beside the
mean over seeds (see :func:`_panel`). A method keeps its colour and marker from the other figures (:func:`esreason.report.plots.styles`).
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


def _label_offsets(xy: list[tuple[float, float]], near_x: float = 0.25, near_y: float = 0.1
                   ) -> list[tuple[int, int, str]]:
    """A label position per point (offset in points, alignment): above right, unless an earlier point lies
    within ``near_x`` / ``near_y`` of the panel's span (Base included; a label is wide, so x reaches
    further), then below left, then below right, then above left."""
    xs, ys = [0.0] + [x for x, _ in xy], [0.0] + [y for _, y in xy]
    sx, sy = (max(xs) - min(xs)) or 1.0, (max(ys) - min(ys)) or 1.0
    places = [(6, 5, "left"), (-6, -14, "right"), (6, -28, "left"), (-6, 18, "right")]
    out: list[tuple[int, int, str]] = []
    for i, (x, y) in enumerate(xy):
        crowd = sum(1 for (u, v) in xy[:i] if abs(u - x) / sx < near_x and abs(v - y) / sy < near_y)
        out.append(places[crowd % len(places)])
    return out


def _extent(cell, scale: float, whiskers: bool) -> list[float]:
    """The values a panel must show for ``cell``: its point, and its interval ends when ``whiskers``."""
    if cell is None or cell.value is None:
        return []
    ends = [cell.low, cell.high] if whiskers and cell.low is not None and cell.high is not None else []
    return [scale * v for v in [cell.value, *ends]]


def _limits(values: list[float], margin: float) -> tuple[float, float]:
    lo, hi = min(values + [0.0]), max(values + [0.0])
    pad = margin * ((hi - lo) or 1.0)
    return lo - pad, hi + pad


def _panel(ax, rows: list[DriftRow], style: Mapping[str, Style], x_of, x_scale: float, xlabel: str) -> None:
    """One panel. A method with several training seeds: each seed's point faint with its problem-only
    whiskers, and the mean over seeds solid without whiskers (its seed-level interval is in the table:
    with 2-3 seeds it spans far more than the points do and would hide them)."""
    ax.axhline(0, color="#999999", linewidth=0.8, zorder=0)
    ax.axvline(0, color="#999999", linewidth=0.8, zorder=0)
    ax.plot([0], [0], marker="o", color="#7f7f7f", markersize=7, linestyle="none", zorder=3)
    ax.annotate("Base", (0, 0), textcoords="offset points", xytext=(5, -11), fontsize=8, color="#555555")
    points, xs, ys = [], [], []
    for r in rows:
        xc = x_of(r)
        if xc is None or r.gain is None or xc.value is None or r.gain.value is None:
            continue
        s = style[r.method]
        seeds = [q for q in r.per_seed.values() if x_of(q) is not None and q.gain is not None]
        for q in seeds:
            qx, qxerr = _err(x_of(q), x_scale)
            qy, qyerr = _err(q.gain, 100.0)
            ax.errorbar([qx], [qy], xerr=qxerr, yerr=qyerr, marker=s.marker, color=s.color, markersize=5,
                        linestyle="none", capsize=2, elinewidth=0.8, alpha=0.45, zorder=3)
            xs += _extent(x_of(q), x_scale, True)
            ys += _extent(q.gain, 100.0, True)
        x, xerr = _err(xc, x_scale)
        y, yerr = _err(r.gain, 100.0)
        if seeds:  # the seed-level intervals (1-2 df at 2-3 seeds) are in the table, not drawn
            xerr = yerr = None
        ax.errorbar([x], [y], xerr=xerr, yerr=yerr, marker=s.marker, color=s.color, markersize=8,
                    linestyle="none", capsize=3, elinewidth=1.2, zorder=4)
        xs += _extent(xc, x_scale, not seeds)
        ys += _extent(r.gain, 100.0, not seeds)
        points.append((x, y, s))
    for (x, y, s), (dx, dy, ha) in zip(points, _label_offsets([(x, y) for x, y, _ in points])):
        ax.annotate(s.label, (x, y), textcoords="offset points", xytext=(dx, dy), fontsize=9, color=s.color,
                    ha=ha)
    ax.set_xlim(*_limits(xs, 0.2))
    ax.set_ylim(*_limits(ys, 0.15))
    ax.ticklabel_format(axis="x", style="sci", scilimits=(-3, 4))
    ax.set_xlabel(xlabel, fontsize=10)
    ax.set_ylabel("in-domain Pass@1 gain over Base (pp)", fontsize=10)
    ax.grid(alpha=0.3)


def plot_drift(table: DriftTable, style: Mapping[str, Style], path: Path, title: str = "") -> Path | None:
    """Draw the figure (None when no method has an in-domain gain to place)."""
    rows = [r for r in table.rows if r.gain is not None and r.gain.value is not None]
    if not rows:
        return None
    panels = []
    if any(r.kl_sequence is not None for r in rows):
        panels.append((lambda r: r.kl_sequence, 1.0,
                       "off-task KL(base || tuned) per sequence\n(summed over tokens), nats per response"))
    if any(r.kl is not None for r in rows):
        panels.append((lambda r: r.kl, 1.0, "off-task KL(base || tuned) per token\n(length-normalised), nats per token"))
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
