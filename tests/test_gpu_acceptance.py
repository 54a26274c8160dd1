"""scripts/gpu-acceptance.sh / benchmarks/gpu_acceptance.py in its CPU mode (--tiny --device cpu).

The same driver runs the real commands on the lent GPU machine at Qwen2.5-1.5B shapes
(docs/scale.md, "GPU acceptance"); here it runs them on the embedded weights through the shell
script, and every section must hold: the ES resume from step 2 ends on the same weights and fp32
masters after an update that moved them, the GRPO run makes 2 updates with the KL term through
TRL and is timed in its two phases next to the plan's terms, the evaluation reports Pass@K, and
the sampler matches ``generate``. Times are reported, never asserted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.heavy  # CLI subprocesses (about a minute): `--fast` leaves this file out


@pytest.fixture(scope="module")
def twin(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("acceptance")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "OUT")}
    env.update(PYTHON=sys.executable, ESREASON_WHEELS=str(tmp / "no-wheels"), OMP_NUM_THREADS="1")
    out = tmp / "acceptance.json"
    proc = subprocess.run([str(ROOT / "scripts" / "gpu-acceptance.sh"), "--tiny", "--device", "cpu", "--json",
                           str(out), "--work", str(tmp)], cwd=tmp, env=env, capture_output=True, text=True,
                          timeout=600)
    return proc, out


def test_every_section_holds_and_the_json_is_written(twin):
    proc, out = twin
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    assert result == json.loads(out.read_text())  # the file holds the same, section by section
    assert result["ok"] is True and result["failed"] == []
    assert set(result["section_s"]) == {"setup", "es_resume", "grpo", "grpo_plan", "eval", "sampler_vs_generate"}
    assert result["versions"]["trl"]["version"] and result["versions"]["transformers"]["version"]


def test_es_resume_from_step_2_ends_on_the_uninterrupted_checkpoint(twin):
    es = json.loads(twin[1].read_text())["es_resume"]
    assert es["ok"] and es["resume_equals_uninterrupted"] and es["masters_in_checkpoint"]
    assert es["sha256_resumed"] == es["sha256_uninterrupted"] and len(es["sha256_uninterrupted"]) == 2
    # not vacuous: the embedded weights score, so update 3 (the one redone) moved the checkpoint
    assert es["update_3_moved_weights_or_masters"] and not es["rewards_all_equal_per_update"][-1]
    assert len(es["reward_mean_per_update"]) == 3 and all(n > 0 for n in es["update_norm"])


def test_grpo_two_updates_with_kl_timed_next_to_the_plan(twin):
    result = json.loads(twin[1].read_text())
    grpo, plan = result["grpo"], result["grpo_plan"]
    assert grpo["ok"] and grpo["final_checkpoint_complete"]
    assert grpo["micro_batch"] == 2 and grpo["gradient_checkpointing"] and grpo["beta"] == 0.001
    assert grpo["bf16"] is False  # bf16 autocast is GPU only
    seqs = grpo["sequences_per_update"]
    assert grpo["micro_steps_per_update"] == [seqs // 2, seqs // 2]  # micro-batch 2
    assert len(grpo["phases_s"]["rollout"]) == 2 and len(grpo["phases_s"]["train"]) == 2
    assert all(t > 0 for t in grpo["phases_s"]["rollout"] + grpo["phases_s"]["train"])
    assert all(k is not None and k >= 0 for k in grpo["kl"]) and "2048" in grpo["responses_note"]
    # the planner's own terms for this config (2 updates of prompts x generations responses)
    assert plan["ok"] and plan["stage"] == "train/grpo" and plan["responses"] == 2 * seqs
    assert {"start", "decode", "train", "checkpoint"} <= set(plan["terms_s"])
    assert set(plan["measured_s"]) == {"rollout", "train", "rest_of_command"}


def test_eval_reports_pass_at_k(twin):
    ev = json.loads(twin[1].read_text())["eval"]
    assert ev["ok"] and ev["problems"] == ev["limit"] and ev["responses"] == ev["limit"] * ev["samples"]
    k = ev["samples"]
    assert 0 < ev["pass@1"] <= ev[f"pass@{k}"] <= 1  # the embedded default solves some demo-add problems


def test_sampler_matches_generate(twin):
    gen = json.loads(twin[1].read_text())["sampler_vs_generate"]
    assert gen["ok"] and len(gen["shapes"]) == 2
    for row in gen["shapes"]:
        assert row["tokens_generated"] == [row["B"] * row["L"]] * 2
        # greedy on the same weights and prompts: the same tokens (a tie flipped by the two code
        # paths' summation order could change a row, hence a share rather than all rows)
        assert row["rows_identical_share"] >= 0.5


def test_a_failed_section_exits_1_and_keeps_the_json(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "OUT")}
    env.update(PYTHON=sys.executable, ESREASON_WHEELS=str(tmp_path / "none"), OUT=str(tmp_path))
    # micro-batch 3 does not divide one optimizer step's 1 x 4 sequences: the CLI refuses the GRPO run
    # (and the plan its config); the sections are recorded, the process names them and exits 1
    proc = subprocess.run([str(ROOT / "scripts" / "gpu-acceptance.sh"), "--tiny", "--device", "cpu",
                           "--sections", "grpo,grpo_plan", "--grpo-set", "grpo.micro_batch_size=3",
                           "--work", str(tmp_path)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 1
    assert "gpu-acceptance: section grpo failed" in proc.stderr and "grpo.micro_batch_size" in proc.stderr
    saved = json.loads((tmp_path / "gpu_acceptance.json").read_text())  # $OUT/gpu_acceptance.json
    assert saved["ok"] is False and saved["failed"] == ["grpo", "grpo_plan"]
    assert "exit 2" in saved["grpo"]["error"] and saved["setup"]["ok"]


def test_no_section_starts_after_the_deadline(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "OUT")}
    env.update(PYTHON=sys.executable, ESREASON_WHEELS=str(tmp_path / "none"))
    out = tmp_path / "r.json"
    proc = subprocess.run([str(ROOT / "scripts" / "gpu-acceptance.sh"), "--tiny", "--device", "cpu", "--deadline-s",
                           "0", "--json", str(out), "--work", str(tmp_path)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and "deadline had passed" in proc.stderr
    saved = json.loads(out.read_text())
    assert saved["failed"] == ["setup"] and "es_resume" not in saved
