"""GRPO stages on all GPUs of the node: the accelerate launch of
esreason.experiments.launch, and TRL's vLLM rollout fields.

The CPU twin: ``ESREASON_GPUS=2`` makes a GRPO stage of ``train sequence`` / ``experiment run``
start ``accelerate launch`` with 2 processes as a subprocess (gloo on the CPU), exactly the path a
GPU node takes with one process per GPU. TRL's vLLM colocate/server code cannot run here (no vLLM
in this environment): its configuration is checked field by field against TRL 1.16's GRPOConfig.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from esreason.errors import UserError
from esreason.experiments import launch
from esreason.grpo.config import load_grpo_config

pytestmark = pytest.mark.heavy  # the fast subset (`--fast`) leaves this file out: tests/conftest.py

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"
GIB = 2 ** 30


def test_processes_come_from_the_environment_or_the_visible_gpus():
    assert launch.stage_processes("cpu", {}) == 1
    assert launch.stage_processes("cpu", {"ESREASON_GPUS": "2"}) == 2
    assert launch.stage_processes("cuda", {"ESREASON_GPUS": "8"}) == 8
    for bad in ("0", "two", "-1"):
        with pytest.raises(UserError, match=f"ESREASON_GPUS='{bad}': expected an integer >= 1"):
            launch.stage_processes("cpu", {"ESREASON_GPUS": bad})


@pytest.mark.parametrize("params,vllm,expected", [
    (1_543_714_304, 0.3, "ddp"),    # Qwen2.5-1.5B: 29 GiB of fp32 state + 24 GiB vLLM fits 80 GiB
    (3_212_749_824, 0.3, "fsdp"),   # Llama-3.2-3B: 60 GiB of state + vLLM does not
    (3_212_749_824, 0.0, "ddp"),    # ... but fits without a colocated engine
    (7_615_616_512, 0.0, "fsdp"),   # Qwen2.5-7B never fits a replica
])
def test_sharding_follows_memory(params, vllm, expected):
    assert launch.choose_sharding(params, "float32", 0.001, 80 * GIB, vllm) == expected


def test_training_state_counts_the_reference_only_with_a_kl_term():
    assert launch.training_state_bytes(10, "float32", 0.001) == 10 * 20
    assert launch.training_state_bytes(10, "float32", 0.0) == 10 * 16
    assert launch.training_state_bytes(10, "bfloat16", 0.001) == 10 * 14
    assert launch.training_state_bytes(10, "float32", 0.001, "bfloat16") == 10 * 18  # grpo.reference_dtype


@pytest.mark.parametrize("sharding", ["ddp", "fsdp"])
def test_generated_accelerate_config_is_what_accelerate_reads(tmp_path, sharding):
    import yaml
    from accelerate.commands.config.config_args import load_config_from_file

    path = tmp_path / "accelerate.yaml"
    path.write_text(yaml.safe_dump(launch.accelerate_config(sharding, 8)))
    cfg = load_config_from_file(str(path))
    assert cfg.num_processes == 8 and cfg.mixed_precision == "no"
    assert cfg.distributed_type.value == ("FSDP" if sharding == "fsdp" else "MULTI_GPU")
    if sharding == "fsdp":  # the shipped configs/accelerate/fsdp-7b.yaml settings
        shipped = yaml.safe_load((CONFIGS / "accelerate" / "fsdp-7b.yaml").read_text())["fsdp_config"]
        assert cfg.fsdp_config == shipped


def test_launch_command_and_environment(tmp_path):
    cmd = launch.launch_command(tmp_path / "g.yaml", tmp_path / "a.yaml", tmp_path / "run", 8, 29500, resume=True)
    assert cmd[1:3] == ["-m", "accelerate.commands.launch"]
    assert cmd[cmd.index("--num_processes") + 1] == "8" and cmd[cmd.index("--config_file") + 1].endswith("a.yaml")
    assert cmd[cmd.index("-m", 3):][:4] == ["-m", "esreason.cli", "train", "grpo"] and cmd[-1] == "--resume"
    env = launch.launch_env({"WORLD_SIZE": "8", "RANK": "3", "ACCELERATE_USE_FSDP": "true", "PATH": "/bin"})
    assert env == {"PATH": "/bin"}


def test_vllm_rollout_fields_are_trl_116_grpoconfig_fields(tmp_path):
    from trl import GRPOConfig

    from esreason.grpo.plan import plan_batches
    from esreason.grpo.trainer import build_trl_args

    fields = {f.name for f in dataclasses.fields(GRPOConfig)}
    cfg = load_grpo_config(CONFIGS / "easy" / "grpo-qwen2.5-7b.yaml")
    kwargs = build_trl_args(cfg, plan_batches(cfg, 7473, 8), tmp_path, prompt_tokens=300)
    assert set(kwargs) <= fields
    vllm = {k: v for k, v in kwargs.items() if k.startswith("vllm_") or k == "use_vllm"}
    assert vllm == {"use_vllm": True, "vllm_mode": "colocate", "vllm_tensor_parallel_size": 1,
                    "vllm_gpu_memory_utilization": 0.3, "vllm_enable_sleep_mode": True,
                    "vllm_server_base_url": None, "vllm_max_model_length": 300 + cfg.generation.max_new_tokens,
                    "vllm_model_impl": "vllm",
                    "vllm_importance_sampling_correction": False}
    server = load_grpo_config(CONFIGS / "easy" / "grpo-qwen2.5-1.5b.yaml",
                              ["grpo.vllm_mode=server", "grpo.vllm_server_url=http://node0:8000"])
    kw = build_trl_args(server, plan_batches(server, 7473), tmp_path)
    assert (kw["vllm_mode"], kw["vllm_server_base_url"]) == ("server", "http://node0:8000")


def test_vllm_settings_are_validated():
    from esreason.config import ConfigError

    with pytest.raises(ConfigError, match="grpo.vllm_gpu_memory_utilization"):
        load_grpo_config(CONFIGS / "easy" / "grpo-qwen2.5-1.5b.yaml", ["grpo.vllm_gpu_memory_utilization=1.5"])
    with pytest.raises(ConfigError, match="grpo.vllm_server_url.*vllm_mode: server"):
        load_grpo_config(CONFIGS / "easy" / "grpo-qwen2.5-1.5b.yaml", ["grpo.vllm_server_url=http://x:1"])


def test_vllm_rollouts_are_allowed_with_several_processes():
    from esreason.grpo.distributed import Processes
    from esreason.grpo.run import _check_processes

    cfg = load_grpo_config(CONFIGS / "easy" / "grpo-qwen2.5-1.5b.yaml")
    assert cfg.grpo.use_vllm
    _check_processes(cfg, Processes(num_processes=8, process_index=3))  # no "one process only" refusal


def test_grpo_stage_runs_as_two_processes_under_accelerate(tmp_path, monkeypatch):
    """The real launch: train_method('grpo') on ESREASON_GPUS=2 starts accelerate with 2 CPU processes."""
    from esreason.experiments.sequence import train_method

    monkeypatch.setenv("ESREASON_GPUS", "2")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cfg = load_grpo_config(CONFIGS / "demo" / "grpo.yaml", [
        "train.max_steps=1", "checkpoint.every=1", "grpo.micro_batch_size=32", "eval.every=0",
        "generation.max_new_tokens=24"])
    out = tmp_path / "grpo"
    steps, final = train_method("grpo", cfg, out, progress=False)
    assert steps == 1 and final == out / "checkpoints" / "step_1" and (final / "model.safetensors").is_file()
    record = json.loads((out / "launch" / "launch.json").read_text())
    assert record["processes"] == 2 and record["sharding"] == "ddp"
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["trainer"]["batch_plan"]["num_processes"] == 2  # the run saw 2 processes
    assert load_grpo_config(out / "launch" / "grpo.yaml") == cfg  # the subprocess ran this config
