"""Figures of the weight analyses (PNG files; backend and saving in :mod:`esreason.analysis.figures`).

- :func:`plot_update_histogram`: distribution of |Delta theta| on a log axis, one line per
  checkpoint, thresholds tau as vertical lines (supports paper §RQ2 "magnitude sparsity").
- :func:`plot_threshold_sweep`: Pass@1 against update sparsity (paper Figure
  "update-sparsity-accuracy": base model as a dashed line and as the endpoint at 100%).
- :func:`plot_category_counts`: categories of the top-k updates and of the maxima, per
  checkpoint (paper §RQ2 localisation paragraph).
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

from matplotlib.ticker import MaxNLocator

from esreason.analysis.figures import plt
from esreason.analysis.figures import save_figure as _save


def plot_update_histogram(hists: Mapping[str, tuple[Sequence[float], Sequence[int]]],
                          taus: Sequence[tuple[str, float]], path: str | Path, title: str = "") -> Path:
    """hists: {label: (edges, counts)} with counts = [under, bins..., over] as in DriftResult.

    y is the share of changed coordinates per bin (each curve sums to 1 over its bins),
    so checkpoints with different numbers of changes compare directly.
    """
    fig, ax = plt.subplots(figsize=(8, 4))
    lo_all, hi_all = None, None
    for label, (edges, counts) in hists.items():
        inner = list(counts[1:-1])
        total = sum(counts)
        if total == 0:
            ax.plot([], [], label=f"{label} (no changed coordinates)")
            continue
        share = [c / total for c in inner]
        nz = [i for i, c in enumerate(inner) if c]
        lo, hi = max(nz[0] - 2, 0), min(nz[-1] + 3, len(inner))
        lo_all = lo if lo_all is None else min(lo_all, lo)
        hi_all = hi if hi_all is None else max(hi_all, hi)
        ax.stairs(share, edges, label=label, linewidth=1.4)
        if counts[0] or counts[-1]:
            ax.text(0.01, 0.97, f"{label}: {counts[0]} below {edges[0]:g}, {counts[-1]} above {edges[-1]:g}",
                    transform=ax.transAxes, fontsize=7, va="top")
    edges0 = next(iter(hists.values()))[0] if hists else [1e-16, 1e2]
    if lo_all is not None:
        ax.set_xlim(edges0[lo_all], edges0[hi_all])
    for lab, tau in taus:
        ax.axvline(tau, color="grey", linestyle=":", linewidth=0.9)
        ax.text(tau, 0.02, f"τ={lab}", rotation=90, va="bottom", ha="right", fontsize=7,
                transform=ax.get_xaxis_transform(), color="dimgrey")
    ax.set_xscale("log")
    ax.set_xlabel("|Δθ| (log scale; zero changes excluded)")
    ax.set_ylabel("share of changed coordinates per bin")
    ax.set_title(title or "Distribution of update magnitudes")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    ax.grid(alpha=0.3, which="both", axis="x")
    return _save(fig, path)


def plot_threshold_sweep(points: Sequence[tuple[float, float, str]], base_pass1: float | None,
                         path: str | Path, title: str = "") -> Path:
    """points: (update sparsity %, Pass@1 %, label) for Full ES and each tau, in order.

    The base model is drawn as a dashed horizontal line and joined as the endpoint at
    100% sparsity (everything reset to the base), as in the paper's figure.
    """
    fig, ax = plt.subplots(figsize=(6, 4))
    xs = [p[0] for p in points]
    ys = [p[1] for p in points]
    if base_pass1 is not None:
        xs_line, ys_line = xs + [100.0], ys + [base_pass1]
        ax.axhline(base_pass1, color="grey", linestyle="--", linewidth=1.0, label=f"Base model ({base_pass1:.2f})")
    else:
        xs_line, ys_line = xs, ys
    ax.plot(xs_line, ys_line, marker="o", color="tab:blue", label="Magnitude-thresholded ES")
    if base_pass1 is not None:
        ax.plot([100.0], [base_pass1], marker="s", color="grey", linestyle="none")
    for x, y, lab in points:
        ax.annotate(lab, (x, y), textcoords="offset points", xytext=(0, 6), ha="center", fontsize=7)
    ax.set_xlim(-3, 103)
    ax.set_xlabel("Update sparsity s_τ (%)")
    ax.set_ylabel("Pass@1 (%)")
    ax.set_title(title or "Pass@1 across update-sparsity levels")
    ax.legend(fontsize=8, loc="lower left")
    ax.grid(alpha=0.3)
    return _save(fig, path)


def plot_category_counts(groups: Mapping[str, Mapping[str, Mapping[str, int]]], path: str | Path,
                         title: str = "") -> Path:
    """groups: {panel title: {checkpoint label: {category: count}}} -> one bar panel each."""
    panels = list(groups.items())
    fig, axes = plt.subplots(1, max(len(panels), 1), figsize=(5.5 * max(len(panels), 1), 3.8), squeeze=False)
    for ax, (panel, by_label) in zip(axes[0], panels):
        cats: list[str] = []
        for counts in by_label.values():
            cats += [c for c in counts if c not in cats]
        n = max(len(by_label), 1)
        width = 0.8 / n
        for j, (label, counts) in enumerate(by_label.items()):
            xs = [i + (j - (n - 1) / 2) * width for i in range(len(cats))]
            ax.bar(xs, [counts.get(c, 0) for c in cats], width=width, label=label)
        ax.set_xticks(range(len(cats)))
        ax.set_xticklabels(cats, rotation=30, ha="right", fontsize=8)
        ax.set_ylabel("coordinates")
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_title(panel, fontsize=9)
        if by_label:
            ax.legend(fontsize=8)
        ax.grid(alpha=0.3, axis="y")
    if title:
        fig.suptitle(title)
    return _save(fig, path)
