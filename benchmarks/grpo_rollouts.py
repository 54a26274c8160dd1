"""Benchmark: GRPO's rollouts on esreason's sampler vs TRL's ``generate``, side by side.

The demo's GRPO stage (``esreason demo``'s config: embedded default, demo-add, B = 16 prompts x
G = 8 responses, 64 tokens, temperature 1.0, lr 2e-5, held-out evaluation off) trained for
``--updates`` updates with ``grpo.rollouts: generate`` (TRL's ``model.generate``) and ``sampler``
(:mod:`esreason.grpo.rollouts`), alternating within each repeat so machine noise hits both alike.

Prints ONE JSON object: per engine the wall seconds of each run, the summed ``time/rollout`` (TRL's
generation + scoring + reference forwards), the mean reward and completion length over the run,
their medians, and ``ratio`` (sampler / generate, median wall). The two engines draw from
different random streams (torch's global generator vs the sampler's seeded one), so the rewards
are two samples of one process, not equal numbers.

Usage: python benchmarks/grpo_rollouts.py [--updates 10] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path


def _run(engine: str, updates: int, work: Path) -> dict:
    from esreason.demo import demo_spec
    from esreason.grpo.run import run_grpo

    spec = demo_spec(extra=(f"configs.grpo.grpo.rollouts={engine}", f"configs.grpo.train.max_steps={updates}",
                            "configs.grpo.eval.every=0", f"updates={updates}"))
    t0 = time.perf_counter()
    run_grpo(spec.grpo, work, progress=False)
    wall = time.perf_counter() - t0
    rows = [json.loads(line) for line in (work / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "reward/mean" in r]
    return {"wall_s": round(wall, 2), "rollout_s": round(sum(r["time/rollout"] for r in rows), 2),
            "reward": round(statistics.mean(r["reward/mean"] for r in rows), 4),
            "length": round(statistics.mean(r["completions/mean_length"] for r in rows), 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--updates", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    runs: dict[str, list[dict]] = {"generate": [], "sampler": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            for engine in runs:
                runs[engine].append(_run(engine, args.updates, Path(tmp) / f"{engine}-{r}"))
    med = {k: statistics.median(x["wall_s"] for x in v) for k, v in runs.items()}
    print(json.dumps({
        "updates": args.updates, "repeats": args.repeats, "runs": runs,
        "median_wall_s": med,
        "median_rollout_s": {k: statistics.median(x["rollout_s"] for x in v) for k, v in runs.items()},
        "ratio": round(med["sampler"] / med["generate"], 3),
    }, indent=1))


if __name__ == "__main__":
    main()
