"""scripts/gpu-acceptance.sh / benchmarks/gpu_acceptance.py in its CPU mode (--tiny --device cpu).

The same driver runs the real commands on the lent GPU machine at Qwen2.5-1.5B shapes
(docs/internals.md, "GPU acceptance"); here it runs them on the embedded weights through the shell
script, and every section must hold: the preflight is in the JSON head before any section ran, the
ES resume from step 2 ends on the same weights and fp32 masters after an update that moved them, the
GRPO run makes 2 updates with the KL term through TRL and is timed in its two phases beside the plan's
terms, the evaluation reports Pass@K, an ES stage trained as ``experiment run`` trains it leaves its
runner holding nothing, and the sampler's greedy ids equal ``generate``'s exactly on padded prompts.
With a shortened budget and a section that cannot finish, everything ends within the budget, every
section finished or is "not started" with its estimate, and no child ran past the deadline. Times are
reported, never asserted; the budget test's margins are for killing a process, not for speed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.heavy  # CLI subprocesses (a few minutes): `--fast` leaves this file out


def _env(tmp: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "OUT", "ESREASON_ACCEPTANCE_T0")}
    env.update(PYTHON=sys.executable, ESREASON_WHEELS=str(tmp / "no-wheels"), OMP_NUM_THREADS="1", **extra)
    return env


def _script(tmp: Path, *args: str, env: dict[str, str] | None = None, timeout: int = 900):
    return subprocess.run([str(ROOT / "scripts" / "gpu-acceptance.sh"), "--tiny", "--device", "cpu",
                           "--work", str(tmp), *args], cwd=tmp, env=env or _env(tmp), capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture(scope="module")
def twin(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("acceptance")
    out = tmp / "acceptance.json"
    return _script(tmp, "--json", str(out)), out


def test_every_section_holds_and_the_json_is_written(twin):
    proc, out = twin
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    assert result == json.loads(out.read_text())  # the file holds the same, section by section
    assert result["ok"] is True and result["failed"] == result["not_started"] == result["skipped"] == []
    assert result["order"] == ["setup", "es_resume_embedded", "grpo", "grpo_plan", "eval", "es_stage_release",
                               "sampler_vs_generate"]  # the moving-weights resume check right after setup
    assert all(result[name]["status"] == "done" for name in result["order"])
    assert "GRPO, 16 responses in 2 updates" in proc.stderr and "plan terms" in proc.stderr


def test_the_preflight_is_in_the_head_before_any_section(twin):
    result = json.loads(twin[1].read_text())
    pre = result["preflight"]
    for name in ("trl.trainer.grpo_trainer", "datasets", "math_verify", "pyarrow", "transformers", "torch"):
        assert pre["imports"][name].get("version") or pre["imports"][name].get("from"), name
    assert "peft" in pre["imports"]  # a version where it is installed, the import error where not
    assert pre["requirements"]["datasets"]["pyarrow"]["wants"] and pre["disk"]["work"]["free_bytes"] > 0
    assert pre["requirements"]["unmet"] == []  # the development environment meets every declared range
    assert pre["gpu"]["device"] == "cpu" and pre["nvidia_smi"] is None
    first, setup = result["children"][0], result["children"][1]
    assert first["label"] == "preflight" and first["ended_s"] <= setup["started_s"]
    assert result["versions"]["trl.trainer.grpo_trainer"] == pre["imports"]["trl.trainer.grpo_trainer"]["version"]


def test_es_resume_from_step_2_ends_on_the_uninterrupted_checkpoint(twin):
    es = json.loads(twin[1].read_text())["es_resume_embedded"]
    assert es["ok"] and es["resume_equals_uninterrupted"] and es["masters_in_checkpoint"]
    assert es["sha256_resumed"] == es["sha256_uninterrupted"] and len(es["sha256_uninterrupted"]) == 2
    # not vacuous: the embedded weights score, so update 3 (the one redone) moved the checkpoint
    assert es["update_3_moved_weights_or_masters"] and not es["rewards_all_equal_per_update"][-1]
    assert len(es["reward_mean_per_update"]) == 3 and all(n > 0 for n in es["update_norm"])


def test_grpo_two_updates_with_kl_timed_beside_the_plan(twin):
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
    # the planner's own terms for this config (2 updates of prompts x generations responses), on the
    # GPU the preflight found (none here: the H100 row)
    assert plan["ok"] and plan["stage"] == "train/grpo" and plan["responses"] == 2 * seqs
    assert plan["plan_gpu"] == "h100" and {"start", "decode", "train", "checkpoint"} <= set(plan["terms_s"])
    assert set(plan["measured_s"]) == {"rollout", "train", "rest_of_command"}


def test_eval_reports_pass_at_k(twin):
    ev = json.loads(twin[1].read_text())["eval"]
    assert ev["ok"] and ev["problems"] == ev["limit"] and ev["responses"] == ev["limit"] * ev["samples"]
    k = ev["samples"]
    assert 0 < ev["pass@1"] <= ev[f"pass@{k}"] <= 1  # the embedded default solves some demo-add problems


def test_an_es_stage_of_experiment_run_leaves_its_runner_holding_nothing(twin):
    rel = json.loads(twin[1].read_text())["es_stage_release"]
    assert rel["ok"] and rel["updates"] == 1 and rel["es_process"] == "child"
    assert rel["es_child_pid"] != rel["runner_pid"]
    assert rel["cuda_initialized_in_runner"] is False and rel["models_alive_in_runner"] == 0


def test_sampler_token_ids_equal_generate_on_padded_prompts(twin):
    gen = json.loads(twin[1].read_text())["sampler_vs_generate"]
    assert gen["ok"] and gen["parity"]["agreement_required"] == 1.0
    runs = gen["parity"]["runs"]
    # both decode loops (the GPU's "cuda" loop too), EOS stopping both and ignored by both
    assert {(r["decode_loop"]["loop"], r["eos"]) for r in runs} == {
        (loop, eos) for loop in ("cpu", "cuda") for eos in ("stops both", "ignored by both")}
    for r in runs:
        assert len(r["prompt_tokens"]) > 1  # prompts of several lengths: generate pads them
        assert r["token_agreement"] == 1.0 and r["tokens"][0] == r["tokens"][1]  # exact on the CPU
    assert all(r["rows_ending_at_eos"] > 0 for r in runs if r["eos"] == "stops both")  # EOS really stopped rows
    for row in gen["speed"]["shapes"]:
        assert row["tokens_generated"] == [row["B"] * row["L"]] * 2 and row["token_agreement"] == 1.0
        assert len(row["repeats"]) == 2 and all(r["sampler_tok_s"] > 0 and r["generate_tok_s"] > 0
                                                for r in row["repeats"])
        assert row["decode_loop"]["loop"] == "cpu"  # the label names the loop that ran


def test_a_shortened_budget_ends_in_time_and_every_section_finished_or_was_not_started(tmp_path):
    """A budget of 120 s and a GRPO run that can never finish (100,000 updates): the GRPO child is
    stopped at the deadline (or, on a machine too slow to reach it, GRPO is not started), the section
    after it is not started, and nothing runs past the budget. The margins are for killing processes
    and writing the JSON, not for the speed of the machine."""
    budget, grace = 120.0, 5.0
    out = tmp_path / "r.json"
    t0 = time.monotonic()
    proc = _script(tmp_path, "--json", str(out), "--budget-s", str(budget), "--sections", "grpo,eval",
                   "--grpo-set", "train.max_steps=100000", timeout=600)
    wall = time.monotonic() - t0
    assert proc.returncode == 1
    result = json.loads(out.read_text())
    assert result["preflight"]["imports"]["trl.trainer.grpo_trainer"] and result["budget_s"] == budget
    assert result["order"] == ["setup", "grpo", "eval"]
    for name in result["order"]:
        sec = result[name]
        assert sec["status"] in ("done", "not started", "stopped at the deadline"), (name, sec)
        if sec["status"] == "not started":  # with its estimate, which did not fit the time left
            assert sec["estimate_s"] == result["estimates_s"][name] > sec["left_s"]
    assert result["grpo"]["status"] in ("stopped at the deadline", "not started")  # it cannot finish
    if result["grpo"]["status"] == "stopped at the deadline":
        assert result["eval"]["status"] == "not started" and result["failed"] == ["grpo"]
    for child in result["children"]:  # each got the time left when it started; none ran past the deadline
        assert child["timeout_s"] is not None and child["started_s"] + child["timeout_s"] <= budget + 0.01
        assert child["ended_s"] <= budget + grace, child
    assert result["total_s"] <= budget + grace and wall <= budget + 60


def test_a_failed_section_exits_1_and_keeps_the_json(tmp_path):
    # micro-batch 3 does not divide one optimizer step's 1 x 4 sequences: the CLI refuses the GRPO run
    # (and the plan its config); the sections are recorded, the process names them and exits 1
    proc = _script(tmp_path, "--sections", "grpo,grpo_plan", "--grpo-set", "grpo.micro_batch_size=3",
                   env=_env(tmp_path, OUT=str(tmp_path)), timeout=600)
    assert proc.returncode == 1
    assert "gpu-acceptance: section grpo failed" in proc.stderr and "grpo.micro_batch_size" in proc.stderr
    saved = json.loads((tmp_path / "gpu_acceptance.json").read_text())  # $OUT/gpu_acceptance.json
    assert saved["ok"] is False and saved["failed"] == ["grpo", "grpo_plan"]
    assert "exit 2" in saved["grpo"]["error"] and saved["setup"]["ok"]


def test_a_spent_budget_starts_nothing_and_says_so(tmp_path):
    out = tmp_path / "r.json"
    proc = _script(tmp_path, "--budget-s", "0", "--json", str(out), timeout=300)
    assert proc.returncode == 1 and "section setup not started" in proc.stderr
    saved = json.loads(out.read_text())
    assert saved["not_started"] == ["setup"] and saved["setup"]["estimate_s"] > saved["setup"]["left_s"]
    assert "budget of 0 s is spent" in saved["preflight"]["error"]
    assert all(saved[name]["status"] == "skipped" and "setup" in saved[name]["reason"]
               for name in saved["order"][1:])
