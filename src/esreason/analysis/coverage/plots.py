"""Figures of the coverage analyses: the run diagnostics (Lemmas 2-3, Proposition 1) and Lemma 1.

- :func:`plot_coverage`: ``coverage_diversity.png`` (P_pop vs P_same, JS_succ against its
  finite-sample null and its local form, Cov(w, p)) and ``coverage_prop1.png`` (the
  margin m_K against K sqrt(eps/2), and the bound on J_K(pi_theta+));
- :func:`plot_lemma1`: JS_pol against sigma on log-log axes with the Lemma 1 line and the log N ceiling.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from esreason.analysis.coverage.report import coverage_ks

def _series(rows: Sequence[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    xs, ys = [], []
    for r in rows:
        v = r.get(key)
        if isinstance(v, (int, float)) and math.isfinite(float(v)):
            xs.append(int(r["step"]))
            ys.append(float(v))
    return xs, ys


def _finish_axes(axes: Sequence[Any]) -> None:
    from matplotlib.ticker import MaxNLocator

    for a in axes:
        a.set_xlabel("update")
        a.xaxis.set_major_locator(MaxNLocator(integer=True))
        a.grid(alpha=0.3)
        a.legend(fontsize=7)


def plot_coverage(rows: Sequence[dict[str, Any]], out: Path, title: str) -> list[Path]:
    """coverage_diversity.png (Lemmas 2-3) and coverage_prop1.png (Proposition 1)."""
    from esreason.analysis.figures import plt, save_figure

    def draw(ax: Any, spec: Sequence[tuple[str, str, str]]) -> None:
        for key, label, style in spec:
            ax.plot(*_series(rows, key), style, label=label, markersize=3)

    fig, axes = plt.subplots(1, 4, figsize=(19, 4))
    draw(axes[0], (("P_pop", "P_pop (one response per member)", "-o"),
                   ("P_same", "P_same (matched single policy)", "-s"),
                   ("p_bar", "p̄ (mean member success)", "--"), ("p_centre", "p_θ (centre)", ":")))
    axes[0].set_title("Lemma 2: coverage")
    axes[0].set_ylabel("success probability (mean over prompts)")
    draw(axes[1], (("JS_succ", "JS_succ (plug-in)", "-o"), ("JS_succ_null", "permutation null", "--"),
                   ("JS_succ_excess", "excess over the null", "-^"),
                   ("JS_succ_local", "local form Σξ²/(2N p̄(1−p̄))", ":")))
    axes[1].set_title("Lemma 2: success JS (nats)")
    draw(axes[2], (("gap", "P_pop − P_same", "-o"), ("gap_null", "permutation null", "--"),
                   ("gap_local", "N p̄(1−p̄)^(N−1) JS_succ", ":")))
    axes[2].set_title("Lemma 2: coverage gap")
    draw(axes[3], (("cov_wp", "Cov_i(z_i, p_i)", "-o"), ("selection_gain", "p_w − p̄ = N Cov(w, p)", "-s"),
                   ("oracle_gain", "oracle gate gain (λ=1)", "--")))
    axes[3].axhline(0.0, color="grey", linewidth=0.8)
    axes[3].set_title("Lemma 3: reward weighting")
    _finish_axes(axes)
    fig.suptitle(title)
    paths = [save_figure(fig, out / "coverage_diversity.png")]

    ks = coverage_ks(rows)
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for n, k in enumerate(ks):
        c = colors[n % len(colors)]
        axes[0].plot(*_series(rows, f"prop1/K{k}/margin"), "-o", color=c, markersize=3, label=f"m_{k}")
        axes[0].plot(*_series(rows, f"prop1/K{k}/slack"), "--", color=c, label=f"{k}·sqrt(ε/2)")
        axes[1].plot(*_series(rows, f"prop1/K{k}/J_updated"), "-o", color=c, markersize=3, label=f"J_{k}(π_θ+)")
        axes[1].plot(*_series(rows, f"prop1/K{k}/bound"), "--", color=c, label=f"bound J_{k}(π_w) − {k}·sqrt(ε/2)")
        axes[1].plot(*_series(rows, f"prop1/K{k}/J_centre"), ":", color=c, label=f"J_{k}(π_θ)")
    axes[0].axhline(0.0, color="grey", linewidth=0.8)
    axes[0].set_title("Proposition 1: margin m_K vs K·sqrt(ε_succ/2)")
    axes[1].set_ylim(-0.05, 1.05)
    axes[1].set_title("Proposition 1: bound on J_K(π_θ+) (bounds < 0 are vacuous, clipped)")
    _finish_axes(axes)
    fig.suptitle(title)
    paths.append(save_figure(fig, out / "coverage_prop1.png"))
    return paths


def plot_lemma1(res: dict[str, Any], path: Path) -> Path:
    """Log-log plot of JS_pol against sigma with the Lemma 1 line and the log N ceiling."""
    from esreason.analysis.figures import plt, save_figure

    rows = res["rows"]
    sig = np.array([r["sigma"] for r in rows])
    js = np.array([r["js_pol"] for r in rows])
    se = np.array([r["js_pol_se"] for r in rows])
    grid = np.geomspace(sig.min() / 1.5, sig.max() * 1.5, 50)
    n = res["settings"]["population"]
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    ax.errorbar(sig, js, yerr=2 * se, fmt="o-", capsize=3, label="JS_pol (measured, ±2 s.e.)")
    ax.plot(grid, grid ** 2 / 2 * (1 - 1 / n) * res["fisher_trace"], "--",
            label="(σ²/2)(1−1/N) tr I_x (Lemma 1)")
    ax.plot(sig, [r["quad_realised"] for r in rows], "x:", label="realised quadratic (drawn ε)")
    ax.axhline(math.log(n), color="grey", linewidth=0.9, linestyle="-.", label=f"log N = {math.log(n):.2f}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("σ")
    ax.set_ylabel("nats (mean over prompts)")
    ax.set_title(f"Lemma 1 on {res['settings']['model']} (N={n}, {res['settings']['dtype']})")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    return save_figure(fig, path)


__all__ = ["plot_coverage", "plot_lemma1"]
