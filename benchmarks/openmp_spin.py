"""Benchmark: libgomp's spin count, its default against esreason's, on an idle and on a busy machine.

Why (:mod:`esreason.openmp`): torch's idle OpenMP threads spin 300,000 iterations by default
before they sleep; with the embedded default's microsecond operators they then compete with the
main thread and with any other process. The CLI sets ``GOMP_SPINCOUNT`` to
:data:`esreason.openmp.SPIN_COUNT` unless the user chose a wait policy.

Workload: the demo experiment's ES updates on the embedded default (``esreason train es`` with
configs/demo/es.yaml at the demo's N = 32, B = 16, population-batched, greedy 64 tokens; torch's
default threads, one per core), run by the CLI in a fresh process per cell (libgomp reads its
setting once, at torch's import): ``--updates`` updates, the first the warm-up, and the cell's
value the median seconds per update of the others (``time/step`` in metrics.jsonl). Cells: spin
``default`` (``GOMP_SPINCOUNT=300000``, libgomp's own default, set explicitly because the CLI
would otherwise set ours) and ``ours`` (:data:`esreason.openmp.SPIN_COUNT`), each on the idle
machine and beside ``--hogs`` busy processes (``yes > /dev/null``), run in the order idle-default,
idle-ours, busy-default, busy-ours, ``--repeats`` times; each cell's median over repeats.

Prints ONE JSON object: seconds per update per cell, and the ratios default / ours on the idle and on
the busy machine (> 1: ours is faster) and busy / idle per setting (how much one busy process costs).
Usage: python benchmarks/openmp_spin.py [--updates 4] [--repeats 2] [--hogs 1] [--spin N]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: libgomp's spin count when neither GOMP_SPINCOUNT nor OMP_WAIT_POLICY is set (its manual).
LIBGOMP_DEFAULT = 300_000


def cell(spin: int, hogs: int, updates: int) -> float:
    """Median seconds per ES update after the first, at ``GOMP_SPINCOUNT=spin``, beside ``hogs`` busy processes."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS")}
    env["GOMP_SPINCOUNT"] = str(spin)
    with tempfile.TemporaryDirectory(prefix="esreason-openmp-spin-") as tmp:
        busy = [subprocess.Popen(["yes"], stdout=subprocess.DEVNULL) for _ in range(hogs)]
        try:
            subprocess.run([sys.executable, "-m", "esreason.cli", "train", "es", "--config", "configs/demo/es.yaml",
                            "--set", "es.population_size=32", "--set", f"train.max_steps={updates}",
                            "--set", "checkpoint.every=0", "--output", f"{tmp}/run", "--no-progress"],
                           env=env, check=True, capture_output=True, text=True, cwd=REPO)
        finally:
            for p in busy:
                p.kill()
                p.wait()
        rows = [json.loads(line) for line in Path(f"{tmp}/run/metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [r["time/step"] for r in rows if "time/step" in r]
    return statistics.median(steps[1:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--updates", type=int, default=4, help="ES updates per cell, the first the warm-up")
    ap.add_argument("--repeats", type=int, default=2, help="rounds of the four cells (median per cell)")
    ap.add_argument("--hogs", type=int, default=1, help="busy processes beside the busy cells")
    ap.add_argument("--spin", type=int, default=None, help="the spin count of the `ours` cells "
                    "(default: esreason.openmp.SPIN_COUNT; another value to compare a candidate)")
    args = ap.parse_args()
    from esreason.openmp import SPIN_COUNT

    ours = SPIN_COUNT if args.spin is None else args.spin
    spins = {"default": LIBGOMP_DEFAULT, "ours": ours}
    cells = [("idle", "default", 0), ("idle", "ours", 0), ("busy", "default", args.hogs), ("busy", "ours", args.hogs)]
    got: dict[str, list[float]] = {f"{load}/{spin}": [] for load, spin, _ in cells}
    for _ in range(args.repeats):
        for load, spin, hogs in cells:
            got[f"{load}/{spin}"].append(round(cell(spins[spin], hogs, args.updates), 3))
    s = {k: round(statistics.median(v), 3) for k, v in got.items()}
    print(json.dumps({
        "workload": "the demo's ES updates (N 32, B 16, batched, 64 greedy tokens), torch's default threads",
        "cpu_count": os.cpu_count(), "spin_ours": ours, "hogs": args.hogs,
        "seconds_per_update": s, "samples": got,
        "default_over_ours": {"idle": round(s["idle/default"] / s["idle/ours"], 3),
                              "busy": round(s["busy/default"] / s["busy/ours"], 3)},
        "busy_over_idle": {"default": round(s["busy/default"] / s["idle/default"], 3),
                           "ours": round(s["busy/ours"] / s["idle/ours"], 3)},
    }, indent=2))


if __name__ == "__main__":
    main()
