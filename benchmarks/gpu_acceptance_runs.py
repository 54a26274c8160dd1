"""The command-line sections of the GPU acceptance (benchmarks/gpu_acceptance.py): each runs the
real ``esreason`` command line in a child process (``python -m esreason.cli``; the GRPO run through
benchmarks/gpu_acceptance_phases.py, which is ``esreason.cli.main`` with its two phases timed) on a
model directory the driver saved, and reads back what the run wrote.

- :func:`es_resume`: ``esreason train es`` from configs/easy/es-qwen2.5-1.5b.yaml on the HF
  backend, 3 updates (checkpoints at update 2 and at the end); the final checkpoint's sha256
  manifest is kept, ``step_3`` is deleted and ``--resume-from step_2`` redoes update 3: the
  weights and the fp32 masters must hash the same as the uninterrupted run's.
- :func:`grpo`: ``esreason train grpo`` from configs/easy/grpo-qwen2.5-1.5b.yaml without vLLM (HF
  rollouts), keeping the Easy run's micro-batch 2, activation checkpointing, bf16 autocast (GPU
  only) and the KL term (beta 0.001, the reference model loaded); 2 updates of B prompts x G
  responses, shorter responses (stated in the result).
- :func:`evaluate`: ``esreason eval`` with Pass@K on the first problems of demo-add.

Every child runs under the driver's budget (benchmarks/gpu_acceptance_clock.py: the time left when it
starts is its timeout); a failure records the command and the last lines of its stderr.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_acceptance_clock import Children  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
ES_CONFIG = ROOT / "configs" / "easy" / "es-qwen2.5-1.5b.yaml"
GRPO_CONFIG = ROOT / "configs" / "easy" / "grpo-qwen2.5-1.5b.yaml"
PHASES = Path(__file__).resolve().parent / "gpu_acceptance_phases.py"
TASK = "demo-add"


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "esreason.cli", *args]


def sets(overrides: list[str]) -> list[str]:
    return [a for o in overrides for a in ("--set", o)]


def metrics(run: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]


def es_overrides(model_dir: str, device: str, shapes: dict[str, int], steps: int) -> list[str]:
    """The acceptance's ES run: the Easy ES config on the one-GPU HF backend at small N, B, L.

    sigma 3e-3 / alpha 2e-3 and temperature 0.7 (tests/test_faults_es.py's run) instead of the
    Easy 1.5e-3 / 2.5e-4 / greedy: with N = 4 and B = 4 the members then differ in reward and the
    bf16 weights move within 3 updates (the cost of a step does not depend on them)."""
    return [f"model={model_dir}", f"task={TASK}", f"device={device}", "backend.type=hf", "backend.engines=1",
            "backend.update=replicated", f"train.limit={4 * shapes['prompts']}",
            f"train.batch_size={shapes['prompts']}", f"train.max_steps={steps}",
            f"es.population_size={shapes['population']}", "es.sigma=0.003", "es.alpha=0.002",
            f"generation.max_new_tokens={shapes['tokens']}", "generation.temperature=0.7",
            "checkpoint.every=2", "eval.every=0"]


def manifest(ckpt: Path) -> dict[str, str]:
    """sha256 of every file of a checkpoint, from its ``COMPLETE`` manifest (esreason.io.verify; the
    run wrote it, so nothing is read twice): ``{relative path: sha256}``."""
    data = json.loads((ckpt / "COMPLETE").read_text())
    return {rel: entry["sha256"] for rel, entry in data["files"].items()}


def tensors(files: dict[str, str]) -> dict[str, str]:
    """The safetensors files (weights, fp32 masters) of a manifest."""
    return {rel: sha for rel, sha in files.items() if rel.endswith(".safetensors")}


def es_resume(model_dir: str, work: Path, device: str, shapes: dict[str, int], kids: Children) -> dict[str, Any]:
    """3 updates, then ``--resume-from step_2`` with step_3 removed: the same final checkpoint.

    Equal: the sha256 of every safetensors file (weights and fp32 masters) of ``step_3``, resumed
    against uninterrupted. Non-vacuous: update 3 changed the weights or the masters (``step_2`` vs
    ``step_3``) unless its member rewards were all equal (then ES skips every direction)."""
    run = work / "es-run"
    shutil.rmtree(run, ignore_errors=True)
    argv = cli("train", "es", "--config", str(ES_CONFIG), *sets(es_overrides(model_dir, device, shapes, 3)),
               "--output", str(run), "--no-progress")
    full_s = kids.run(argv, "train es (3 updates)")
    final = run / "checkpoints" / "step_3"
    step2, uninterrupted = manifest(run / "checkpoints" / "step_2"), manifest(final)
    rows = metrics(run)
    shutil.rmtree(final)
    resume_s = kids.run([*argv, "--resume-from", "step_2"], "train es --resume-from step_2")
    resumed = manifest(final)
    shutil.rmtree(run, ignore_errors=True)  # 9 GB per checkpoint at 1.5B: the machine has 64 GiB of disk
    same = bool(tensors(uninterrupted)) and tensors(resumed) == tensors(uninterrupted)
    moved = tensors(uninterrupted) != tensors(step2)
    equal_rewards = [r.get("reward/std") == 0.0 for r in rows]
    return {"config": str(ES_CONFIG.relative_to(ROOT)), "updates": 3, "resumed_from": "step_2", **shapes,
            "checkpoints": ["step_2", "step_3"], "sha256_uninterrupted": tensors(uninterrupted),
            "sha256_resumed": tensors(resumed), "resume_equals_uninterrupted": same,
            "all_files_equal": resumed == uninterrupted,
            "masters_in_checkpoint": any("master" in rel for rel in tensors(uninterrupted)),
            "update_3_moved_weights_or_masters": moved, "reward_mean_per_update": [r.get("reward/mean") for r in rows],
            "rewards_all_equal_per_update": equal_rewards, "update_norm": [r.get("update_norm") for r in rows],
            "time_per_update_s": [r.get("time/step") for r in rows],
            "generate_s_per_update": [r.get("time/generate") for r in rows],
            "command_s": {"three_updates": full_s, "resume_one_update": resume_s},
            # a random-weight model scores 0 on every member: all z-scores 0, every direction skipped,
            # so nothing can move and the equality checks the checkpoint and resume path only
            "ok": same and (moved or equal_rewards[-1])}


def grpo_overrides(model_dir: str, device: str, shapes: dict[str, int]) -> list[str]:
    """Easy GRPO with HF rollouts: micro-batch 2, activation checkpointing, bf16 (GPU), beta 0.001."""
    on_gpu = device.startswith("cuda")
    return [f"model={model_dir}", f"task={TASK}", f"device={device}", "grpo.use_vllm=false",
            "grpo.vllm_sleep=false", f"grpo.bf16={'true' if on_gpu else 'false'}",
            "grpo.gradient_checkpointing=true", "grpo.micro_batch_size=2", "grpo.beta=0.001",
            f"grpo.num_generations={shapes['generations']}", "grpo.mini_batch_size=1",
            f"train.batch_size={shapes['prompts']}", f"train.limit={4 * shapes['prompts']}", "train.max_steps=2",
            f"generation.max_new_tokens={shapes['tokens']}", "checkpoint.every=2", "eval.every=0"]


def grpo_mapping(overrides: list[str]) -> dict[str, Any]:
    """The GRPO run config as a mapping (the YAML with the overrides applied): the plan's input."""
    from esreason.config import merge, parse_overrides, read_yaml

    return merge(read_yaml(GRPO_CONFIG), parse_overrides(overrides))


def grpo(model_dir: str, work: Path, device: str, shapes: dict[str, int], kids: Children,
         extra: list[str] = ()) -> dict[str, Any]:
    """2 updates through TRL; rollout and train seconds per update (benchmarks/gpu_acceptance_phases.py)."""
    run, phases = work / "grpo-run", work / "grpo-phases.json"
    shutil.rmtree(run, ignore_errors=True)
    over = grpo_overrides(model_dir, device, shapes) + list(extra)
    argv = [sys.executable, str(PHASES), str(phases), "train", "grpo", "--config", str(GRPO_CONFIG), *sets(over),
            "--output", str(run), "--no-progress"]
    command_s = kids.run(argv, "train grpo (2 updates)")
    rows = metrics(run)
    measured = json.loads(phases.read_text())
    final = run / "checkpoints" / "step_2"
    saved = final.is_dir() and (final / "COMPLETE").is_file()
    shutil.rmtree(run, ignore_errors=True)
    updates = [r for r in rows if "loss" in r or "kl" in r]
    kl = [r.get("kl") for r in updates]
    ok = (len(measured["rollout_s"]) == 2 and len(updates) == 2 and saved
          and all(k is not None for k in kl) and all(n > 0 for n in measured["micro_steps"]))
    seqs = shapes["prompts"] * shapes["generations"]
    return {"config": str(GRPO_CONFIG.relative_to(ROOT)), "overrides": over, "updates": 2, **shapes,
            "sequences_per_update": seqs, "micro_batch": 2, "micro_steps_per_update": measured["micro_steps"],
            "gradient_checkpointing": True, "bf16": device.startswith("cuda"), "beta": 0.001,
            "rollouts": ("HF generate (TRL, no vLLM)" if device.startswith("cuda")
                         else "esreason sampler (TRL rollout_func)"),
            "responses_note": f"max_new_tokens {shapes['tokens']} instead of the Easy run's 2048",
            "phases_s": {"rollout": measured["rollout_s"], "train": measured["train_s"]},
            "time_step_s": [r.get("time/step") for r in updates], "kl": kl,
            "loss": [r.get("loss") for r in updates], "reward_mean": [r.get("reward/mean") for r in updates],
            "final_checkpoint_complete": saved, "command_s": command_s, "ok": ok}


def evaluate(model_dir: str, work: Path, device: str, shapes: dict[str, int], kids: Children) -> dict[str, Any]:
    """``esreason eval`` with Pass@K on the first ``limit`` demo-add test problems."""
    out = work / "eval"
    shutil.rmtree(out, ignore_errors=True)
    k = shapes["samples"]
    argv = cli("eval", "--model", model_dir, "--tasks", TASK, "--output", str(out), "--samples", str(k),
               "--k", f"1,{k}", "--limit", str(shapes["limit"]), "--max-new-tokens", str(shapes["tokens"]),
               "--device", device, "--bootstrap", "100", "--no-progress")
    command_s = kids.run(argv, "eval")
    summary = json.loads((out / "summary.json").read_text())  # esreason.eval.results.SUMMARY_JSON
    rows = [json.loads(line) for line in (out / TASK / "responses.jsonl").read_text().splitlines() if line.strip()]
    shutil.rmtree(out, ignore_errors=True)
    task = summary["tasks"][TASK]
    values = {name: m["value"] for name, m in task["metrics"].items()}
    pass1, passk = values.get("pass@1"), values.get(f"pass@{k}")
    ok = (task["num_problems"] == shapes["limit"] and len(rows) == shapes["limit"] * k
          and isinstance(pass1, float) and isinstance(passk, float) and 0 <= pass1 <= passk <= 1)
    return {"task": TASK, **shapes, "ks": [1, k], "problems": task["num_problems"], "responses": len(rows),
            "pass@1": pass1, f"pass@{k}": passk, "metrics": values, "command_s": command_s, "ok": ok}


HERE = Path(__file__).resolve().parent


def local_section(section: str, args: dict[str, Any], work: Path, kids: Children) -> dict[str, Any]:
    """A Python section of benchmarks/gpu_acceptance_local.py in a child process: its JSON result."""
    args_file, out_file = work / f"{section}.args.json", work / f"{section}.out.json"
    args_file.write_text(json.dumps(args, default=str))
    out_file.unlink(missing_ok=True)
    kids.run([sys.executable, str(HERE / "gpu_acceptance_local.py"), section, str(args_file), str(out_file)], section)
    return json.loads(out_file.read_text())


def es_stage_release(model_dir: str, work: Path, device: str, kids: Children) -> dict[str, Any]:
    """One ES stage trained as ``experiment run`` trains it, by a stand-in for the runner process
    (benchmarks/gpu_acceptance_release.py), and what that process holds afterwards. The CPU twin sets
    ``ESREASON_ES_PROCESS=child``, a GPU's default."""
    import os

    out_file = work / "release.out.json"
    out_file.unlink(missing_ok=True)
    env = dict(os.environ)
    if not device.startswith("cuda"):
        env["ESREASON_ES_PROCESS"] = "child"
    command_s = kids.run([sys.executable, str(HERE / "gpu_acceptance_release.py"), model_dir, device, str(work),
                          str(out_file)], "ES stage as experiment run trains it", env=env)
    out = json.loads(out_file.read_text())
    shutil.rmtree(work / "release-run", ignore_errors=True)
    return {**out, "command_s": command_s}
