"""The report's compute budget: what each method was matched on and what it consumed.

Read from ``experiment.json`` (written by the runner, :mod:`esreason.accounting.budget`): the
experiment's ``match`` and ``budget`` (shared L, P, whether FLOPs and rollouts are equal across the
trained methods) and, per trained method, its ``planned`` budget, its ``consumed`` one (per seed
with several) and, for GRPO and its variants, the ``objective`` settings that tell them apart.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from esreason.report import markdown

MATCH_WORDS = {
    "flops": "the paper's FLOP formula: every method trains the same T updates, and the paper's estimate (ES "
             "2 T N D P L, GRPO 8 T B G P L) is equal when N = 4 G at equal B; the FLOPs each method spends are "
             "not what is equal (below)",
    "rollouts": "rollouts: ES trains T updates and every GRPO method T x (N x B_ES) / (B x G), so each samples "
                "as many responses as ES (GRPO's planned FLOPs are then 4x ES's: 8 P L against 2 P L per response)",
    "compute": "FLOPs as spent: ES trains T updates and every GRPO method the updates at which its planned FLOPs "
               "as spent (its own forward-equivalents per generated token, at the shared L) equal ES's",
}


def _read(root: Path) -> dict[str, Any] | None:
    path = root / "experiment.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _consumed(entry: dict[str, Any]) -> tuple[dict[str, Any] | None, int]:
    """The consumed budget of a method (the mean over its seeds with several) and the seed count."""
    if "seeds" in entry:
        runs = [s["consumed"] for s in entry["seeds"].values() if isinstance(s, dict) and s.get("consumed")]
        if not runs:
            return None, 0
        keys = [k for k in ("rollouts", "tokens", "flops_at_measured_length", "flops_spent", "mean_length")
                if all(r.get(k) is not None for r in runs)]
        return {k: sum(r[k] for r in runs) / len(runs) for k in keys}, len(runs)
    return entry.get("consumed"), 1


def _n(x: Any, fmt: str = ",.0f") -> str:
    return "–" if x is None else format(x, fmt)


def budget_json(root: Path) -> dict[str, Any] | None:
    """Everything the section shows, for report.json (None: no budget recorded)."""
    record = _read(root)
    if not record or "budget" not in record:
        return None
    methods = {}
    for key, entry in record.get("methods", {}).items():
        if "planned" in entry:
            consumed, seeds = _consumed(entry)
            methods[key] = {"label": entry.get("label", key), "planned": entry["planned"], "consumed": consumed,
                            "seeds": seeds, "objective": entry.get("objective")}
    return {**record["budget"], "match": record.get("match", "flops"), "methods": methods}


#: The parts of a method's forward-equivalents per generated token, in the order of the report's columns.
PASS_PARTS = ("sample", "forward", "backward", "recompute", "old_policy", "reference")


def _compute_of(planned: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(stage label, compute record) of a method's planned budget: one, or a composition's per stage."""
    if "compute" in planned:
        return [("", planned["compute"])]
    stages = planned.get("stages") or []
    return [(f" (stage {i}: {st.get('method', '?')})", st["compute"]) for i, st in enumerate(stages, start=1)
            if "compute" in st]


def compute_md(methods: dict[str, Any]) -> list[str]:
    """The table of what each method (each stage of a composition) spends per generated token."""
    rows = []
    for m in methods.values():
        for suffix, c in _compute_of(m["planned"]):
            parts = c["passes_per_token"]
            rows.append([m["label"] + suffix, *(_n(parts.get(k, 0)) for k in PASS_PARTS),
                         _n(c["forward_equivalents_per_token"]), _n(c["paper_forward_equivalents_per_token"]),
                         _n(c["optimizer_steps_per_update"])])
    if not rows:
        return []
    header = ["Method", "sample", "policy forward", "backward", "recompute", "old policy", "reference",
              "total (as spent)", "paper's formula", "optimizer steps / update"]
    return ["Forward-equivalents per generated token (a backward counts 2; 2 P FLOPs each): what each method's code "
            "path runs, beside what the paper's formula charges (esreason.grpo.plan.passes_per_token; "
            "docs/budget.md):", "", markdown.simple_markdown(header, rows), ""]


def budget_md(root: Path) -> list[str]:
    """The report section: the match, and per trained method its planned and consumed budget."""
    head = ["## Compute budget: FLOPs, rollouts and tokens", ""]
    data = budget_json(root)
    if data is None:
        return head + ["_No budget recorded in experiment.json (an experiment run before rollouts were counted)._", ""]
    yes = {True: "yes", False: "no", None: "–"}
    lines = head + [
        f"Matched on **{data['match']}** — {MATCH_WORDS.get(data['match'], data['match'])}. Across the trained "
        f"methods, planned FLOPs by the paper's formula equal: {yes[data.get('flops_equal')]}; planned FLOPs as "
        f"spent equal: {yes[data.get('flops_spent_equal')]}; planned rollouts equal: "
        f"{yes[data.get('rollouts_equal')]} (P = {_n(data.get('params'))} parameters, shared L = "
        f"{data.get('length')} tokens). Rollouts: the sampled responses the updates learn from (ES: N members x "
        "the update's prompts; GRPO: B x G); tokens: their generated tokens; held-out evaluation during training "
        "and the coverage probe are not counted. Consumed: summed from each run's metrics "
        "(with several training seeds: the mean per seed); FLOPs at measured length: the paper's 2 P (ES) or 8 P "
        "(GRPO) per generated token; FLOPs as spent: 2 P x the forward-equivalents each method's code path runs "
        "per generated token (table below) x its generated tokens.", ""]
    header = ["Method", "Updates", "Rollouts / update", "Rollouts (planned)", "FLOPs (planned, paper's formula)",
              "FLOPs (planned, as spent)", "Rollouts (consumed)", "Generated tokens", "Mean length",
              "FLOPs at measured length (paper's formula)", "FLOPs as spent (consumed)"]
    rows = []
    for m in data["methods"].values():
        p, c = m["planned"], m["consumed"] or {}
        seeds = f" (mean of {m['seeds']} seeds)" if m["seeds"] > 1 else ""
        rows.append([m["label"] + seeds, _n(p.get("updates")), _n(p.get("rollouts_per_update")),
                     _n(p.get("rollouts")), _n(p.get("flops"), ".4g"), _n(p.get("flops_spent"), ".4g"),
                     _n(c.get("rollouts")), _n(c.get("tokens")), _n(c.get("mean_length"), ".1f"),
                     _n(c.get("flops_at_measured_length"), ".4g"), _n(c.get("flops_spent"), ".4g")])
    lines += [markdown.simple_markdown(header, rows), ""]
    lines += compute_md(data["methods"])
    grpo = {k: m for k, m in data["methods"].items() if m.get("objective")}
    if grpo:
        header = ["Method", "loss_type", "importance ratio", "clip low / high", "KL beta", "advantage / std",
                  "truncated masked", "overlong penalty", "optimizer steps / update"]
        rows = [[m["label"], o["loss_type"], o["importance_sampling_level"],
                 f"{o['epsilon']:g} / {o['epsilon_high']:g}", f"{o['beta']:g}", yes[o["standardize_advantages"]],
                 yes[o["mask_truncated_completions"]],
                 f"{o.get('soft_overlong_punishment', 0):g}", _n(o.get("optimizer_steps_per_update"))]
                for m in grpo.values() for o in [m["objective"]]]
        lines += ["GRPO and its variants (objective settings that differ between them; docs/grpo-variants.md):", "",
                  markdown.simple_markdown(header, rows), ""]
    return lines


__all__ = ["MATCH_WORDS", "budget_json", "budget_md", "compute_md"]
