"""Print the plan tables of docs/planning.md and docs/gpu-layout.md that vary a shipped experiment.

Each row is ``esreason experiment plan configs/experiments/X.yaml --gpus G --json [--hf-only] [--set ...]``,
run in process through :func:`plan_tables.plan` (one plan per distinct command):

- ``engines_per_gpu_rows``: Easy 1.5B with K ES engines per GPU (docs/gpu-layout.md);
- ``limit_rows``: Easy 1.5B's ES update against plain inference, full rank and low rank (docs/planning.md);
- ``anchor_rows``: the plan's ES update at the settings of public ES timings (docs/planning.md);
- ``sensitivity_rows``: the Easy 1.5B plan with one assumption changed (docs/planning.md);
- ``host_rows``: host RAM, pinned memory and disk per node of every shipped GPU experiment (docs/planning.md).

``tests/test_plan_tables.py`` checks that every row appears verbatim in its document, so a change to
the plan that is not followed by pasting this script's output fails there, naming the row.

Usage: python scripts/plan_variants.py
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]


def _plan_tables():
    """scripts/plan_tables.py as a module (scripts/ is not a package)."""
    name = "_esreason_script_plan_tables"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / "plan_tables.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def plan(name: str, hf: bool = False, sets: tuple[str, ...] = (), gpus: int = 8) -> dict[str, Any]:
    """The plan of ``configs/experiments/<name>.yaml`` on ``gpus`` x H100, as ``--json`` prints it."""
    if gpus == 8:  # plan_tables' cache: the README's and planning.md's plans are computed once
        return _plan_tables().plan(name, hf, sets)
    return _plan_on(name, hf, sets, gpus)


@lru_cache(maxsize=None)
def _plan_on(name: str, hf: bool, sets: tuple[str, ...], gpus: int) -> dict[str, Any]:
    from esreason.cli import main

    args = ["experiment", "plan", f"configs/experiments/{name}.yaml", "--gpus", str(gpus), "--json"]
    args += (["--hf-only"] if hf else []) + [x for item in sets for x in ("--set", item)]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(args)
    if code != 0:
        raise SystemExit(f"plan failed: {' '.join(args)}")
    return json.loads(out.getvalue())


def _stage(p: dict[str, Any], name: str) -> dict[str, Any]:
    return next(s for s in p["stages"] if s["name"] == name)


def _updates(name: str) -> int:
    return int(yaml.safe_load((REPO / "configs" / "experiments" / f"{name}.yaml").read_text())["updates"])


def _per_update(p: dict[str, Any], updates: int) -> dict[str, float]:
    return {k: v / updates for k, v in _stage(p, "train/es")["terms_s"].items()}


def _wall_gpu(p: dict[str, Any]) -> str:
    return f"{p['wall_hours']:.1f} h / {p['total_gpu_hours']:,.1f}"


#: The paper's layout: one engine per GPU and the sharded exact update (the shipped configs choose auto).
PAPER_LAYOUT = ("configs.es.backend.engines_per_gpu=1", "configs.es.backend.update=sharded")


def _layout(k: int) -> tuple[str, ...]:
    """K ES engines per GPU on 8 GPUs: the paper's layout at K = 1, the replicated update above (the
    sharded update's NCCL group cannot hold two engines of one GPU)."""
    if k == 1:
        return PAPER_LAYOUT
    return (f"configs.es.backend.engines_per_gpu={k}", f"configs.es.backend.engines={8 * k}",
            "configs.es.backend.update=replicated")


def engines_per_gpu_rows() -> list[str]:
    """Easy 1.5B's ES stage with K engines per GPU (8 K engines on 8 GPUs), per ES update."""
    rows = ["| K (engines per GPU) | engines | update | members per engine | decode s | tail s | update s | per update s "
            "| / plain inference | ES stage h | GPU 0 memory | whole experiment |",
            "| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |"]
    updates = _updates("easy")
    population = yaml.safe_load((REPO / "configs" / "easy" / "es-qwen2.5-1.5b.yaml").read_text())["es"]["population_size"]
    for k in (1, 2, 4):
        p = plan("easy", False, _layout(k))
        t, es = _per_update(p, updates), _stage(p, "train/es")
        v = es["memory"]["verdicts"]["h100"]
        step = t["decode"] + t["tail"] + t["update"]
        rows.append(f"| {k} | {8 * k} | {'sharded' if k == 1 else 'replicated'} | {population // (8 * k)} "
                    f"| {t['decode']:.2f} | {t['tail']:.2f} | {t['update']:.2f} | {step:.2f} | {es['limit']['ratio']:.2f} "
                    f"| {es['wall_hours']:.2f} | {v['total_gib']:.1f} GiB ({round(100 * v['margin'])} % margin) "
                    f"| {_wall_gpu(p)} |")
    return rows


def _with_constants(name: str, sets: tuple[str, ...], constants: tuple[tuple[str, float], ...]) -> dict[str, Any]:
    """The plan with plan_table constants replaced (in process, restored after)."""
    import dataclasses

    from esreason.experiments import plan_table as tab

    saved = {k: tab.CONSTANTS[k] for k, _ in constants}
    try:
        for key, value in constants:
            tab.CONSTANTS[key] = dataclasses.replace(tab.CONSTANTS[key], value=value)
        return _plan_on.__wrapped__(name, False, sets, 8)
    finally:
        tab.CONSTANTS.update(saved)


#: (label, --set overrides, plan_table constants replaced, which update: "es" or "lowrank")
LIMIT_CASES = (
    ("full rank, shipped config (`engines_per_gpu: auto`: 2 per GPU on an H100, replicated update)", (), (), "es"),
    ("full rank, 4 engines per GPU (6 % of GPU 0 free; replicated update)", _layout(4), (), "es"),
    ("full rank, the paper's layout (1 engine per GPU, sharded update)", PAPER_LAYOUT, (), "es"),
    ("full rank, auto, if sharing engines read at the full roofline (`shared_read_efficiency` 1.0)", (),
     (("shared_read_efficiency", 1.0),), "es"),
    ("low-rank members in one batch, LoRA overhead 0.504 (cited: vLLM's benchmark, base and LoRA in one build)",
     (), (), "lowrank"),
    ("low-rank members in one batch, LoRA overhead 0.099 (cited: EGGROLL, 91 % of inference throughput)", (),
     (("lora_token_overhead", 0.099),), "lowrank"),
    ("low-rank members in one batch, LoRA overhead 0.045 (cited: vLLM V1 LoRA against the earlier base run)", (),
     (("lora_token_overhead", 0.045),), "lowrank"),
)


def limit_rows() -> list[str]:
    """Easy 1.5B on 8 x H100: the ES update against plain batched inference of the same 2,048 sequences."""
    rows = ["| Easy 1.5B on 8 x H100, per ES update | update s | plain inference s | ratio | ES stage h | whole experiment |",
            "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for label, sets, constants, which in LIMIT_CASES:
        p = _with_constants("easy", sets, constants) if constants else plan("easy", False, sets)
        es = _stage(p, "train/es")
        lim = es["limit"]
        if which == "es":
            rows.append(f"| {label} | {lim['update_s']:.2f} | {lim['inference_s']:.2f} | {lim['ratio']:.2f} "
                        f"| {es['wall_hours']:.2f} | {_wall_gpu(p)} |")
        else:
            rows.append(f"| {label} | {lim['lowrank_batch_s']:.2f} | {lim['inference_s']:.2f} | "
                        f"{lim['lowrank_ratio']:.2f} | – | – |")
    return rows


#: (anchor, its figure, the plan's settings, engines or None for the HF path, GPUs)
ANCHORS = (
    ("es-at-scale, vLLM version, 4 x H100 (\"~10x faster\" than its HF version's 559 s)", "~56 s",
     ("configs.es.es.population_size=30", "configs.es.train.batch_size=200", "configs.es.backend.engines=4",
      *PAPER_LAYOUT), 4),
    ("the authors' figure carried to the Easy setting (~27 responses/s per GPU, 8 GPUs)", "~9.5 s", PAPER_LAYOUT, 8),
    ("es-at-scale, HF version, 4 x H200 (VsonicV/es-at-scale#4)", "559 s",
     ("configs.es.es.population_size=30", "configs.es.train.batch_size=200"), None),
)


def anchor_rows() -> list[str]:
    """The plan's seconds per ES update (decode + tail + update) at each public anchor's settings."""
    rows = ["| anchor | its figure | the plan (per ES update: decode + tail + update) | plan / figure |",
            "| --- | ---: | ---: | ---: |"]
    updates = _updates("easy")
    for label, figure, sets, engines in ANCHORS:
        hf = engines is None
        p = plan("easy", hf, sets, 4 if hf else engines)
        t = _per_update(p, updates)
        step = t["decode"] + t.get("tail", 0.0) + t["update"]
        target = float(figure.strip("~ s").replace(",", ""))
        if hf:  # the plan's HF path runs the members one at a time on 1 GPU; the anchor used 4
            ours = f"{step:,.0f} s on 1 GPU, i.e. ~{step / 4:,.0f} s if spread over 4"
            ratio = (step / 4) / target
        else:
            ours = (f"{step:.1f} s ({engines} engines; decode {t['decode']:.1f}, tail {t['tail']:.1f}, "
                    f"update {t['update']:.1f})")
            ratio = step / target
        rows.append(f"| {label} | {figure} | {ours} | {ratio:.2f} |")
    return rows


def sensitivity_rows() -> list[str]:
    """Easy 1.5B on 8 x H100 with one stated assumption changed."""
    rows = ["| Easy 1.5B on 8 x H100 | wall h / GPU-h |", "| --- | ---: |"]
    cases = (("shipped configs, the plan's assumptions", ()),
             ("no runaway responses (`--set plan.runaway_share=0`)", ("plan.runaway_share=0",)),
             ("the paper's ES layout (1 engine per GPU, sharded update)", PAPER_LAYOUT),
             ("2 ES engines per GPU (16 engines, replicated update)", _layout(2)))
    for label, sets in cases:
        rows.append(f"| {label} | {_wall_gpu(plan('easy', False, sets))} |")
    return rows


HOST_EXPERIMENTS = (("Easy 1.5B", "easy"), ("Easy Llama-3.2-3B", "easy-llama-3.2-3b"),
                    ("Easy 7B", "easy-qwen2.5-7b"), ("Hard 1.5B", "hard"))


def _terms(d: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.1f}" for k, v in d.items() if v)


def host_rows() -> list[str]:
    """Per node: host RAM (with its terms), pinned memory and disk of each stage kind (the largest)."""
    rows = ["| experiment | stage | host RAM, GiB (terms) | of which pinned | disk, GiB (terms) |",
            "|---|---|---|---:|---|"]
    for label, name in HOST_EXPERIMENTS:
        p = plan(name)
        for stage in ("train/es", "train/grpo", "eval/base"):
            h = _stage(p, stage)["memory"]["host"]
            disk = f"{h['disk_total_gib']:.1f} ({_terms(h['disk_gib'])})" if h["disk_total_gib"] else "0"
            rows.append(f"| {label} | {stage} | {h['host_ram_total_gib']:.1f} ({_terms(h['host_ram_gib'])}) "
                        f"| {h['pinned_total_gib']:.1f} | {disk} |")
    return rows


if __name__ == "__main__":
    for title, rows in (("docs/gpu-layout.md, engines per GPU", engines_per_gpu_rows()),
                        ("docs/planning.md, the limit", limit_rows()),
                        ("docs/planning.md, public anchors", anchor_rows()),
                        ("docs/planning.md, sensitivity", sensitivity_rows()),
                        ("docs/planning.md, host side", host_rows())):
        print(title + ":\n" + "\n".join(rows) + "\n")
