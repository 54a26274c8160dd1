"""Benchmark: `esreason demo` or the README's test command, an earlier revision against this tree.

The project's speed targets are stated against revision b762b06: the demo at least 20 % faster and
the suite in at most half the time, measured side by side on the same idle machine. This script
checks out ``--before`` (default b762b06, that baseline) and ``--after``
(default HEAD) into git worktrees under ``--workdir`` and runs the same command twice, one after
the other on this machine, once on each revision's sources, both from the environment this script
runs in (``PYTHONPATH`` puts the revision's ``src`` first, so the editable install is overridden and
the working tree can change while the benchmark runs). One run each: the machine is shared and noisy, so read the ratio, and repeat the script
for a second reading.

``--what demo``: ``esreason demo --output DIR`` (the full demo: five methods, evaluation, report);
reports wall time, the stage timings of ``experiment.json`` and whether every evaluated response
(method, task, problem, sample, greedy, text) is the same in both runs (a speed-up that keeps every
sampling stream must not change the demo's evidence; the verdict files' wording differs between
revisions, so the responses are compared, not the verdicts), and each run's largest paired minimum
detectable Pass@1 difference per task (``mdd_paired_max_pp``, from its report.json; the demo's power).
``--what suite``: ``python -m pytest -q`` in each tree (its own tests against its own sources and
its own pytest options); reports wall time and the counts pytest printed.

Prints ONE JSON object: ``before``/``after`` (wall_s, details), ``ratio`` (after / before),
``faster_by`` (1 - ratio).

Usage: python benchmarks/side_by_side.py --what demo|suite [--before b762b06] [--after HEAD]
       [--workdir /tmp/esreason-sbs]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _worktree(rev: str, workdir: Path) -> Path:
    tree = workdir / f"tree-{rev}"
    if not tree.is_dir():
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "-f", "--detach", str(tree), rev], check=True,
                       stdout=subprocess.DEVNULL)
    return tree


def _env(src: Path) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(src), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    env.pop("PYTEST_ADDOPTS", None)
    return env


def _demo(tree: Path, out: Path) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, "-c", "import sys; from esreason.cli import main; sys.exit(main())", "demo", "--output",
           str(out)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=tree, env=_env(tree / "src"), capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode:
        raise SystemExit(f"esreason demo failed in {tree} (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
    timings = json.loads((out / "experiment.json").read_text())["timings"]
    responses = set()
    for path in sorted((out / "eval").glob("*/*/responses.jsonl")):
        for line in path.read_text().splitlines():
            r = json.loads(line)
            responses.add((path.parent.parent.name, r["task"], r["problem_id"], r["sample"], r["greedy"], r["text"]))
    mdd = {}
    report = out / "report" / "report.json"
    if report.is_file():  # the largest paired MDD per task, in pp (the demo's power: the target is <= 5)
        for t in json.loads(report.read_text()).get("mdd", {}).get("tasks", []):
            mdd[t["task"]] = round(100 * max(t["mdd_paired"].values()), 2)
    return {"wall_s": round(wall, 1), "stages_s": timings, "stages_sum_s": round(sum(timings.values()), 1),
            "mdd_paired_max_pp": mdd, "responses": responses}


def _suite(tree: Path) -> dict:
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=tree, env=_env(tree / "src"), capture_output=True, text=True)
    wall = time.perf_counter() - t0
    tail = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    counts = {k: int(v) for v, k in re.findall(r"(\d+) (passed|failed|errors?|skipped|deselected)", tail)}
    return {"wall_s": round(wall, 1), "exit": proc.returncode, "summary": tail, "counts": counts}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--what", choices=("demo", "suite"), required=True)
    ap.add_argument("--before", default="b762b06", help="the earlier revision (default: the speed targets' baseline)")
    ap.add_argument("--after", default="HEAD", help="the later revision (default: HEAD)")
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/esreason-sbs"))
    args = ap.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    revs = [subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", r], capture_output=True, text=True,
                           check=True).stdout.strip() for r in (args.before, args.after)]
    old, new = (_worktree(r, args.workdir) for r in revs)
    if args.what == "demo":
        before = _demo(old, args.workdir / "demo-before")
        after = _demo(new, args.workdir / "demo-after")
        a, b = before.pop("responses"), after.pop("responses")
        extra = {"responses": len(a), "same_responses": a == b}
    else:
        before, after = _suite(old), _suite(new)
        extra = {}
    ratio = after["wall_s"] / before["wall_s"]
    print(json.dumps({"what": args.what, "before_rev": revs[0], "after_rev": revs[1],
                      "cpus": os.cpu_count(), "before": before, "after": after, "ratio": round(ratio, 3),
                      "faster_by": round(1 - ratio, 3), **extra}, indent=1))


if __name__ == "__main__":
    main()
