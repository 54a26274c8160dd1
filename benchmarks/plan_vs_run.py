"""Benchmark: the calibrated plan of an experiment against the experiment's measured wall time (issue 24).

Runs, one after the other, from fresh processes as a user would:

1. ``esreason experiment plan EXPERIMENT --calibrate --json`` (timed; the plan goes to OUT/plan.json);
2. ``esreason experiment run EXPERIMENT --plan OUT/plan.json --output OUT/experiment --no-progress``
   (timed as a whole: the process's wall time, imports included).

Prints ONE JSON object: the calibration's wall time; per runner stage (``train/<m>``, ``eval/<m>``,
``report``) the planned and the measured seconds and their ratio; the totals (the sum of stages,
and the ``experiment run`` process's wall time against the plan's total); the largest per-stage
error; and whether the issue's targets hold (total within 15 %, every stage within 25 %).
Run it on an idle machine: nothing else may share the cores (the calibration and the run must see
the same machine).

Usage: python benchmarks/plan_vs_run.py [--experiment configs/experiments/demo.yaml] [--out DIR] [--set K=V ...]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--experiment", default="configs/experiments/demo.yaml")
    ap.add_argument("--out", help="working directory (default: a temporary one)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override, both commands")
    ap.add_argument("--plan", help="a calibrated plan already made for these settings: skip step 1")
    args = ap.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="esreason-plan-vs-run-"))
    out.mkdir(parents=True, exist_ok=True)
    sets = [x for item in args.set for x in ("--set", item)]
    cli = [sys.executable, "-m", "esreason.cli", "experiment"]

    t0 = time.perf_counter()
    if args.plan:
        plan_text, calibrate_s = Path(args.plan).read_text(), None
    else:
        plan_text = subprocess.run(cli + ["plan", args.experiment, "--calibrate", "--json", *sets],
                                   capture_output=True, text=True, check=True).stdout
        calibrate_s = round(time.perf_counter() - t0, 1)
    (out / "plan.json").write_text(plan_text)
    plan = json.loads(plan_text)

    t0 = time.perf_counter()
    subprocess.run(cli + ["run", args.experiment, "--plan", str(out / "plan.json"), "--output",
                          str(out / "experiment"), "--no-progress", *sets], check=True, capture_output=True)
    run_s = time.perf_counter() - t0

    from esreason.report.timing import planned_seconds

    planned = planned_seconds(plan)
    actual = json.loads((out / "experiment" / "experiment.json").read_text())["timings"]
    stages = {k: {"planned_s": round(planned[k], 1), "actual_s": actual[k], "ratio": round(actual[k] / planned[k], 3)}
              for k in planned if k in actual}
    worst = max(stages.items(), key=lambda kv: abs(kv[1]["ratio"] - 1.0))
    total_planned = plan["wall_s"]
    print(json.dumps({
        "experiment": args.experiment, "overrides": args.set, "machine": plan["machine"],
        "calibrate_s": calibrate_s if calibrate_s is not None else plan["calibration"]["seconds"],
        "stages": stages,
        "sum_of_stages": {"planned_s": round(sum(v["planned_s"] for v in stages.values()), 1),
                          "actual_s": round(sum(v["actual_s"] for v in stages.values()), 1)},
        "process": {"planned_s": total_planned, "actual_s": round(run_s, 1), "ratio": round(run_s / total_planned, 3)},
        "worst_stage": {"stage": worst[0], **worst[1]},
        "targets": {"total_within_15pct": abs(run_s / total_planned - 1) <= 0.15,
                    "every_stage_within_25pct": all(abs(v["ratio"] - 1) <= 0.25 for v in stages.values())},
        "out": str(out),
    }, indent=2))


if __name__ == "__main__":
    main()
