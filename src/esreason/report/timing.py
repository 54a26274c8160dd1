"""Planned vs actual wall time per stage: the plan an experiment was launched with
(``EXP/plan.json``, written by ``esreason experiment run --plan FILE``) beside the seconds the
runner measured (``experiment.json`` ``timings``).

Stage names: the plan names a composition's two stages (``train/es_grpo/stage1_es``) and prefixes
seeds (``seed0/train/es``); the runner times a method's whole training (``train/es_grpo``) and
suffixes seeds (``train/es/seed0``). Planned stages are summed into the runner's keys.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from esreason.report import markdown

PLAN_FILE = "plan.json"


def runner_key(plan_stage: str) -> str:
    """The runner's ``timings`` key of a plan stage name."""
    parts = plan_stage.split("/")
    seed = parts.pop(0) if parts[0].startswith("seed") and parts[0][4:].isdigit() else None
    key = "/".join(parts[:2])
    return f"{key}/{seed}" if seed else key


def planned_seconds(plan: dict[str, Any]) -> dict[str, float]:
    """Planned seconds per runner key; a table plan (``wall_hours``) and a calibrated one (``wall_s``) alike."""
    out: dict[str, float] = {}
    for s in plan.get("stages", []):
        seconds = s["wall_s"] if "wall_s" in s else 3600.0 * s["wall_hours"]
        key = runner_key(s["name"])
        out[key] = out.get(key, 0.0) + seconds
    return out


def comparison(root: Path) -> tuple[list[str], list[list[str]], dict[str, Any]] | None:
    """(headers, rows, totals) of planned vs actual seconds, or None when no plan was recorded."""
    path = root / PLAN_FILE
    if not path.is_file():
        return None
    plan = json.loads(path.read_text())
    actual = json.loads((root / "experiment.json").read_text()).get("timings", {})
    planned = planned_seconds(plan)
    rows, tp, ta = [], 0.0, 0.0
    for key in list(planned) + [k for k in actual if k not in planned]:
        p, a = planned.get(key), actual.get(key)
        if p is not None and a is not None:
            tp, ta = tp + p, ta + a
        rows.append([key, _s(p), _s(a), f"{a / p:.2f}" if p and a is not None else "—"])
    rows.append(["**total** (stages with both)", _s(tp), _s(ta), f"{ta / tp:.2f}" if tp else "—"])
    return ["stage", "planned s", "actual s", "actual / planned"], rows, {"planned_s": tp, "actual_s": ta}


def _s(x: float | None) -> str:
    return "—" if x is None else f"{x:,.1f}"


def timing_md(root: Path) -> list[str]:
    """The report's section: planned vs actual per stage, or one line saying no plan was recorded."""
    got = comparison(root)
    head = ["## Planned vs actual time", ""]
    if got is None:
        return head + ["_No plan recorded: launch with `esreason experiment run X --plan PLAN.json` (from "
                       "`esreason experiment plan X --calibrate --json` on this machine, or `--gpus N --json`)._", ""]
    plan = json.loads((root / PLAN_FILE).read_text())
    kind = (f"calibrated on {plan.get('machine', 'this machine')}" if plan.get("calibrated")
            else f"table plan for {plan.get('gpus')} x {plan.get('gpu_type')}")
    headers, rows, _ = got
    return head + [f"The plan this experiment was launched with ({kind}; `{PLAN_FILE}`) beside the wall time the "
                   "runner measured per stage (training of a method: both stages of a composition; the report build "
                   "is timed from the second report on).", "", markdown.simple_markdown(headers, rows), ""]


__all__ = ["PLAN_FILE", "comparison", "planned_seconds", "runner_key", "timing_md"]
