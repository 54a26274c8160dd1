"""GPU acceptance: the real commands on one CUDA device, from source, in one JSON, inside a time budget.

Made for the lent offline GPU machine (one H200 or H100, torch 2.11, Python 3.12, no TRL, datasets or
math-verify, at most 64 MiB carried, 10 minutes per command): ``scripts/gpu-acceptance.sh`` installs
the wheels ``scripts/gpu-wheels.sh`` fetched beforehand (``pip install --no-index --no-deps
--target``), puts ``src`` and that directory on ``PYTHONPATH`` and runs this driver. The driver
itself only orchestrates: every step is a child process (benchmarks/gpu_acceptance_clock.py), so a
step can be stopped at the deadline and none holds GPU memory for the next.

1. ``preflight`` (benchmarks/gpu_acceptance_preflight.py), written into the JSON head before any
   section starts: imports and versions (TRL's GRPO trainer, datasets, math-verify, peft, pyarrow,
   ...), datasets' pyarrow/fsspec requirements against the installed ones, free disk, the GPU as torch
   reports it (name, ``total_memory``), the plan's row for it, and nvidia-smi's name, memory and driver.
2. ``setup``: the 1.5B-shape model directory and the embedded default in bf16
   (benchmarks/gpu_acceptance_local.py says why both, and why both are ``llama`` directories).
3. The sections, in :data:`SECTIONS` order, most informative first:

   - ``es_resume_embedded``: ``esreason train es`` on the embedded weights (their updates move the
     weights), 3 updates, then ``--resume-from step_2``: the final weights and fp32 masters hash the
     same as the uninterrupted run's (benchmarks/gpu_acceptance_runs.py);
   - ``grpo``: ``esreason train grpo`` through TRL without vLLM, Easy's micro-batch 2, activation
     checkpointing, bf16 and KL, 2 updates, rollout and train seconds per update; ``grpo_plan``: the
     plan's terms for the same run on the GPU found (H100 or H200), printed beside the measured phases;
   - ``eval``: ``esreason eval`` with Pass@1 and Pass@K on the first demo-add problems;
   - ``es_stage_release``: an ES stage trained as ``experiment run`` trains it (a child process on a
     GPU), and what the runner process holds afterwards (benchmarks/gpu_acceptance_release.py);
   - ``sampler_vs_generate``: greedy token ids of the HF sampler and ``generate`` on padded prompts,
     EOS handled alike, and tokens per second side by side (benchmarks/gpu_acceptance_parity.py);
   - ``es_resume`` (GPU only; the CPU twin's ``es_resume_embedded`` is the same run): the resume
     check at 1.5B shapes, three 9.3 GB checkpoints.

Deadlines: one budget (``--budget-s``; :data:`CUDA_BUDGET_S` on CUDA) counted from the shell script's
start. A section runs only when its estimate (:data:`ESTIMATES_S`) fits the time left, else it is
reported ``not started`` with its estimate; each child gets the time left when it starts as its
timeout and is killed with everything it started at the deadline. A section whose modules failed to
import in the preflight is ``skipped`` with the import error. The JSON is rewritten after every
section (``--json``, default ``$OUT/gpu_acceptance.json``); the process exits 1 naming every failed,
not started or skipped section. ``--tiny --device cpu`` is the CPU twin (tests/test_gpu_acceptance.py).
Times are reported, never checked.

Usage: scripts/gpu-acceptance.sh [--tiny] [--device cuda|cpu] [--sections a,b] [--json PATH]
                                 [--budget-s S] [--grpo-set KEY=VALUE ...] [--work DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_acceptance_preflight as preflight  # noqa: E402
import gpu_acceptance_runs as runs  # noqa: E402
from gpu_acceptance_clock import Budget, Children, Recorder, script_t0  # noqa: E402

#: In the order they run: the moving-weights resume check right after setup, the 1.5B resume (three
#: 9.3 GB checkpoints: the most disk, the least news) last.
SECTIONS = ("es_resume_embedded", "grpo", "grpo_plan", "eval", "es_stage_release", "sampler_vs_generate",
            "es_resume")
#: The CPU twin's sections (its main model is the embedded default: es_resume would repeat es_resume_embedded).
TWIN_SECTIONS = tuple(s for s in SECTIONS if s != "es_resume")
#: shapes per section: the GPU run's, and the CPU twin's (--tiny)
SHAPES: dict[bool, dict[str, Any]] = {
    False: {"es": {"population": 4, "prompts": 4, "tokens": 32},
            "es_embedded": {"population": 4, "prompts": 4, "tokens": 64},
            "grpo": {"prompts": 2, "generations": 8, "tokens": 64},
            "eval": {"limit": 8, "samples": 4, "tokens": 32},
            "generate": [(16, 128), (64, 256)]},
    # the embedded default needs ~40 tokens to reach its boxed answer (64, as configs/demo/*.yaml)
    True: {"es_embedded": {"population": 4, "prompts": 4, "tokens": 64},
           "grpo": {"prompts": 2, "generations": 4, "tokens": 64},
           "eval": {"limit": 4, "samples": 4, "tokens": 64},
           "generate": [(2, 8), (4, 12)]},
}
#: Seconds each step is expected to take. GPU: from the H100 figures of 2026-11-28 (docs/measurements.md;
#: docs/internals.md, "GPU acceptance", shows the arithmetic); the H200 is the same chip with faster memory. CPU twin: measured
#: on the 2 shared development cores, rounded up. A section starts only when its estimate fits.
ESTIMATES_S: dict[bool, dict[str, float]] = {
    False: {"setup": 25, "es_resume_embedded": 30, "grpo": 90, "grpo_plan": 45, "eval": 25,
            "es_stage_release": 25, "sampler_vs_generate": 75, "es_resume": 140},
    True: {"setup": 15, "es_resume_embedded": 45, "grpo": 40, "grpo_plan": 60, "eval": 20,
           "es_stage_release": 30, "sampler_vs_generate": 25},
}
#: the model the CPU twin's plan section prices (offline parameter count; the GPU run plans its own directory)
PLAN_MODEL = "Qwen/Qwen2.5-1.5B-Instruct"
#: The budget on CUDA (s), from the shell script's start: the device call's timeout_s (420 s,
#: docs/internals.md "GPU acceptance") less 30 s to write the JSON and stop.
CUDA_BUDGET_S = 390.0


def versions(pre: dict[str, Any]) -> dict[str, Any]:
    """Package -> version (or the import error) from the preflight's imports."""
    return {name: info.get("version", info.get("error")) for name, info in pre.get("imports", {}).items()}


def run_preflight(args: argparse.Namespace, work: Path, kids: Children) -> dict[str, Any]:
    out = work / "preflight.json"
    try:
        kids.run([sys.executable, str(Path(preflight.__file__)), args.device, str(work), str(out)], "preflight")
        return json.loads(out.read_text())
    except Exception as exc:  # noqa: BLE001 -- the sections still run; the head says why it is empty
        return {"error": f"{type(exc).__name__}: {exc}"}


#: The plan's GRPO terms (esreason.experiments.plan, a stage's terms_s) each measured phase covers.
PHASE_TERMS = {"rollout": ("decode", "tail", "reload", "heldout"), "train": ("train",),
               "rest_of_command": ("start", "checkpoint")}


def beside(measured: dict[str, float], terms: dict[str, float]) -> list[str]:
    """The measured GRPO phases beside the plan's terms that cover them, one line each."""
    lines = [f"  {'measured phase':<18}{'s':>8}   plan terms (s)"]
    left = dict(terms)
    for phase, seconds in measured.items():
        mine = {t: left.pop(t) for t in PHASE_TERMS.get(phase, ()) if t in left}
        plan = " + ".join(f"{t} {v:.1f}" for t, v in mine.items()) or "-"
        lines.append(f"  {phase:<18}{seconds:>8.1f}   {plan} = {sum(mine.values()):.1f}")
    if left:
        lines.append(f"  {'(not measured)':<26}   " + " + ".join(f"{t} {v:.1f}" for t, v in left.items()))
    return lines


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    shapes, estimates = SHAPES[args.tiny], ESTIMATES_S[args.tiny]
    budget = Budget(args.budget_s, script_t0())
    rec = Recorder(args.json, {"device": args.device, "tiny": args.tiny, "shapes": shapes}, budget)
    kids = Children(budget, work / "logs", rec.children)
    pre = run_preflight(args, work, kids)
    gpu = pre.get("gpu", {})
    rec.result.update(preflight=pre, versions=versions(pre), device_name=gpu.get("name", "cpu"))
    rec.write()  # the head, before any section starts
    models: dict[str, str] = {}

    def setup() -> dict[str, Any]:
        out = runs.local_section("setup", {"work": str(work), "tiny": args.tiny, "device": args.device}, work, kids)
        models["embedded"] = out["embedded"]["path"]
        models["main"] = out["shape"]["path"] if "shape" in out else out["embedded"]["path"]
        return out

    rec.section("setup", estimates["setup"], setup, preflight.missing(pre, "setup"))
    # the plan's --gpu-type of the GPU found (its memory rows split the A100 in two); the H100 otherwise
    plan_gpu = {"a100-40": "a100", "a100-80": "a100"}.get(gpu.get("plan_gpu_type"), gpu.get("plan_gpu_type")) or "h100"

    def plan_args() -> dict[str, Any]:
        # the twin's embedded model (0.87M) is below the plan's throughput table: plan the GPU run's size
        model = PLAN_MODEL if args.tiny else models["main"]
        mapping = runs.grpo_mapping(runs.grpo_overrides(model, "cuda", shapes["grpo"]) + args.grpo_set)
        return {"model": model, "updates": 2, "gpu": plan_gpu, "mapping": mapping}

    steps = {
        "es_resume_embedded": lambda: runs.es_resume(models["embedded"], work, args.device, shapes["es_embedded"], kids),
        "es_resume": lambda: runs.es_resume(models["main"], work, args.device, shapes["es"], kids),
        "grpo": lambda: runs.grpo(models["main"], work, args.device, shapes["grpo"], kids, args.grpo_set),
        "grpo_plan": lambda: runs.local_section("grpo_plan", plan_args(), work, kids),
        "eval": lambda: runs.evaluate(models["main"], work, args.device, shapes["eval"], kids),
        "es_stage_release": lambda: runs.es_stage_release(models["embedded"], work, args.device, kids),
        "sampler_vs_generate": lambda: runs.local_section("sampler_vs_generate", {
            "tiny": args.tiny, "device": args.device, "shapes": shapes["generate"], "embedded": models["embedded"],
            "repeats": 2}, work, kids),
    }
    for name in (s for s in (TWIN_SECTIONS if args.tiny else SECTIONS) if s in args.sections):
        why = preflight.missing(pre, name) or (None if models else "needs setup, which did not finish")
        rec.section(name, estimates[name], steps[name], why)
        done = rec.result.get("grpo", {})
        if name == "grpo_plan" and rec.result[name].get("ok") and done.get("phases_s"):
            measured = {k: sum(v) for k, v in done["phases_s"].items()}
            measured["rest_of_command"] = done["command_s"] - sum(measured.values())  # start, load, checkpoint
            rec.result[name]["measured_s"] = measured
            rec.write()
    return rec.result


def report(result: dict[str, Any]) -> list[str]:
    """stderr lines: the plan beside the measured GRPO phases, then every section that did not hold."""
    lines = []
    plan = result.get("grpo_plan", {})
    if plan.get("measured_s"):
        lines.append(f"gpu-acceptance: GRPO, {plan['responses']} responses in 2 updates on {result['device_name']}: "
                     f"measured phases beside the plan's terms ({plan['gpu_type']}):")
        lines += beside(plan["measured_s"], plan["terms_s"])
    for name in result["failed"]:
        lines.append(f"gpu-acceptance: section {name} failed: {result[name].get('error', 'a check is false')}")
    for name in result["not_started"] + result["skipped"]:
        lines.append(f"gpu-acceptance: section {name} {result[name]['status']}: {result[name]['reason']}")
    return lines


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    import torch

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tiny", action="store_true", help="the CPU twin's shapes (embedded weights, tiny runs)")
    ap.add_argument("--device", default=None, help="cuda (default when available) or cpu")
    ap.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated subset of {','.join(SECTIONS)}")
    ap.add_argument("--json", type=Path, default=None, help="result file, rewritten after every section "
                    "(default: $OUT/gpu_acceptance.json when OUT is set)")
    ap.add_argument("--grpo-set", action="append", default=[], metavar="KEY=VALUE",
                    help="an extra override of the GRPO run (and of its plan), e.g. grpo.micro_batch_size=4")
    ap.add_argument("--work", type=Path, default=None, help="scratch directory (default: a temporary one)")
    ap.add_argument("--budget-s", type=float, default=None,
                    help=f"seconds from the script's start within which everything ends: a section starts only "
                         f"if its estimate fits, a child is stopped at the end (default: {CUDA_BUDGET_S:.0f} on "
                         f"CUDA, none on CPU)")
    args = ap.parse_args(argv)
    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        ap.error("--device cuda but torch.cuda.is_available() is False (use --tiny --device cpu for the CPU twin)")
    if args.budget_s is None and args.device.startswith("cuda"):
        args.budget_s = CUDA_BUDGET_S
    args.sections = [s for s in args.sections.split(",") if s]
    unknown = sorted(set(args.sections) - set(SECTIONS))
    if unknown:
        ap.error(f"--sections: unknown {unknown[0]!r}; choose from {', '.join(SECTIONS)}")
    if args.json is None and os.environ.get("OUT"):
        args.json = Path(os.environ["OUT"]) / "gpu_acceptance.json"
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="esreason-acceptance-", dir=args.work) as tmp:
        result = run(args, Path(tmp))
    print(json.dumps(result, indent=2, default=str))
    for line in report(result):
        print(line, file=sys.stderr)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
