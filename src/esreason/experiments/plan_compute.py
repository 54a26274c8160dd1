"""What ``esreason experiment plan`` says about a training stage's compute and, for GRPO, its memory advice.

- :func:`stage_compute`: the stage's generated tokens (the plan's mean response length) and the FLOPs they
  cost as spent, 2 P x the forward-equivalents the stage's code path runs per generated token
  (:func:`esreason.accounting.budget.compute_record`: ES 1; GRPO sampling 1 + loss forward 1 + backward 2
  + recompute + old policy + reference), beside the paper formula's (ES 1, GRPO 4 per token).
- :func:`grpo_stage_advice`: for a GRPO stage that does not fit, the keys that change its memory with the
  figure each gives, and the nodes that would fit (:func:`esreason.experiments.memplan.grpo_advice`).
"""

from __future__ import annotations

from typing import Any


def stage_compute(cfg: Any, updates: int, params: int, mean_length: Any) -> dict[str, Any]:
    """Compute as spent of a training stage of ``updates`` updates of ``cfg`` at ``mean_length(max_new_tokens)``
    generated tokens per response (the plan's length model; prompt tokens and padding left out, as the paper's
    L leaves them out)."""
    from esreason.accounting.budget import compute_record, rollouts_per_update

    rec = compute_record(cfg)
    rollouts = updates * rollouts_per_update(cfg)
    tokens = rollouts * mean_length(cfg.generation.max_new_tokens)
    return {**rec, "rollouts": rollouts, "generated_tokens": round(tokens),
            "flops_spent": 2.0 * params * rec["forward_equivalents_per_token"] * tokens,
            "flops_paper": 2.0 * params * rec["paper_forward_equivalents_per_token"] * tokens}


def grpo_stage_advice(cfg: Any, stage: Any, gpus_per_node: int, gpu_gib: float) -> dict[str, Any]:
    """:func:`esreason.experiments.memplan.grpo_advice` for a planned GRPO stage (its processes and the
    sharding the launcher picks for them)."""
    from esreason.experiments import memplan

    procs = stage.gpus
    sharding = memplan.pick_sharding(cfg, procs, gpu_gib) if procs > 1 else "ddp"
    return memplan.grpo_advice(cfg, procs, sharding, gpu_gib, gpus_per_node)


def nodes(n: int) -> str:
    """The plan's layout words for a GRPO stage on ``n`` nodes ('' on one)."""
    return f", {n} nodes" if n > 1 else ""


def misfit_note(stage: Any, cfg: Any, v: dict[str, Any], gpus_per_node: int) -> str:
    """The plan's note for a stage that does not fit (``v``: its verdict at the plan's GPU type): for a GRPO
    stage the keys that would change the figure and the nodes that would fit (recorded in
    ``stage.memory["advice"]``), else the largest term and its key."""
    head = (f"{stage.name}: does not fit {v['gpu']}: {v['role']} needs {v['total_gib']:.1f} GiB of "
            f"{v['capacity_gib']:.1f}")
    if cfg is not None and hasattr(cfg, "grpo"):
        from esreason.experiments.memplan import advice_text

        advice = grpo_stage_advice(cfg, stage, gpus_per_node, v["capacity_gib"])
        stage.memory["advice"] = advice
        return f"{head}; would change it: {advice_text(advice)}"
    return f"{head}; largest term {v['term']} {v['term_gib']:.1f} GiB (change: {v['key']})"


def compute_lines(plan: dict[str, Any]) -> list[str]:
    """The text plan's compute block: per training stage, tokens, forward-equivalents and FLOPs as spent."""
    rows = [(s["name"], s["compute"]) for s in plan["stages"] if s.get("compute")]
    if not rows:
        return []
    out = ["", "compute as spent per training stage (forward-equivalents per generated token: sample, forward, "
               "backward 2, recompute, old policy, reference; the paper's formula counts ES 1, GRPO 4):"]
    for name, c in rows:
        parts = ", ".join(f"{k} {v}" for k, v in c["passes_per_token"].items() if v)
        out.append(f"  {name:<28} {c['generated_tokens']:>15,} tokens  {c['forward_equivalents_per_token']} "
                   f"per token ({parts}; {c['optimizer_steps_per_update']} optimizer step(s) per update)  "
                   f"{c['flops_spent']:.3g} FLOPs as spent, {c['flops_paper']:.3g} by the paper's formula")
    return out


__all__ = ["compute_lines", "grpo_stage_advice", "misfit_note", "nodes", "stage_compute"]
