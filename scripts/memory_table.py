"""Print docs/planning.md's "Per GPU, the shipped experiments on 8 GPUs" table from the plan itself.

For each shipped GPU experiment, ``esreason experiment plan FILE --gpus 8 --json`` in process; per
stage kind (ES training, GRPO training, evaluation) the stage whose worst role on an H100 needs the
most memory, with that role's terms, its H100 margin and the verdicts for the other GPUs. The docs
table is this script's output, so it always equals what the plan command prints.

Usage: python scripts/memory_table.py
"""

from __future__ import annotations

import contextlib
import io
import json

from esreason.cli import main

EXPERIMENTS = (("Easy 1.5B", "easy"), ("Easy Llama-3.2-3B", "easy-llama-3.2-3b"), ("Easy 7B", "easy-qwen2.5-7b"),
               ("Hard 1.5B", "hard"))
KINDS = (("train (es)", "es"), ("train (grpo)", "grpo"), ("eval", "eval"))
OTHER_GPUS = ("a100-40", "a100-80", "h200")


def plan(name: str) -> dict:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["experiment", "plan", f"configs/experiments/{name}.yaml", "--gpus", "8", "--json"]) == 0
    return json.loads(out.getvalue())


def kind_of(stage: dict) -> str:
    name = stage["name"].split("/")
    if name[0] == "eval":
        return "eval"
    return "es" if name[-1].endswith("es") and "grpo" not in name[-1].split("_")[-1] else "grpo"


def pct(x: float) -> str:
    return f"{round(100 * x)} %"


def verdict(v: dict) -> str:
    return f"fits {pct(v['margin'])}" if v["fits"] else f"**no** {pct(v['margin'])}"


def rows() -> list[str]:
    out = ["| experiment | stage (worst role) | H100 80 GB: GiB per GPU (terms) | margin | A100 40 GB | A100 80 GB | H200 |",
           "|---|---|---|---:|---|---|---|"]
    for label, name in EXPERIMENTS:
        stages = [s for s in plan(name)["stages"] if s.get("memory") and s["memory"].get("on_gpu")]
        for kind_label, kind in KINDS:
            of_kind = [s for s in stages if kind_of(s) == kind]
            if not of_kind:
                continue
            worst = max(of_kind, key=lambda s: s["memory"]["verdicts"]["h100"]["total_gib"])
            v = worst["memory"]["verdicts"]["h100"]
            role = next(r for r in worst["memory"]["roles"] if r["role"] == v["role"])
            terms = ", ".join(f"{k} {x:.1f}" for k, x in role["terms_gib"].items())
            others = " | ".join(verdict(worst["memory"]["verdicts"][g]) for g in OTHER_GPUS)
            out.append(f"| {label} | {kind_label}: {v['role']} | {v['total_gib']:.1f} ({terms}) | {pct(v['margin'])} | {others} |")
    return out


if __name__ == "__main__":
    print("\n".join(rows()))
