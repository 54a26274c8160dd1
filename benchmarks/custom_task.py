"""Benchmark: does ES learn the custom example's task, against the shuffled-reward control, over seeds?

The task of examples/custom_task (4-digit additions where every column carries, partial credit per
digit right, ``digit_reward`` in TRL's signature) trained through the Python API with the example's
settings (N = 16, sigma 2e-3, alpha 1e-3, B = 16, greedy, 64 tokens) for ``--updates`` updates, once
with the real rewards and once with ``reward_control="shuffle"`` (member rewards permuted before
shaping: the same reward distribution, detached from the directions), for each training seed.

Per run: the mean training reward of the first and the last ``--window`` updates, and the held-out
Pass@1 / Pass@K / Maj@K (correct = reward 1.0, every digit right) and the mean digit reward of the
final checkpoint on the first ``--problems`` test problems (``--samples`` samples at temperature 0.6),
beside the base model's.

Prints ONE JSON object: per seed and arm, and across seeds the mean and the paired difference
real - shuffled with its spread (seeds are few: read the per-seed values).
Usage: python benchmarks/custom_task.py [--seeds 0,1,2] [--updates 30] [--problems 100] [--samples 8]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "custom_task"
SYSTEM = "Please reason step by step, and put your final answer within \\boxed{}."


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--updates", type=int, default=30)
    ap.add_argument("--window", type=int, default=5)
    ap.add_argument("--problems", type=int, default=100)
    ap.add_argument("--samples", type=int, default=8)
    a = ap.parse_args()
    seeds = [int(s) for s in a.seeds.split(",")]
    with tempfile.TemporaryDirectory(prefix="esreason-custom-task-") as tmp:
        root = Path(tmp) / "custom_task"
        shutil.copytree(EXAMPLE, root, ignore=shutil.ignore_patterns("data", "__pycache__"))
        subprocess.run([sys.executable, str(root / "make_data.py")], check=True, capture_output=True)
        sys.path.insert(0, str(root))
        from datasets import load_dataset
        from reward import digit_reward, final_answer

        from esreason import ESConfig, ESTrainer, evaluate

        def to_prompt(row):
            return {"prompt": [{"role": "system", "content": SYSTEM},
                               {"role": "user", "content": f"{row['a']}+{row['b']}"}]}

        data = load_dataset("json", data_files={s: str(root / f"data/{s}.jsonl") for s in ("train", "test")})
        data = data.map(to_prompt)
        test = data["test"].select(range(a.problems))

        def held_out(model: str) -> dict[str, float]:
            out = Path(tmp) / "eval" / model.replace("/", "_")
            scores = evaluate(model, test, reward_funcs=digit_reward, answer_fn=final_answer, n=a.samples,
                              k=[1, a.samples], max_new_tokens=64, ci_resamples=0, name="carry-add", output_dir=out)
            rewards = [json.loads(x)["reward"] for x in (out / "carry-add" / "responses.jsonl").read_text().splitlines()
                       if x.strip() and not json.loads(x).get("greedy")]
            shutil.rmtree(out)
            return {"pass@1": scores["pass@1"], f"pass@{a.samples}": scores[f"pass@{a.samples}"],
                    f"maj@{a.samples}": scores[f"maj@{a.samples}"], "mean_digit_reward": statistics.mean(rewards)}

        runs: dict[str, dict[str, dict]] = {}
        for seed in seeds:
            for arm, control in (("real", "none"), ("shuffled", "shuffle")):
                out = Path(tmp) / f"{arm}-{seed}"
                args = ESConfig(output_dir=str(out), task="carry-add", population_size=16, sigma=2e-3, alpha=1e-3,
                                batch_size=16, max_steps=a.updates, checkpoint_every=0, max_new_tokens=64, seed=seed,
                                reward_control=control)
                result = ESTrainer("demo", digit_reward, data["train"], args=args).train()
                rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
                rewards = [r["reward/mean"] for r in rows if "reward/mean" in r]
                runs.setdefault(str(seed), {})[arm] = {
                    "train_reward_first": statistics.mean(rewards[:a.window]),
                    "train_reward_last": statistics.mean(rewards[-a.window:]),
                    "held_out": held_out(str(result.final_checkpoint))}
        base = held_out("demo")
    diffs = [runs[s]["real"]["held_out"]["pass@1"] - runs[s]["shuffled"]["held_out"]["pass@1"] for s in runs]
    gains = [runs[s]["real"]["train_reward_last"] - runs[s]["shuffled"]["train_reward_last"] for s in runs]
    print(json.dumps({
        "benchmark": "custom_task", "task": "carry-add (examples/custom_task)", "updates": a.updates, "seeds": seeds,
        "held_out_problems": a.problems, "samples": a.samples, "base": base, "runs": runs,
        "held_out_pass@1_real_minus_shuffled": {"per_seed": diffs, "mean": statistics.mean(diffs),
                                                "sd": statistics.stdev(diffs) if len(diffs) > 1 else None},
        "train_reward_last_real_minus_shuffled": {"per_seed": gains, "mean": statistics.mean(gains)},
    }, indent=1))


if __name__ == "__main__":
    main()
