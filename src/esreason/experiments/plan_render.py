"""The text form of ``esreason experiment plan``: the stage table, host lines, time terms, assumptions."""

from __future__ import annotations

from typing import Any


def render(plan: dict[str, Any]) -> str:
    """The plan as a text table."""
    nodes = plan.get("nodes", 1)
    where = f"{plan['gpus']} x {plan['gpu_type']}" + (
        f" per node, GRPO on {nodes} nodes ({nodes * plan['gpus']} GPUs)" if nodes > 1 else "")
    lines = [f"experiment {plan['experiment']}: {plan['model']} ({plan['parameters'] / 1e9:.2f}B parameters, "
             f"class {plan['size_class']}) on {where}", "",
             f"{'stage':<28} {'GPUs':>4} {'responses':>12} {'tokens':>15} {'wall h':>8} {'GPU-h':>8}  "
             "memory per GPU (traced plan)  runs on"]
    for s in plan["stages"]:
        mem = _memory_cell(s.get("memory") or {}, s["memory_gib_per_gpu"])
        lines.append(f"{s['name']:<28} {s['gpus']:>4} {s['responses']:>12,} {s['tokens']:>15,} "
                     f"{s['wall_hours']:>8.2f} {s['gpu_hours']:>8.2f}  {mem}  {s['runs_on']}")
    hosts = [(s["name"], s["memory"]["host"]) for s in plan["stages"] if (s.get("memory") or {}).get("host")]
    if hosts:
        lines += ["", "per node, host side: RAM (of which pinned) / disk"]
        for name, h in hosts:
            fits = "" if h["host_fits"] else f"  EXCEEDS the {h['node_ram_gib']:.0f} GiB of a DGX H100"
            lines.append(f"  {name:<28} {h['host_ram_total_gib']:>7.1f} GiB ({h['pinned_total_gib']:.1f} pinned) / "
                         f"{h['disk_total_gib']:.1f} GiB{fits}")
    lines += ["", "time terms per stage (s): " + ", ".join(
        sorted({k for s in plan["stages"] for k in s.get("terms_s", {})}))]
    for s in plan["stages"]:
        lines.append(f"  {s['name']:<28} " + "  ".join(f"{k} {v:,.0f}" for k, v in s.get("terms_s", {}).items() if v))
    from esreason.experiments.plan_compute import compute_lines

    lines += compute_lines(plan)
    lines += _limit_lines(plan)
    lines += ["", f"total: {plan['wall_hours']:.2f} h wall, {plan['total_gpu_hours']:.2f} GPU-hours", "",
              "assumptions:"]
    lines += [f"  {a['key']} = {a['value']:g} {a['unit']}  ({a.get('label', 'estimate')})  [{a['source']}]"
              for a in plan["assumptions"]]
    lines += [f"note: {n}" for n in plan["notes"]]
    return "\n".join(lines)


def _memory_cell(memory: dict[str, Any], fallback: dict[str, float]) -> str:
    """``59.1 GiB, fits (26 % margin)`` at the plan's GPU type; the other types that do not fit."""
    if not memory.get("on_gpu"):
        return ", ".join(f"{k} {v:g}" for k, v in fallback.items()) + " GiB (CPU)"
    v = memory["verdicts"][memory["gpu_type"]]
    size = f"{v['total_gib']:.1f} GiB"
    if v["role"] == "one engine's vLLM reservation":  # the tightest budget is an engine's share, not the GPU
        size = f"{v['total_gib']:.1f} of {v['capacity_gib']:.1f} GiB reserved per engine"
    cell = (f"{size}, fits ({100 * v['margin']:.0f} % margin)" if v["fits"] else
            f"{size}, DOES NOT FIT ({v['term']} {v['term_gib']:.1f} GiB; change {v['key']})")
    others = [k for k, w in memory["verdicts"].items() if not w["fits"] and k != memory["gpu_type"]]
    return cell + (f"; not on {', '.join(others)}" if others else "")


def _limit_lines(plan: dict[str, Any]) -> list[str]:
    """Each ES stage's update against plain batched inference of the same sequences (plan_limit)."""
    limited = [s for s in plan["stages"] if s.get("limit")]
    if not limited:
        return []
    lines = ["", "ES update vs plain batched inference of the same sequences (s per update; inference: one call "
                 "and one tail per engine)"]
    for s in limited:
        lim = s["limit"]
        line = (f"  {s['name']:<28} update {lim['update_s']:,.2f}  inference {lim['inference_s']:,.2f}  "
                f"ratio {lim['ratio']:.2f}" if lim["ratio"] is not None else f"  {s['name']:<28} no decode to compare")
        if lim.get("engines_per_gpu", 1) > 1:
            line += f" ({lim['engines_per_gpu']} engines per GPU)"
        if lim.get("lowrank_batch_s") is not None:
            line += f";  low-rank members in one batch {lim['lowrank_batch_s']:,.2f} (ratio {lim['lowrank_ratio']:.2f})"
        lines.append(line)
    return lines
