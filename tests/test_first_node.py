"""What a first rented GPU node would hit when running every shipped experiment, checked without one.

1. Every shipped experiment file resolves and plans with no environment variable set, and ``--set``
   can replace a mapping (``--set 'checkpoints={}'``).
2. The plan and the launcher decide DDP or FSDP from one capacity: on an H100, what torch reports
   (``total_memory``, 79.11 GiB: ``memplan.H100_TORCH_GIB`` and its source), not nvidia-smi's 79.65.
3. The TRL arguments carry ``model_init_kwargs={"device_map": None}`` (TRL builds the KL reference
   with ``device_map="auto"`` under FSDP) and a bounded ``vllm_max_model_length``.
4. ``experiment run`` refuses before the first stage when the planned checkpoints or the engines'
   start state do not fit the free disk, naming the path and the bytes.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from esreason.cli import main
from esreason.config import load_config, merge, parse_overrides
from esreason.errors import UserError
from esreason.experiments import memplan
from esreason.experiments.spec import load_spec

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENTS = ROOT / "configs" / "experiments"
SHIPPED = sorted(EXPERIMENTS.glob("*.yaml"))
GPU_FILES = [p for p in SHIPPED if not p.name.startswith("demo")]  # demo*.yaml: CPU demos (no GPU plan)
ENV = "ESREASON_HARD_GRPO_CHECKPOINT"


@pytest.fixture(autouse=True)
def _no_release(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)


# --------------------------------------------------------------------------- 1: files and --set


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_every_shipped_experiment_resolves_with_no_environment_variable(path):
    spec = load_spec(path)
    assert spec.methods and spec.eval.tasks
    for m in spec.methods:  # a checkpoint row names a model; nothing is left as ${...}
        assert m.checkpoint is None or "${" not in m.checkpoint


def test_hard_plans_with_no_environment_variable_and_trains_its_grpo_row():
    from esreason.experiments.plan import build_plan

    hard = load_spec(EXPERIMENTS / "hard.yaml")
    grpo = hard.method("grpo")
    assert (grpo.kind, grpo.label, grpo.checkpoint) == ("grpo", "GRPO", None)
    plan = build_plan(hard, 8)
    names = [s["name"] for s in plan["stages"]]
    assert "train/grpo" in names and "eval/grpo" in names  # trained, then evaluated


def test_hard_points_at_the_release_by_variable_or_by_set(monkeypatch):
    path = EXPERIMENTS / "hard.yaml"
    by_set = load_spec(path, ["checkpoints.grpo.path=someorg/soft-grpo"]).method("grpo")
    assert (by_set.kind, by_set.checkpoint, by_set.label) == ("checkpoint", "someorg/soft-grpo",
                                                             "GRPO (SofT-GRPO release)")
    monkeypatch.setenv(ENV, "someorg/soft-grpo")
    assert load_spec(path).method("grpo").checkpoint == "someorg/soft-grpo"
    # the file's own advice for training GRPO yourself works whatever the variable holds
    assert load_spec(path, ["checkpoints={}"]).method("grpo").kind == "grpo"


def test_set_with_a_mapping_replaces_the_section_and_a_dotted_key_merges():
    base = {"checkpoints": {"grpo": {"path": "x", "label": "y"}}, "es": {"sigma": 1.0, "population_size": 4}}
    out = merge(base, parse_overrides(["checkpoints={}", "es.sigma=2.0"]))
    assert out == {"checkpoints": {}, "es": {"sigma": 2.0, "population_size": 4}}
    out = merge(base, parse_overrides(["es={sigma: 3.0}"]))
    assert out["es"] == {"sigma": 3.0} and type(out["es"]) is dict  # a plain dict (YAML-dumpable)
    import yaml

    assert yaml.safe_load(yaml.safe_dump(out)) == out
    # through a run config: the replaced section takes its defaults for every key it does not name
    file_cfg = load_config(ROOT / "configs" / "demo" / "es.yaml")
    replaced = load_config(ROOT / "configs" / "demo" / "es.yaml", ["es={sigma: 0.002}"])
    default = load_config(None)
    assert replaced.es.sigma == 0.002
    assert replaced.es.population_size == default.es.population_size != file_cfg.es.population_size


def test_checkpoint_variable_forms():
    from esreason.config import ConfigError
    from esreason.experiments.spec import expand_env

    os.environ.pop("ESREASON_TEST_CKPT", None)
    assert expand_env("${ESREASON_TEST_CKPT:-}", "k") is None
    assert expand_env("${ESREASON_TEST_CKPT:-org/default}", "k") == "org/default"
    with pytest.raises(ConfigError, match="config key 'k': environment variable ESREASON_TEST_CKPT is not set"):
        expand_env("${ESREASON_TEST_CKPT}", "k")


# --------------------------------------------------------------------------- 2: one capacity


def _torch_reports(monkeypatch, gib: float, count: int = 8) -> None:
    import torch

    props = SimpleNamespace(name="NVIDIA H100 80GB HBM3", total_memory=int(gib * memplan.GIB))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda _i=0: props)


def test_the_plans_h100_is_what_torch_reports():
    # 79.11 GiB: torch's "GPU 0 has a total capacity of 79.11 GiB" on an H100 80GB HBM3 (vllm-project/vllm
    # #27508); nvidia-smi's 81,559 MiB (gpu-results/2026-11-28-h100/smi.txt) is 79.65 GiB.
    assert memplan.H100_TORCH_GIB == pytest.approx(79.11, abs=1e-9)
    assert memplan.GPU_MEMORY_GIB["h100"][1] == memplan.H100_TORCH_GIB < 81559 / 1024


@pytest.mark.parametrize("path", GPU_FILES, ids=lambda p: p.name)
def test_plan_and_launcher_pick_the_same_sharding_on_an_h100(path, monkeypatch):
    """The plan prices a GRPO stage at the table's H100; the launcher asks torch. torch prints 79.11
    (two decimals), so the launcher is checked at both ends of [79.105, 79.115) GiB as well."""
    from esreason.experiments import launch

    spec = load_spec(path)
    planned = memplan.pick_sharding(spec.grpo, 8, memplan.GPU_MEMORY_GIB["h100"][1])  # plan.py's call
    for gib in (79.105, memplan.H100_TORCH_GIB, 79.1149):
        _torch_reports(monkeypatch, gib)
        assert memplan.local_gpu() == ("NVIDIA H100 80GB HBM3", pytest.approx(gib, abs=1e-6))
        assert launch._sharding_for(spec.grpo) == planned, (path.name, gib)


# --------------------------------------------------------------------------- 3: TRL arguments


def test_trl_arguments_put_the_reference_on_the_host_and_bound_vllms_context(tmp_path):
    from esreason.grpo.config import load_grpo_config
    from esreason.grpo.plan import plan_batches
    from esreason.grpo.trainer import build_trl_args

    cfg = load_grpo_config(ROOT / "configs" / "easy" / "grpo-llama-3.2-3b.yaml")
    kwargs = build_trl_args(cfg, plan_batches(cfg, 7473, 8), tmp_path, prompt_tokens=412)
    assert kwargs["model_init_kwargs"] == {"device_map": None}
    assert kwargs["vllm_max_model_length"] == 412 + cfg.generation.max_new_tokens < 131072


def test_a_runs_vllm_context_is_its_longest_prompt_plus_the_response_limit(tmp_path):
    from esreason import tasks
    from esreason.backends.hf import load_model
    from esreason.grpo.config import load_grpo_config
    from esreason.grpo.plan import plan_batches
    from esreason.grpo.trainer import trl_args_for_run
    from esreason.tasks.base import render_prompt

    cfg = load_grpo_config(None, ["grpo.use_vllm=true", "generation.max_new_tokens=24"])
    problems = tasks.get(cfg.task).load("train", None, 300)
    _, tokenizer = load_model(cfg.model)
    longest = max(len(tokenizer(render_prompt(tokenizer, p.messages), add_special_tokens=False)["input_ids"])
                  for p in problems)  # each prompt on its own, as our sampler renders it
    kwargs = trl_args_for_run(cfg, plan_batches(cfg, len(problems)), tmp_path, problems)
    assert kwargs["vllm_max_model_length"] == longest + 24
    assert kwargs["model_init_kwargs"] == {"device_map": None}
    no_vllm = dataclasses.replace(cfg, grpo=dataclasses.replace(cfg.grpo, use_vllm=False))
    assert trl_args_for_run(no_vllm, plan_batches(no_vllm, len(problems)), tmp_path, problems)[
        "vllm_max_model_length"] is None  # nothing measured without vLLM


# --------------------------------------------------------------------------- 6: disk before the first stage


def test_run_refuses_before_the_first_stage_when_checkpoints_do_not_fit(tmp_path, monkeypatch, capsys):
    from esreason.experiments import diskcheck, runner

    started: list[str] = []
    monkeypatch.setattr(runner, "run_experiment",
                        lambda spec, out, **k: started.append("run") or SimpleNamespace(output=out))
    planned = diskcheck.planned_disk_bytes(load_spec(EXPERIMENTS / "demo.yaml"))
    need = planned["checkpoints"] + planned["eval_outputs"]  # both under --output
    assert planned["checkpoints"] > 0 and planned["eval_outputs"] > 0
    assert planned["hub_downloads"] == planned["datasets_arrow"] == 0  # the embedded model, synthetic tasks
    monkeypatch.setattr(diskcheck.shutil, "disk_usage", lambda p: SimpleNamespace(free=need - 1))
    out = tmp_path / "exp"
    assert main(["experiment", "run", str(EXPERIMENTS / "demo.yaml"), "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert str(out) in err and f"{need:,} bytes" in err and f"{need - 1:,} bytes" in err and "--force" in err
    assert started == [] and not out.exists()
    monkeypatch.setattr(diskcheck.shutil, "disk_usage", lambda p: SimpleNamespace(free=need))
    assert main(["experiment", "run", str(EXPERIMENTS / "demo.yaml"), "--output", str(out)]) == 0
    assert started == ["run"]


def test_the_7b_experiment_needs_its_checkpoints_and_twice_the_start_state(tmp_path, monkeypatch):
    from esreason.experiments import diskcheck, memplan_host

    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_DATASETS_CACHE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # an empty cache on the same file system
    spec = load_spec(EXPERIMENTS / "easy-qwen2.5-7b.yaml")
    need = diskcheck.planned_disk_bytes(spec)
    start = memplan_host.es_host(spec.es, 8, 80.0, 0.0, spec.updates)["disk_gib"]["start_state"]
    assert need["engine_state"] == int(2 * start * diskcheck.GIB)
    assert need["checkpoints"] > 1e12  # seven copies of weights and AdamW state per trained run
    out, engines = tmp_path / "exp", tmp_path / "engines"
    engines.mkdir()
    total = sum(need.values())  # one file system: every place counts together
    with pytest.raises(UserError) as exc:
        diskcheck.check_disk(spec, out, engines, free=lambda p: total - 1)
    msg = str(exc.value)
    assert f"under {out}: {need['checkpoints'] + need['eval_outputs']:,} bytes" in msg
    assert f"under {engines}: {need['engine_state']:,} bytes" in msg
    assert f"under {tmp_path / 'hf' / 'hub'}: {need['hub_downloads']:,} bytes" in msg
    diskcheck.check_disk(spec, out, engines, free=lambda p: total)
    # a resumed experiment: what is already in the output directory counts as written
    out.mkdir()
    (out / "written.bin").write_bytes(b"\0" * 4096)
    diskcheck.check_disk(spec, out, engines, free=lambda p: total - 4096)
