"""Tables, JSON payload and figure of ``esreason analyze estimator``.

The two tables follow the paper's table "Local subtraction diagnostic"
(tab:app-estimator-diagnostic):

(a) objective comparison at one sigma (paper: 1e-3): Objective | Evaluation coupling |
    Corr(X+,X0) | kappa_base | Corr(X+,X-) | kappa_pair;
(b) perturbation-scale sweep for the regenerated-rollout reward: sigma | Seed coupling | same four.

A third table gives every objective at every sigma (the paper only shows (a) and (b)), with
the pooled n and, for regenerated rollouts, how often a perturbed response equals the
centre's. The figure plots kappa_base and kappa_pair against sigma for every objective.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from esreason.analysis.estimator.diagnostic import DiagnosticResult
from esreason.analysis.estimator.stats import DiagnosticStats
from esreason.analysis.tables import Table, fmt

COUPLING_LABELS = {"common": "Common seed", "independent": "Independent seed",
                   "fixed batch": "Fixed batch", "fixed rollout": "Fixed rollout"}
FIXED_LABELS = {"logprob": "Mean token log-probability", "seqloss": "Policy sequence loss",
                "grpo": "GRPO surrogate"}
ROW_ORDER = ("reward", "ce", "logprob", "seqloss", "grpo")


def objective_label(result: DiagnosticResult, objective: str) -> str:
    s = result.settings
    if objective == "reward":
        return f"{s.task} regenerated-rollout reward"
    if objective == "ce":
        return "SST-2 supervised CE" if s.supervised == "sst2" else f"{s.task} supervised CE"
    return FIXED_LABELS[objective]


def fmt_stat(x: float | None) -> str:
    """Four decimals like the paper; ratios below 5e-5 (which would print as 0.0000) in scientific notation."""
    if x is not None and x != 0 and abs(x) < 5e-5:
        return f"{x:.1e}"
    return fmt(x)


def _cells(st: DiagnosticStats) -> list[str]:
    return [fmt_stat(st.corr_base), fmt_stat(st.kappa_base), fmt_stat(st.corr_pair), fmt_stat(st.kappa_pair)]


def _keys(result: DiagnosticResult, sigma_label: str) -> list[tuple[str, str, str]]:
    keys = [k for k in result.observations if k[2] == sigma_label]
    return sorted(keys, key=lambda k: (ROW_ORDER.index(k[0]), k[1] != "common"))


def _table_sigma_label(result: DiagnosticResult) -> str:
    return next(lab for lab, v in result.settings.sigmas if v == result.settings.table_sigma)


def estimator_report(result: DiagnosticResult) -> tuple[list[Table], dict[str, Any]]:
    """The paper's tables (a) and (b), the full grid, and the JSON payload."""
    s = result.settings
    stats = result.stats()
    cols4 = ["Corr(X+,X0)", "κ_base", "Corr(X+,X-)", "κ_pair"]
    lab_a = _table_sigma_label(result)
    caption = ("κ_base = Var(X+ − X0)/Var(X+), κ_pair = Var(X+ − X-)/Var(X+) (paper Eq. app-raw-variance-ratios); "
               "lower is better, below 1 subtraction reduces variance. Statistics pool observations over prompts, "
               f"generation seeds and {s.directions} directions. Model {s.model}, task {s.task}.")
    a = Table(f"(a) Objective comparison at σ={lab_a}", ["Objective", "Evaluation coupling"] + cols4,
              caption=caption, align="llrrrr")
    for key in _keys(result, lab_a):
        a.add(objective_label(result, key[0]), COUPLING_LABELS[key[1]], *_cells(stats[key]))
    tables = [a]
    if "reward" in s.objectives:
        b = Table(f"(b) Perturbation-scale sweep for {s.task} regenerated-rollout reward",
                  ["σ", "Seed coupling"] + cols4, caption=caption, align="llrrrr")
        for lab, _ in s.sigmas:
            for c in s.couplings:
                b.add(lab, c.capitalize(), *_cells(stats[("reward", c, lab)]))
        tables.append(b)
    full = Table("All objectives and scales", ["σ", "Objective", "Coupling", "n"] + cols4 + ["identical to centre"],
                 caption="n: pooled observations. Identical to centre: share of regenerated responses at θ±σε equal "
                         "to the centre response of the same prompt and seed row.", align="lllrrrrrr")
    for lab, _ in s.sigmas:
        for key in _keys(result, lab):
            same = result.identical.get((key[1], lab)) if key[0] == "reward" else None
            full.add(lab, objective_label(result, key[0]), COUPLING_LABELS[key[1]], stats[key].n,
                     *_cells(stats[key]), "--" if same is None else f"{100 * same:.1f}%")
    tables.append(full)
    return tables, payload(result, stats)


def payload(result: DiagnosticResult, stats: dict[tuple[str, str, str], DiagnosticStats]) -> dict[str, Any]:
    s = result.settings
    rows = []
    for lab, value in s.sigmas:
        for key in _keys(result, lab):
            st = stats[key]
            rows.append({"objective": key[0], "label": objective_label(result, key[0]), "coupling": key[1],
                         "sigma": lab, "sigma_value": value, **st.__dict__,
                         "identical_to_centre": result.identical.get((key[1], lab)) if key[0] == "reward" else None})
    return {"analysis": "estimator", "settings": s.to_json(), "table_sigma": _table_sigma_label(result),
            "results": rows, "facts": result.facts, "notes": list(result.notes)}


def save_observations(result: DiagnosticResult, path: str | Path) -> Path:
    """Every X+, X0, X- array ([D, P, S] float64) in one .npz, keyed 'objective|coupling|sigma|plus' etc."""
    path = Path(path)
    arrays = {}
    for (o, c, lab), obs in result.observations.items():
        for part in ("plus", "zero", "minus"):
            arrays[f"{o}|{c}|{lab}|{part}"] = np.ascontiguousarray(getattr(obs, part))
    tmp = path.with_name(f".tmp-{path.name}")
    with open(tmp, "wb") as fh:
        np.savez(fh, **arrays)
    tmp.replace(path)
    return path


def plot_kappas(result: DiagnosticResult, path: str | Path) -> Path:
    """κ_base and κ_pair against σ (log-log), one line per objective/coupling; κ = 1 dashed."""
    from esreason.analysis.figures import plt, save_figure

    stats = result.stats()
    sigmas = list(result.settings.sigmas)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    series: dict[tuple[str, str], list[tuple[float, DiagnosticStats]]] = {}
    for (o, c, lab), st in stats.items():
        series.setdefault((o, c), []).append((dict(sigmas)[lab], st))
    styles = {"common": "-", "independent": "--", "fixed batch": "-.", "fixed rollout": ":"}
    positive = [getattr(st, a) for st in stats.values() for a in ("kappa_base", "kappa_pair")
                if getattr(st, a) is not None and getattr(st, a) > 0]
    floor = min(positive) / 10 if positive else 1e-6  # kappa = 0 exactly is drawn here (log axis)
    any_zero = False
    for ax, attr, title in ((axes[0], "kappa_base", "κ_base = Var(X+ − X0) / Var(X+)"),
                            (axes[1], "kappa_pair", "κ_pair = Var(X+ − X−) / Var(X+)")):
        for (o, c), pts in sorted(series.items(), key=lambda kv: (ROW_ORDER.index(kv[0][0]), kv[0][1])):
            pts = sorted((x, getattr(st, attr)) for x, st in pts if getattr(st, attr) is not None)
            any_zero |= any(k == 0 for _, k in pts)
            label = objective_label(result, o) + ("" if c.startswith("fixed") else f" ({c})")
            ax.plot([x for x, _ in pts], [max(k, floor) for _, k in pts], marker="o",
                    linestyle=styles.get(c, "-"), label=label)
        ax.axhline(1.0, color="grey", linestyle="--", linewidth=1.0)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("σ (perturbation scale)")
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3, which="both")
    if any_zero:
        axes[0].text(0.01, 0.01, f"κ = 0 exactly is drawn at {floor:.0e}", transform=axes[0].transAxes,
                     fontsize=7, va="bottom")
    axes[0].set_ylabel("variance ratio (below 1: subtraction reduces variance)")
    axes[1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    s = result.settings
    fig.suptitle(f"Local subtraction diagnostic: {s.model}, {s.task}, {s.directions} directions", fontsize=11)
    return save_figure(fig, path)


__all__ = ["estimator_report", "objective_label", "payload", "plot_kappas", "save_observations"]
