"""Benchmark: the Python API's cost against the CLI on the demo ES config (configs/demo/es.yaml).

Three ways to run the same ES training, each in a fresh process, interleaved ``--repeats`` times:

- ``cli``: ``esreason train es --config configs/demo/es.yaml``;
- ``api``: ``ESTrainer(args=ESConfig.from_yaml("configs/demo/es.yaml"))`` (the registered demo-add task
  and its built-in verifier: the same objects the CLI builds);
- ``api_reward``: the API with a TRL-style reward function over a ``datasets.Dataset`` of demo-add's
  training rows (``prompt`` messages and a ``gold`` column); the function calls the math verifier, so
  the rewards and the trajectory are the CLI's, and the difference is the reward-function path
  (dataset rows as problems, one call per member per batch, completions re-tokenised for
  ``completion_ids``, TRL's combination).

Per cell: the median ``time/step`` over updates 2..T (update 1 warms up), the median ``time/reward``,
and the process's wall time (imports, model and data loading included). Every cell's final
checkpoint is hashed: all three must be equal (the same run).

Prints ONE JSON object with the ratios api / cli and api_reward / cli of the step time (the target:
at most 1.02) and of the wall time. Usage: python benchmarks/api_overhead.py [--updates 8] [--repeats 3]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs" / "demo" / "es.yaml"

API = """
import sys
from esreason import ESConfig, ESTrainer
args = ESConfig.from_yaml({config!r}, ["train.max_steps={updates}", "checkpoint.every=0"], output_dir={out!r})
ESTrainer(args=args, model="demo").train()
"""
API_REWARD = """
from datasets import Dataset
from esreason import ESConfig, ESTrainer, tasks, verifiers
score = verifiers.get("math", format_reward=0.1)

def math_reward(completions, gold, **kwargs):  # conversational prompts: completions are messages (TRL)
    return [score(c[0]["content"], g).reward for c, g in zip(completions, gold)]

problems = tasks.get("demo-add").load("train")
ds = Dataset.from_list([{{"prompt": [dict(m) for m in p.messages], "gold": p.gold}} for p in problems])
args = ESConfig.from_yaml({config!r}, ["train.max_steps={updates}", "checkpoint.every=0"], output_dir={out!r},
                          task="demo-add-rows")
ESTrainer("demo", math_reward, ds, args=args).train()
"""


def run_cell(kind: str, updates: int, tmp: Path) -> dict[str, float | str]:
    out = tmp / kind
    if kind == "cli":
        cmd = [sys.executable, "-m", "esreason.cli", "train", "es", "--config", str(CONFIG), "--set",
               f"train.max_steps={updates}", "--set", "checkpoint.every=0", "--output", str(out), "--no-progress"]
    else:
        code = (API if kind == "api" else API_REWARD).format(config=str(CONFIG), updates=updates, out=str(out))
        cmd = [sys.executable, "-c", code]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=REPO)
    wall = time.perf_counter() - t0
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
    steps = [r["time/step"] for r in rows if "time/step" in r][1:]
    rewards = [r["time/reward"] for r in rows if "time/reward" in r][1:]
    ckpt = out / "checkpoints" / f"step_{updates}" / "model.safetensors"
    return {"step_s": statistics.median(steps), "reward_s": statistics.median(rewards), "wall_s": wall,
            "sha256": hashlib.sha256(ckpt.read_bytes()).hexdigest()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--updates", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    kinds = ("cli", "api", "api_reward")
    cells: dict[str, list[dict]] = {k: [] for k in kinds}
    with tempfile.TemporaryDirectory(prefix="esreason-api-overhead-") as tmp:
        for r in range(a.repeats):
            for kind in kinds:
                cells[kind].append(run_cell(kind, a.updates, Path(tmp) / f"r{r}"))
    med = {k: {m: statistics.median(c[m] for c in cells[k]) for m in ("step_s", "reward_s", "wall_s")} for k in kinds}
    hashes = {c["sha256"] for k in kinds for c in cells[k]}
    print(json.dumps({
        "benchmark": "api_overhead", "config": "configs/demo/es.yaml", "updates": a.updates, "repeats": a.repeats,
        "median": med,
        "ratio_step_api_over_cli": round(med["api"]["step_s"] / med["cli"]["step_s"], 4),
        "ratio_step_api_reward_over_cli": round(med["api_reward"]["step_s"] / med["cli"]["step_s"], 4),
        "ratio_wall_api_over_cli": round(med["api"]["wall_s"] / med["cli"]["wall_s"], 4),
        "ratio_wall_api_reward_over_cli": round(med["api_reward"]["wall_s"] / med["cli"]["wall_s"], 4),
        "reward_share_of_step": {k: round(med[k]["reward_s"] / med[k]["step_s"], 4) for k in kinds},
        "same_checkpoint": len(hashes) == 1,
        "per_repeat": cells,
    }, indent=1))


if __name__ == "__main__":
    main()
