"""Print the README's and docs/planning.md's 8 x H100 plan tables from the plan itself.

Each row is ``esreason experiment plan configs/experiments/X.yaml --gpus 8 [--hf-only] --json``,
run in process: wall hours and GPU-hours of the whole experiment, and for the README's Easy 1.5B
the evaluation's share (the sum of its ``eval/*`` stages, and their generated tokens). The README
and docs tables are this script's output; ``tests/test_plan_tables.py`` checks that every row below
appears in them verbatim, so a change to the plan's terms that does not regenerate the docs fails.

Usage: python scripts/plan_tables.py
"""

from __future__ import annotations

import contextlib
import io
import json
import os
from functools import lru_cache
from typing import Any

from esreason.cli import main

#: A stand-in for the released SofT-GRPO checkpoint: the plan only needs to know the GRPO row is not trained.
RELEASED = "checkpoints.grpo.path=released/softgrpo-checkpoint"  # hub-id shaped: never downloaded by the plan

#: (README label, docs label, experiment file stem, has an --hf-only column, --set overrides)
EXPERIMENTS: tuple[tuple[str | None, str, str, bool, tuple[str, ...]], ...] = (
    ("Qwen2.5-1.5B-Instruct (`easy.yaml`)", "Easy, Qwen2.5-1.5B-Instruct (`easy.yaml`)", "easy", True, ()),
    ("Llama-3.2-3B-Instruct", "Easy, Llama-3.2-3B-Instruct", "easy-llama-3.2-3b", True, ()),
    ("Qwen2.5-7B-Instruct", "Easy, Qwen2.5-7B-Instruct", "easy-qwen2.5-7b", True, ()),
    (None, "Hard, DeepSeek-R1-Distill-Qwen-1.5B, GRPO row trained (`hard.yaml` as shipped)", "hard", False, ()),
    (None, "Hard, ... GRPO row the released SofT-GRPO checkpoint (`ESREASON_HARD_GRPO_CHECKPOINT`)", "hard", False,
     (RELEASED,)),
)


@lru_cache(maxsize=None)
def plan(name: str, hf: bool = False, sets: tuple[str, ...] = ()) -> dict[str, Any]:
    """The plan of ``configs/experiments/<name>.yaml`` on 8 x H100, as ``--json`` prints it."""
    out = io.StringIO()
    args = ["experiment", "plan", f"configs/experiments/{name}.yaml", "--gpus", "8", "--json"] + (["--hf-only"] if hf else [])
    args += [x for item in sets for x in ("--set", item)]
    saved = os.environ.pop("ESREASON_HARD_GRPO_CHECKPOINT", None)  # the shipped default: the GRPO row is trained
    try:
        with contextlib.redirect_stdout(out):
            code = main(args)
    finally:
        if saved is not None:
            os.environ["ESREASON_HARD_GRPO_CHECKPOINT"] = saved
    if code != 0:
        raise SystemExit(f"plan failed: {' '.join(args)}")
    return json.loads(out.getvalue())


def _wall_gpu(p: dict[str, Any]) -> str:
    return f"{p['wall_hours']:.1f} h / {p['total_gpu_hours']:,.1f}"


def _evaluation(p: dict[str, Any]) -> tuple[float, float, int]:
    """Wall hours, GPU-hours and generated tokens of the plan's evaluation stages."""
    ev = [s for s in p["stages"] if s["name"].split("/")[0] == "eval"]
    return (sum(s["wall_hours"] for s in ev), sum(s["gpu_hours"] for s in ev), sum(s["tokens"] for s in ev))


def readme_rows() -> list[str]:
    """The README's "Easy experiment on 8 x H100" table."""
    rows = ["| Easy experiment on 8 x H100 | shipped configs (vLLM everywhere) | every generation on HF (`--hf-only`) |",
            "| --- | ---: | ---: |"]
    for label, _, name, _, _ in EXPERIMENTS:
        if label is None:
            continue
        shipped, hf = plan(name), plan(name, True)
        if name == "easy":
            rows.append(f"| {label}: wall / GPU-hours | **{_wall_gpu(shipped)}** | {_wall_gpu(hf)} |")
            (w, g, tokens), (hw, hg, _) = _evaluation(shipped), _evaluation(hf)
            rows.append(f"| of which evaluation ({tokens / 1e6:,.0f} M generated tokens) | {w:.1f} h / {g:,.1f} "
                        f"| {hw:.1f} h / {hg:,.1f} |")
        else:
            rows.append(f"| {label} | {_wall_gpu(shipped)} | {_wall_gpu(hf)} |")
    return rows


def planning_rows() -> list[str]:
    """docs/planning.md's "Projected on 8 x H100" table."""
    rows = ["| experiment | shipped configs: wall h / GPU-h | every generation on HF: wall h / GPU-h |",
            "| --- | ---: | ---: |"]
    for _, label, name, has_hf, sets in EXPERIMENTS:
        shipped, on_hf = plan(name, False, sets), plan(name, True) if has_hf else None
        hf = f"{on_hf['wall_hours']:.1f} / {on_hf['total_gpu_hours']:,.1f}" if on_hf else "–"
        rows.append(f"| {label} | {shipped['wall_hours']:.1f} / {shipped['total_gpu_hours']:,.1f} | {hf} |")
    return rows


if __name__ == "__main__":
    print("README.md:\n" + "\n".join(readme_rows()) + "\n\ndocs/planning.md:\n" + "\n".join(planning_rows()))
