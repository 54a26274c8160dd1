"""The report's figures (matplotlib, Agg backend, PNG).

- :func:`plot_pair_bars`: Pass@1/K2/K3 of Base, GRPO and ES on train->test pairs with
  interval error bars (paper Figure ``fig:rq1-overview`` (c-d)).
- :func:`plot_profiles`: Pass@K over every K = 1..M the samples support (log2 axis), per task
  and on the average, one line per method, the tables' Ks marked with their intervals (the
  coverage view behind Tables ``tab:rq1-instruct-final``).
- :func:`plot_pareto`: Pass@1 vs Pass@K with the reference (Base/GRPO/ES, gray dashed)
  and full (solid dark) fronts, dominated points faded, methods at the same point nested and
  named in the corner (paper Figure ``fig:rq1-deepseek-math-pareto``).
- :func:`plot_training`: reward, held-out entropy and held-out Pass@K over updates, stage
  boundaries dotted, base model dashed (paper Figure ``fig:rq1-overview`` (a-b)).

A method keeps its colour and marker in every figure (by role: Base gray, GRPO blue, ES
red, ES->GRPO purple, GRPO->ES green; others from the default cycle).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.ticker import MaxNLocator, NullLocator  # noqa: E402

from esreason.io import atomic_save_figure  # noqa: E402
from esreason.report.curves import REWARD_KEY, REWARD_WINDOW, Curves, panel_measure, trailing_mean  # noqa: E402
from esreason.report.load import Cell  # noqa: E402
from esreason.report.pareto import ParetoPanel  # noqa: E402
from esreason.report.passk_profiles import Profile  # noqa: E402

_ROLE_STYLE = {"base": ("#7f7f7f", "o"), "grpo": ("#1f77b4", "s"), "es": ("#d62728", "^"),
               "es_grpo": ("#9467bd", "D"), "grpo_es": ("#2ca02c", "v")}
_EXTRA = ["#ff7f0e", "#8c564b", "#e377c2", "#17becf", "#bcbd22"]
_EXTRA_MARKERS = ["P", "X", "*", "h", "<"]


@dataclass(frozen=True)
class Style:
    """How a method is drawn."""

    label: str
    color: str
    marker: str


def styles(labels: Mapping[str, str], roles: Mapping[str, str | None]) -> dict[str, Style]:
    """A style per method key (roles give the paper's fixed colours; others cycle)."""
    out: dict[str, Style] = {}
    used: set[str] = set()
    extra = 0
    for key, label in labels.items():
        role = roles.get(key)
        if role in _ROLE_STYLE and role not in used:
            color, marker = _ROLE_STYLE[role]  # type: ignore[index]
            used.add(role)  # type: ignore[arg-type]
        else:
            color, marker = _EXTRA[extra % len(_EXTRA)], _EXTRA_MARKERS[extra % len(_EXTRA_MARKERS)]
            extra += 1
        out[key] = Style(label, color, marker)
    return out


def _save(fig: plt.Figure, path: Path) -> Path:
    return atomic_save_figure(fig, path)


def _grid(n: int, ncols_max: int = 3, size: tuple[float, float] = (4.2, 3.4),
          one_row_up_to: int = 4) -> tuple[plt.Figure, list[plt.Axes]]:
    """A grid of n panels: one row up to ``one_row_up_to`` panels, else rows of ``ncols_max``."""
    ncols = n if n <= one_row_up_to else ncols_max
    nrows = math.ceil(n / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(size[0] * ncols, size[1] * nrows), squeeze=False)
    # fixed spacing instead of tight_layout: one draw less per figure (bbox_inches="tight" trims)
    height = size[1] * nrows
    fig.subplots_adjust(wspace=0.3, hspace=0.55 if nrows > 1 else 0.2, top=1 - 0.65 / height,
                        bottom=0.65 / height)  # room for x labels above the legend (placed below y=0)
    flat = [ax for row in axes for ax in row]
    for ax in flat[n:]:
        ax.set_visible(False)
    return fig, flat[:n]


def _legend(fig: plt.Figure, handles: Sequence, ncol: int | None = None) -> None:
    if handles:
        fig.legend(handles=list(handles), loc="upper center", ncol=ncol or min(len(handles), 6),
                   bbox_to_anchor=(0.5, 0.0), frameon=False, fontsize=9)


def _method_handles(keys: Sequence[str], style: Mapping[str, Style], line: bool = False) -> list[Line2D]:
    return [Line2D([], [], color=style[k].color, marker=style[k].marker, linestyle="-" if line else "none",
                   label=style[k].label, markersize=7) for k in keys]


def _pct(x: float | None) -> float | None:
    return None if x is None else 100.0 * x


# ---------------------------------------------------------------------- bars


def plot_pair_bars(pairs: Sequence[tuple[str, str]], metrics: Sequence[str],
                   cells: Mapping[tuple[str, str, str], Cell], methods: Sequence[str],
                   style: Mapping[str, Style], path: Path, title: str = "") -> Path:
    """One panel per (train, test) pair: grouped bars per metric, one bar per method, CI whiskers.

    cells: ``{(method, test_task, metric): Cell}``.
    """
    fig, axes = _grid(len(pairs), ncols_max=3, size=(4.6, 3.6))
    width = 0.8 / max(len(methods), 1)
    for ax, (train, test) in zip(axes, pairs):
        for i, m in enumerate(methods):
            xs, hs, lo, hi = [], [], [], []
            for j, metric in enumerate(metrics):
                c = cells.get((m, test, metric))
                if c is None:
                    continue
                xs.append(j + (i - (len(methods) - 1) / 2) * width)
                hs.append(100 * c.value)  # type: ignore[operator]
                lo.append(100 * (c.value - c.low) if c.low is not None else 0.0)  # type: ignore[operator]
                hi.append(100 * (c.high - c.value) if c.high is not None else 0.0)  # type: ignore[operator]
            ax.bar(xs, hs, width=width * 0.95, color=style[m].color, yerr=[lo, hi], capsize=2.5,
                   error_kw={"elinewidth": 0.9, "ecolor": "#333333"}, label=style[m].label)
        ax.set_xticks(range(len(metrics)))
        ax.set_xticklabels([metric.replace("pass@", "Pass@") for metric in metrics])
        ax.set_title(f"{train} → {test}", fontsize=10)
        ax.set_ylabel("accuracy (%)")
        ax.set_ylim(0, 105)
        ax.grid(axis="y", alpha=0.3)
    if title:
        fig.suptitle(title, fontsize=11)
    _legend(fig, [plt.Rectangle((0, 0), 1, 1, color=style[m].color, label=style[m].label) for m in methods])
    return _save(fig, path)


# ---------------------------------------------------------------------- Pass@K profiles


#: Sideways distance (octaves of K) between the markers of neighbouring methods at one tabulated K.
DODGE = 0.07


def _k_ticks(ks: set[int]) -> list[int]:
    """Ticks of a log2 K axis: the powers of two up to the largest K, and the largest K itself."""
    top = max(ks)
    return sorted({2 ** i for i in range(top.bit_length()) if 2 ** i <= top} | {top})


def _percent_limits(ax: plt.Axes, values: Sequence[float], min_span: float = 5.0) -> None:
    """y limits around ``values`` (percent) inside [0, 100] plus room for a marker, at least ``min_span`` tall."""
    lo, hi = min(values), max(values)
    if hi - lo < min_span:
        hi = min(100.0, lo + min_span)
        lo = max(0.0, hi - min_span)
    pad = 0.08 * (hi - lo)
    ax.set_ylim(max(-1.5, lo - pad), min(101.5, hi + pad))


def plot_profiles(panels: Mapping[str, Mapping[str, Profile]], methods: Sequence[str],
                  style: Mapping[str, Style], path: Path, title: str = "") -> Path:
    """Pass@K against K on a log2 axis, one panel per task (and the average): a line over every K
    the profile has (1..M), the tabulated Ks as markers with their 95% interval whiskers (the
    methods' markers a little apart sideways), and one thin dotted line per training seed."""
    fig, axes = _grid(len(panels))
    seeded = False
    for ax, (label, by_method) in zip(axes, panels.items()):
        all_k: set[int] = set()
        shown: list[float] = []
        drawn = [m for m in methods if by_method.get(m) is not None and by_method[m].values]
        for m in methods:
            p = by_method.get(m)
            if p is None or not p.values:
                continue
            st = style[m]
            ks = sorted(p.values)
            all_k.update(ks)
            ys = [100 * p.values[k] for k in ks]
            ax.plot(ks, ys, color=st.color, linewidth=1.5, zorder=3)
            shown += ys
            for run in p.seeds:
                seeded = True
                sk = sorted(run)
                ax.plot(sk, [100 * run[k] for k in sk], color=st.color, linewidth=0.9, alpha=0.8, linestyle=":")
                shown += [100 * run[k] for k in sk]
            mk = sorted(p.marks)
            ys = [100 * p.marks[k].value for k in mk]  # type: ignore[operator]
            # a probability's interval ends inside [0, 100] (a continuity-corrected end can pass 0 by half a step)
            ends = [(100 * max(c.low, 0.0) if c.low is not None else y, 100 * min(c.high, 1.0) if c.high is not None
                     else y) for c, y in zip((p.marks[k] for k in mk), ys)]
            lo, hi = [max(0.0, y - a) for y, (a, _) in zip(ys, ends)], [max(0.0, b - y) for y, (_, b) in zip(ys, ends)]
            # markers of the methods side by side around K (DODGE octaves apart) so none hides another
            shift = 2 ** (DODGE * (drawn.index(m) - (len(drawn) - 1) / 2))
            ax.errorbar([k * shift for k in mk], ys, yerr=[lo, hi], color=st.color, marker=st.marker,
                        markersize=5.5, linestyle="none", markeredgecolor="white", markeredgewidth=0.6,
                        elinewidth=1.0, capsize=2.5, zorder=4)
            shown += [y - d for y, d in zip(ys, lo)] + [y + d for y, d in zip(ys, hi)]
        ax.set_xscale("log", base=2)
        if all_k:
            ticks = _k_ticks(all_k)
            ax.set_xticks(ticks)
            ax.set_xticklabels([str(k) for k in ticks])
            ax.xaxis.set_minor_locator(NullLocator())
            room = 2 ** (0.2 + DODGE * len(drawn) / 2)  # the dodged markers of K = 1 and K = M stay inside
            ax.set_xlim(1 / room, max(all_k) * room)
        if shown:
            _percent_limits(ax, shown)
        ax.set_xlabel("K (samples)")
        ax.set_ylabel("Pass@K (%)")
        ax.set_title(label, fontsize=10)
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title, fontsize=11)
    handles = _method_handles(methods, style, line=True)
    handles.append(Line2D([], [], color="#555555", marker="o", linestyle="none", markersize=5,
                          label="markers: the tables' K, 95% interval"))
    if seeded:
        handles.append(Line2D([], [], color="#7f7f7f", linestyle=":", linewidth=0.9,
                              label="one training seed (solid: mean over seeds)"))
    _legend(fig, handles, ncol=len(handles) if len(panels) >= 3 else min(len(handles), 4))  # one row where it fits
    return _save(fig, path)


# ---------------------------------------------------------------------- Pareto


def plot_pareto(panels: Sequence[ParetoPanel], style: Mapping[str, Style], path: Path, title: str = "") -> Path:
    """Pass@1 (x) vs Pass@K (y) per panel; reference front gray dashed, full front solid, dominated faded."""
    fig, axes = _grid(len(panels))
    shown: list[str] = []
    for ax, p in zip(axes, panels):
        groups: dict[tuple[float, float], list[str]] = {}
        for m, pt in p.points.items():
            groups.setdefault(pt, []).append(m)
        for i, (m, (x, y)) in enumerate(p.points.items()):
            faded = m in p.dominated_by
            # methods at the same point are drawn as nested markers, later ones smaller
            rank = groups[(x, y)].index(m)
            ax.scatter([100 * x], [100 * y], color=style[m].color, marker=style[m].marker,
                       s=max(70 + 30 * (len(groups[(x, y)]) - 1) - 30 * rank, 25), alpha=0.3 if faded else 1.0,
                       edgecolors="black" if not faded else "none", linewidths=0.6, zorder=3 + i)
            if m not in shown:
                shown.append(m)
        lines = []
        for same in groups.values():
            if len(same) > 1:  # name the methods that coincide (three labels per line, in a corner)
                labels = [style[m].label for m in same]
                lines += [" = ".join(labels[i:i + 3]) + (" =" if i + 3 < len(labels) else "")
                          for i in range(0, len(labels), 3)]
        if lines:
            ax.text(0.02, 0.98, "same point:\n" + "\n".join(lines), transform=ax.transAxes, fontsize=7,
                    va="top", ha="left", color="#333333")
        for m, seeds in p.seed_points.items():  # the spread over training seeds around the mean point
            x0, y0 = p.points[m]
            for x, y in seeds:
                ax.plot([100 * x0, 100 * x], [100 * y0, 100 * y], color=style[m].color, linewidth=0.7, alpha=0.5,
                        zorder=2)
            ax.scatter([100 * x for x, _ in seeds], [100 * y for _, y in seeds], color="white",
                       edgecolors=style[m].color, marker=style[m].marker, s=22, linewidths=1.0, zorder=2.5)
        for keys, kw in ((p.reference_front, {"color": "#999999", "linestyle": "--", "linewidth": 1.3}),
                         (p.full_front, {"color": "#222222", "linestyle": "-", "linewidth": 1.1})):
            if len(keys) > 1:
                ax.plot([100 * p.points[k][0] for k in keys], [100 * p.points[k][1] for k in keys], zorder=2, **kw)
        every = list(p.points.values()) + [q for seeds in p.seed_points.values() for q in seeds]
        xs = [100 * x for x, _ in every]
        ys = [100 * y for _, y in every]
        pad_x = max(0.5, 0.12 * (max(xs) - min(xs)))
        pad_y = max(0.5, 0.12 * (max(ys) - min(ys)))
        ax.set_xlim(min(xs) - pad_x, max(xs) + pad_x)
        ax.set_ylim(min(ys) - pad_y, max(ys) + pad_y)
        ax.set_xlabel("Pass@1 (%)")
        ax.set_ylabel(f"Pass@{p.k} (%)")
        ax.set_title(p.label, fontsize=10)
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title, fontsize=11)
    handles = _method_handles(shown, style)
    handles += [Line2D([], [], color="#999999", linestyle="--", label="front: Base/GRPO/ES"),
                Line2D([], [], color="#222222", linestyle="-", label="front: all methods"),
                Line2D([], [], color="#7f7f7f", marker="o", linestyle="none", alpha=0.3, label="dominated (faded)")]
    if any(p.seed_points for p in panels):
        handles.append(Line2D([], [], color="#7f7f7f", marker="o", markerfacecolor="white", linewidth=0.7,
                              label="one training seed (filled: mean over seeds)"))
    _legend(fig, handles, ncol=min(len(handles), 4))
    return _save(fig, path)


# ---------------------------------------------------------------------- training curves

_PANEL_TITLES = {"reward/mean": (f"Training reward (faint: per update; line: mean of last {REWARD_WINDOW})",
                                 "mean reward"),
                 "heldout/entropy": ("Held-out token entropy", "entropy (nats/token)")}


def _panel_text(key: str) -> tuple[str, str]:
    """(title, y label) of a panel. A reward panel names its measure in both: ES's greedy
    reward and GRPO's sampled reward are different measures and never share an axis."""
    measure = panel_measure(key)
    if measure is not None:
        return (f"Training reward: {measure}",
                f"mean reward, {measure.split(' (')[0]} (line: last {REWARD_WINDOW})")
    if key in _PANEL_TITLES:
        return _PANEL_TITLES[key]
    metric = key.split("/", 1)[1]
    pretty = metric.replace("pass@", "Pass@")
    return f"Held-out {pretty}", f"{pretty} (%)"


def plot_training(curves: Curves, style: Mapping[str, Style], path: Path, title: str = "") -> Path:
    """One panel per quantity, one line per method over concatenated updates."""
    keys = list(curves.panels)
    fig, axes = _grid(len(keys), ncols_max=2, size=(5.2, 3.4), one_row_up_to=2)
    methods: list[str] = []
    for ax, key in zip(axes, keys):
        percent = key.startswith("heldout/pass@")
        scale = 100.0 if percent else 1.0
        for i, s in enumerate(curves.panels[key]):
            st = style[s.method]
            # later lines thinner, so a line that coincides with an earlier one (a composition's first
            # stage replaying the same-seed run) still shows both colours
            width, size = max(3.0 - 0.5 * i, 1.0), max(6.5 - 1.0 * i, 3.0)
            if key.startswith(REWARD_KEY):  # per-update values faint, the trailing mean on top
                ax.plot(s.xs, s.ys, color=st.color, marker=st.marker, markersize=2.5, linewidth=0.8, alpha=0.3)
                ax.plot(s.xs, trailing_mean(s), color=st.color, linewidth=width, alpha=0.9, label=st.label)
            else:
                ax.plot(s.xs, [scale * y for y in s.ys], color=st.color, marker=st.marker,
                        markersize=size, linewidth=width, alpha=0.9, label=st.label)
            for b in s.boundaries:
                ax.axvline(b, color=st.color, linestyle=":", linewidth=1.1, alpha=0.8)
            if s.method not in methods:
                methods.append(s.method)
        if key in curves.base:
            ax.axhline(scale * curves.base[key], color="#555555", linestyle="--", linewidth=1.1)
        head, ylabel = _panel_text(key)
        ax.set_title(head, fontsize=10)
        ax.set_xlabel("update")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.ticklabel_format(axis="y", useOffset=False)  # plain values: "1e-5+1.018e-1" offsets read badly
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title, fontsize=11)
    handles = _method_handles(methods, style, line=True)
    if curves.base:
        handles.append(Line2D([], [], color="#555555", linestyle="--", label="base model (step 0)"))
    if any(s.boundaries for lines in curves.panels.values() for s in lines):
        handles.append(Line2D([], [], color="#555555", linestyle=":", label="stage boundary"))
    _legend(fig, handles, ncol=min(len(handles), 4))
    return _save(fig, path)


def file_names() -> dict[str, str]:
    """The PNG file name of each figure."""
    return {"bars": "pairs_bars.png", "profiles": "passk_profiles.png", "pareto": "pareto.png",
            "training": "training_curves.png", "drift": "gain_vs_forgetting.png"}

