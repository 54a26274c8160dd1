"""Restore ablation: does subtract-to-restore manufacture drift and the LayerNorm localisation?

The paper's artifact restores the centre after each population member by subtracting
the same seeded noise. In floating point ``round(round(c + s*e) - s*e) != c``: a bf16
weight can end one (or more) lattice steps away, and those steps are largest on the
largest-magnitude weights -- LayerNorm gains near 1 move in steps of 2^-8 / 2^-7, ~64x
the steps of a projection weight near 0.02. This module runs ES twice from the same
base with the same seeds, once with ``es.restore=subtract`` (the artifact's behaviour,
available only as this explicitly named analysis mode and the config key) and once
with ``es.restore=exact`` (our default, bit-exact), and puts drift, update sparsity,
localisation and rounding statistics side by side, plus the distance between the two
endpoints. ``with_null`` adds both variants with ``es.alpha=0``: then the exact run must
not move at all and everything the subtract run moves is restore error.

The comparison only isolates the restore when updates land in the model dtype
(``es.master_weights=none``; with fp32 master weights every update re-derives the
centre from the masters and erases accumulated restore error) and the dtype is
low-precision (``dtype=bfloat16`` as the paper). Other settings run but are flagged
in the notes.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from esreason.analysis.weights.pair import PairAnalysis, analyze_pair
from esreason.analysis.weights.reports import category_panels, category_table, rounding_report
from esreason.analysis.tables import Table, fmt_exact, fmt_pct
from esreason.errors import UserError


@dataclass(frozen=True)
class Variant:
    name: str
    overrides: tuple[str, ...]


def variants(with_null: bool) -> list[Variant]:
    out = [Variant("exact", ("es.restore=exact",)), Variant("subtract", ("es.restore=subtract",))]
    if with_null:
        out += [Variant("exact-alpha0", ("es.restore=exact", "es.alpha=0")),
                Variant("subtract-alpha0", ("es.restore=subtract", "es.alpha=0"))]
    return out


def _save_base(cfg: Any, out: Path) -> Path:
    """The ES starting point as a checkpoint in the run dtype (what both variants start from)."""
    from esreason.backends.hf import load_model
    from esreason.io.atomic import atomic_directory

    model, tok = load_model(cfg.model, cfg.dtype, "cpu")
    with atomic_directory(out) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
    return out


def run_restore_ablation(config: str | None, overrides: Sequence[str], steps: int, out: str | Path, *,
                         taus: Sequence[tuple[str, float]], topk: int = 100, with_null: bool = False,
                         progress: bool = True) -> tuple[list[PairAnalysis], PairAnalysis, dict[str, Any]]:
    """Train every variant for ``steps`` updates and analyse it against the shared base.

    Returns (per-variant analyses, exact-vs-subtract endpoint analysis, run info).
    """
    from esreason.config import load_config, to_dict
    from esreason.es_loop.run import run_es

    if steps < 1:
        raise UserError(f"--steps must be >= 1 (got {steps})")
    out = Path(out)
    from esreason.io.lock import has_content

    if has_content(out):  # its own lock file (held by the command) is not content
        raise UserError(f"--out {out} is not empty; the ablation writes fresh runs (choose another directory)")
    common = [*overrides, f"train.max_steps={steps}", "checkpoint.every=0"]
    for item in overrides:
        key = item.split("=", 1)[0].strip()
        if key == "es.restore":
            raise UserError("--set es.restore is chosen by the ablation itself (it runs both modes)")
    cfg0 = load_config(config, common)
    notes = []
    if cfg0.dtype == "float32":
        notes.append("dtype=float32: restore error is at fp32 resolution; the paper's setting is bfloat16")
    master = cfg0.es.master_weights
    if master == "fp32" or (master == "auto" and cfg0.dtype != "float32"):
        notes.append("fp32 master weights are on: updates re-derive the centre from the masters, which erases "
                     "accumulated restore error; set es.master_weights=none to reproduce the artifact")
    base_dir = _save_base(cfg0, out / "base")
    analyses: list[PairAnalysis] = []
    finals: dict[str, Path] = {}
    info: dict[str, Any] = {"config": to_dict(cfg0), "steps": steps, "base": str(base_dir), "variants": {},
                            "notes": notes}
    for v in variants(with_null):
        cfg = load_config(config, [*common, *v.overrides])
        run_dir = out / "runs" / v.name
        if progress:
            print(f"[restore-ablation] variant {v.name}: {steps} ES updates", file=sys.stderr, flush=True)
        res = run_es(cfg, run_dir, progress=progress)
        if res.final_checkpoint is None:
            raise RuntimeError(f"variant {v.name}: the ES run wrote no checkpoint")
        finals[v.name] = Path(res.final_checkpoint)
        info["variants"][v.name] = {"run_dir": str(run_dir), "final_checkpoint": str(res.final_checkpoint),
                                    "overrides": list(v.overrides)}
        analyses.append(analyze_pair(base_dir, res.final_checkpoint, label=v.name, taus=taus, topk=topk,
                                     rounding=True))
    endpoint = analyze_pair(finals["exact"], finals["subtract"], label="subtract vs exact", taus=taus, topk=topk,
                            rounding=True)
    return analyses, endpoint, info


def ablation_report(analyses: Sequence[PairAnalysis], endpoint: PairAnalysis, info: dict[str, Any]
                    ) -> tuple[list[Table], dict[str, Any]]:
    """Side-by-side tables: drift and sparsity, largest updates, categories, rounding, endpoint distance."""
    taus = analyses[0].drift.taus
    k = analyses[0].loc.k
    main = Table("Restore ablation: drift and update sparsity (same seeds, same base)",
                 ["Variant", "D_rel (×1e-2)", "Changed (%)"] + [f"s_τ, τ={lab} (%)" for lab, _ in taus]
                 + ["max |Δ|", "# at max", f"Top-{k}: normalization", f"Top-{k}: input_layernorm"],
                 caption=f"{info['steps']} ES updates per variant; dtype {info['config']['dtype']}, master weights "
                         f"{info['config']['es']['master_weights']}. D_rel = ‖θ−θ0‖/‖θ0‖.")
    for pa in analyses:
        d, lo = pa.drift, pa.loc
        top = lo.top_by_category
        main.add(pa.label, f"{100 * (d.relative_l2 or 0):.4g}", fmt_pct(d.changed / d.numel if d.numel else None),
                 *[fmt_pct(d.s_tau[lab]) for lab, _ in taus], fmt_exact(lo.max_abs), lo.at_max,
                 top.get("input_layernorm", 0) + top.get("other_norm", 0), top.get("input_layernorm", 0))
    ed = endpoint.drift
    ep = Table("Distance between the subtract and exact endpoints",
               ["Pair", "‖θ_sub − θ_exact‖ / ‖θ_exact‖ (×1e-2)", "Coordinates that differ (%)", "max |Δ|",
                "Single-ulp flips (%)"])
    ep.add(endpoint.label, f"{100 * (ed.relative_l2 or 0):.4g}", fmt_pct(ed.changed / ed.numel if ed.numel else None),
           fmt_exact(endpoint.loc.max_abs), fmt_pct(endpoint.rounding.single_ulp_share))
    cats = category_table(list(analyses))
    round_tables, _ = rounding_report(list(analyses))
    payload = {
        **info,
        "results": {pa.label: {"drift": pa.drift.to_json(include_tensors=False), "localization": pa.loc.to_json(),
                               "rounding": pa.rounding.to_json()} for pa in analyses},
        "endpoint_distance": {"drift": ed.to_json(include_tensors=False), "localization": endpoint.loc.to_json(),
                              "rounding": endpoint.rounding.to_json()},
    }
    return [main, cats, round_tables[0], ep], payload


def ablation_figures(analyses: Sequence[PairAnalysis], out: Path, name: str) -> list[Path]:
    from esreason.analysis.weights.plots import plot_category_counts, plot_update_histogram

    hists = {pa.label: (pa.drift.hist_edges, pa.drift.hist_counts) for pa in analyses}
    h = plot_update_histogram(hists, analyses[0].drift.taus, out / f"{name}_hist.png",
                              title="|Δθ| by restore mode (same seeds)")
    c = plot_category_counts(category_panels(list(analyses)), out / f"{name}_categories.png",
                             title="Largest updates by restore mode")
    return [h, c]
