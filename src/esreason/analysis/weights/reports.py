"""Tables and JSON payloads of the weight analyses, built from :class:`PairAnalysis`.

Each ``*_report`` function returns ``(tables, payload)``; :func:`esreason.analysis.tables.emit` writes
``<out>/<name>.md/.tex/.json`` and the command's PNG. Numbers in tables follow the
paper's conventions: relative L2 distance in units of 1e-2, percentages with two
decimals, update magnitudes printed exactly (bf16 steps such as 0.01171875).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from esreason.analysis.weights.categories import CATEGORIES, GROUPS
from esreason.analysis.weights.localize import group_counts, max_ratio
from esreason.analysis.weights.pair import PairAnalysis
from esreason.analysis.weights.rounding import FORMATS, order_key
from esreason.analysis.tables import Table, fmt_exact, fmt_pct
from esreason.errors import UserError

ST_TO_TORCH = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}


def _drel(x: float | None) -> str:
    """Relative L2 in units of 1e-2 (the paper's drift table)."""
    return "--" if x is None else f"{100.0 * x:.4g}"


def _counts_str(counts: dict[str, int]) -> str:
    return ", ".join(f"{c} {n}" for c, n in counts.items()) or "--"


# --------------------------------------------------------------------------- drift


def drift_report(tuned: PairAnalysis, ref: PairAnalysis | None = None) -> tuple[list[Table], dict[str, Any]]:
    d = tuned.drift
    assert d is not None
    taus = d.taus
    ratio = None
    if ref is not None and ref.drift is not None and ref.drift.relative_l2:
        ratio = (d.relative_l2 or 0.0) / ref.drift.relative_l2
    main = Table("Parameter drift: relative L2 distance ‖θ−θ0‖/‖θ0‖ (×1e-2)",
                 ["Checkpoint", "Changed (%)", "Full"] + [f"τ={lab}: D (s_τ %)" for lab, _ in taus],
                 caption="Full: relative L2 distance of the checkpoint (×ratio to the reference). τ columns: relative "
                         "L2 distance of the magnitude-thresholded model (updates with |Δ| ≤ τ reset to base) and, in "
                         "parentheses, s_τ = share of nonzero updates with 0 < |Δ| ≤ τ "
                         "(paper Eq. rq2-update-sparsity).")
    rows = ([ref] if ref is not None else []) + [tuned]
    for pa in rows:
        dr = pa.drift
        assert dr is not None
        full = _drel(dr.relative_l2)
        if pa is tuned and ratio is not None:
            full += f" ({ratio:.3g}×)"
        cells = [f"{_drel(dr.thresholded_relative_l2[lab])} ({fmt_pct(dr.s_tau[lab])})" for lab, _ in taus]
        main.add(pa.label, fmt_pct(dr.changed / dr.numel if dr.numel else None), full, *cells)

    cat = Table(f"Drift by parameter category ({tuned.label})",
                ["Category", "Tensors", "Coordinates", "Changed (%)", "D_rel in category (×1e-2)",
                 "Share of ‖Δ‖² (%)", "max |Δ|"],
                caption="Category rules: esreason.analysis.weights.categories; normalization = input_layernorm + other_norm, "
                        "attention = attn_proj + attn_bias.")
    for name, s in d.by_category().items():
        label = f"{name} (group)" if name in GROUPS else name
        cat.add(label, s["tensors"], s["numel"], fmt_pct(s["changed_share"]), _drel(s["relative_l2"]),
                fmt_pct(s["share_of_sq_drift"]), fmt_exact(s["max_abs"]))
    tables = [main, cat]

    payload: dict[str, Any] = {**d.to_json(), **tuned.provenance()}
    if tuned.loc is not None:
        tables.append(_largest_table([p for p in rows if p.loc is not None]))
        payload["localization"] = tuned.loc.to_json()
    if ref is not None and ref.drift is not None:
        payload["reference"] = {**ref.drift.to_json(include_tensors=False), **ref.provenance()}
        if ref.loc is not None:
            payload["reference"]["localization"] = ref.loc.to_json()
        payload["ratio_to_reference"] = ratio
        if tuned.loc is not None and ref.loc is not None:
            payload["max_abs_ratio_to_reference"] = max_ratio(tuned.loc, ref.loc)
    return tables, payload


def _largest_table(rows: Sequence[PairAnalysis]) -> Table:
    k = rows[0].loc.k if rows and rows[0].loc else 0
    t = Table("Largest updates", ["Checkpoint", "max |Δ|", "# at max", "At max, by category",
                                  f"Top-{k}, by category", f"Top-{k}: normalization", f"Top-{k}: attention"],
              caption="Top-k tie rule: |Δ| descending, then tensor name, then flat index "
                      "(see esreason.analysis.weights.localize).")
    for pa in rows:
        loc = pa.loc
        assert loc is not None
        g = group_counts(loc.top_by_category)
        t.add(pa.label, fmt_exact(loc.max_abs), loc.at_max, _counts_str(loc.at_max_by_category),
              _counts_str(loc.top_by_category), g["normalization"], g["attention"])
    return t


# --------------------------------------------------------------------------- localisation


def _lattice_steps(pa: PairAnalysis) -> list[int] | None:
    """Representable-value steps between base and tuned for each top entry (same low-precision dtype)."""
    if pa.loc is None or len(pa.info.base_dtypes | pa.info.tuned_dtypes) != 1:
        return None
    (dt,) = pa.info.base_dtypes
    if dt not in FORMATS:
        return None
    tdt = ST_TO_TORCH[dt]
    b = torch.tensor([e.base for e in pa.loc.top], dtype=torch.float64).to(tdt)
    t = torch.tensor([e.tuned for e in pa.loc.top], dtype=torch.float64).to(tdt)
    return (order_key(t, dt) - order_key(b, dt)).abs().tolist()


def localize_report(tuned: PairAnalysis, ref: PairAnalysis | None = None, show: int = 20
                    ) -> tuple[list[Table], dict[str, Any]]:
    loc = tuned.loc
    assert loc is not None
    rows = ([ref] if ref is not None else []) + [tuned]
    summary = Table("Maximum and top-k updates",
                    ["Checkpoint", "max |Δ|", "# at max", "max ratio", f"k-th |Δ| (k={loc.k})", "# ≥ k-th", "# = k-th",
                     "# = k-th in top-k"],
                    caption="max ratio: max |Δ| of the checkpoint over that of the reference "
                            "(paper: GRPO 48× smaller). "
                            "The last three columns show whether the top-k boundary splits a group of equal values.")
    for pa in rows:
        lo = pa.loc
        assert lo is not None
        r = max_ratio(lo, ref.loc) if (ref is not None and ref.loc is not None) else None
        bd = lo.boundary()
        summary.add(pa.label, fmt_exact(lo.max_abs), lo.at_max, "--" if r is None else f"{r:.3g}×",
                    fmt_exact(bd["kth_value"]), bd["num_ge_kth"], bd["num_eq_kth"], bd["num_eq_kth_in_top"])

    cats = category_table(rows)

    steps = _lattice_steps(tuned)
    cols = ["Rank", "Tensor", "Index", "Category", "Δ", "θ0"] + (["Lattice steps"] if steps is not None else [])
    top = Table(f"Top {min(show, len(loc.top))} updates ({tuned.label})", cols,
                caption="Lattice steps: representable values between θ0 and θ in the checkpoint dtype "
                        "(1 = one-ulp flip).")
    for r, e in enumerate(loc.top[:show]):
        cells = [r + 1, e.name, list(e.index), e.category, fmt_exact(e.delta), fmt_exact(e.base)]
        top.add(*cells, *([steps[r]] if steps is not None else []))

    payload: dict[str, Any] = {**loc.to_json(), **tuned.provenance()}
    if steps is not None:
        for entry, s in zip(payload["top"], steps):
            entry["lattice_steps"] = s
    if ref is not None and ref.loc is not None:
        payload["reference"] = {**ref.loc.to_json(), **ref.provenance()}
        payload["max_abs_ratio_to_reference"] = max_ratio(loc, ref.loc)
    return [summary, cats, top], payload


def category_table(rows: Sequence[PairAnalysis]) -> Table:
    """Category counts at the maximum and in the top-k, one column pair per checkpoint."""
    k = rows[-1].loc.k if rows and rows[-1].loc else 0
    cats = Table("Categories of the largest updates", ["Category"] + [f"{pa.label}: at max" for pa in rows]
                 + [f"{pa.label}: top-{k}" for pa in rows])
    present = {c for pa in rows for c in list(pa.loc.at_max_by_category) + list(pa.loc.top_by_category)}
    for c in (c for c in CATEGORIES if c in present):
        cats.add(c, *[pa.loc.at_max_by_category.get(c, 0) for pa in rows],
                 *[pa.loc.top_by_category.get(c, 0) for pa in rows])
    for g in GROUPS:
        cats.add(f"{g} (group)", *[group_counts(pa.loc.at_max_by_category)[g] for pa in rows],
                 *[group_counts(pa.loc.top_by_category)[g] for pa in rows])
    return cats


def category_panels(rows: Sequence[PairAnalysis]) -> dict[str, dict[str, dict[str, int]]]:
    k = rows[-1].loc.k if rows and rows[-1].loc else 0
    return {f"top-{k} updates by category": {pa.label: pa.loc.top_by_category for pa in rows if pa.loc},
            "coordinates at the maximum |Δ|": {pa.label: pa.loc.at_max_by_category for pa in rows if pa.loc}}


# --------------------------------------------------------------------------- rounding


def rounding_report(pairs: Sequence[PairAnalysis]) -> tuple[list[Table], dict[str, Any]]:
    for pa in pairs:
        r = pa.rounding
        assert r is not None
        if not r.dtypes:
            raise UserError(f"rounding analysis needs base and {pa.label} stored in the same floating dtype "
                            f"(BF16, F16 or F32); got base {sorted(pa.info.base_dtypes)}, "
                            f"{pa.label} {sorted(pa.info.tuned_dtypes)}")
    main = Table("Rounding attribution of the changes",
                 ["Checkpoint", "dtype", "Changed", "Integer-ulp (%)", "Single-ulp flips (%)",
                  "‖Δ‖² from single-ulp flips (%)"],
                 caption="ulp = spacing of the dtype in the binade of the base value; integer-ulp: |Δ|/ulp(θ0) is an "
                         "integer; single-ulp flip: θ and θ0 are adjacent representable values.")
    for pa in pairs:
        r = pa.rounding
        main.add(pa.label, "/".join(r.dtypes), r.changed, fmt_pct(r.integer_ulp_share),
                 fmt_pct(r.single_ulp_share), fmt_pct(r.single_ulp_sq_drift_share))
    cats = Table("Single-ulp flips by category", ["Checkpoint", "Category", "Changed", "Integer-ulp (%)",
                                                   "Single-ulp flips (%)", "‖Δ‖² from single-ulp flips (%)"])
    dist = Table("Lattice distance between θ0 and θ (changed coordinates)",
                 ["Steps"] + [pa.label for pa in pairs])
    for pa in pairs:
        for c, s in pa.rounding.to_json()["categories"].items():
            cats.add(pa.label, c, s["changed"], fmt_pct(s["integer_ulp_share"]), fmt_pct(s["single_ulp_share"]),
                     fmt_pct(s["single_ulp_sq_drift_share"]))
    buckets = [pa.rounding.distance_buckets() for pa in pairs]
    for key in buckets[0]:
        dist.add(key, *[b[key] for b in buckets])
    payload = {"checkpoints": [{**pa.rounding.to_json(), **pa.provenance()} for pa in pairs]}
    if len(pairs) == 1:
        payload.update(pairs[0].rounding.to_json())
    return [main, cats, dist], payload


# --------------------------------------------------------------------------- threshold sweep


def sweep_table(rows: Sequence[Any], settings: Any, tuned_label: str = "tuned") -> Table:
    """The appendix table: tau, update sparsity, Pass@1, Delta vs Full ES (percent, 3 decimals)."""
    full = rows[0].pass1
    where = settings.suite or ",".join(settings.tasks)
    t = Table(f"Pass@1 of magnitude-thresholded checkpoints ({tuned_label}; {where})",
              ["Threshold τ", "Update sparsity (%)", "Pass@1 (%)", "95% CI", "Δ Full ES (%)", "D_rel (×1e-2)"],
              caption=f"Pass@1 = empirical single-sample accuracy from {settings.samples} responses per problem at "
                      f"temperature {settings.temperature}" + (f", first {settings.limit} problems per task"
                                                               if settings.limit else "")
                      + "; Δ Full ES: signed difference from the unablated checkpoint, percentage points.")
    for r in rows:
        ci = ("--" if r.ci[0] is None else f"[{fmt_pct(r.ci[0], 1)}, {fmt_pct(r.ci[1], 1)}]")
        delta = "--" if r.label == "Base Model" or r.pass1 is None or full is None else f"{100 * (r.pass1 - full):+.3f}"
        t.add(r.label, fmt_pct(r.sparsity), fmt_pct(r.pass1, 3), ci, delta, _drel(r.relative_l2))
    return t


def threshold_table(stats: Any) -> Table:
    t = Table("Magnitude-thresholded checkpoint", ["τ", "Update sparsity s_τ (%)", "Coordinates reset",
                                                   "Coordinates kept", "D_rel full (×1e-2)",
                                                   "D_rel thresholded (×1e-2)"])
    t.add(stats.tau_label, fmt_pct(stats.update_sparsity), stats.num_reset, stats.num_kept,
          _drel(stats.full_relative_l2), _drel(stats.relative_l2))
    return t

