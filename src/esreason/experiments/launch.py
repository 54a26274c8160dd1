"""How a GRPO stage of ``esreason experiment run`` / ``train sequence`` uses the node's GPUs.

Every GPU of the node works: a GRPO stage on a multi-GPU node runs as P = #GPUs
processes started by ``accelerate launch`` as a **subprocess** (one process per GPU; never a
multi-GPU job inside one Python process), each with its own vLLM engine for the rollouts when
``grpo.use_vllm`` (TRL's colocate mode; :func:`esreason.grpo.trainer.vllm_args`). With one GPU, or
on the CPU, the stage runs in-process as before.

- P: ``ESREASON_GPUS`` if set (an integer >= 1; also how the CPU twin test asks for 2 gloo
  processes), else the number of visible CUDA devices for ``device: cuda``, else 1.
- Sharding (:func:`esreason.experiments.memplan.pick_sharding`): data parallel (DDP, a full replica
  per GPU) when its traced memory (activations included) leaves 10 % of the GPU free;
  FSDP2 full sharding otherwise (the paper's 3B and 7B models on 80 GB GPUs). A model without an
  architecture file shards. :func:`choose_sharding` (training state + vLLM's share + a fixed
  activation reserve) remains for models the tracer cannot build.
- Fit: before starting, the traced memory of one training process under the chosen sharding
  (:func:`check_grpo_fits`, the plan's verdict) must fit the GPU torch sees (the H100's figure on a
  machine without one); a stage that does not fit one node -- GRPO at 32B (and 14B) with the paper's
  settings -- is refused with its numbers instead of failing hours in with an out-of-memory error.
  ``ESREASON_FORCE_FIT=1`` (what ``experiment run --force`` sets) starts it anyway.
- The subprocess gets the stage's resolved config as a YAML file and a generated accelerate config
  (both under ``RUN/launch/``, with the command line in ``launch.json``), so the run does not
  depend on files outside the run directory; ``--resume`` is passed when the run has metrics.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, Literal, Mapping

from esreason.errors import UserError

GPUS_ENV = "ESREASON_GPUS"
FORCE_ENV = "ESREASON_FORCE_FIT"
LAUNCH_DIR = "launch"
LAUNCHER_VARS = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                 "ACCELERATE_USE_FSDP", "ACCELERATE_USE_DEEPSPEED")
#: Fraction of a GPU's memory kept for activations, the CUDA context and allocator slack when
#: deciding whether a full replica fits (an assumption; the plan states it).
ACTIVATION_RESERVE = 0.15
Sharding = Literal["ddp", "fsdp"]


def stage_processes(device: str, env: Mapping[str, str] | None = None) -> int:
    """P for a GRPO stage: ``ESREASON_GPUS``, else the visible CUDA devices (device cuda), else 1."""
    env = os.environ if env is None else env
    raw = env.get(GPUS_ENV)
    if raw is not None and raw.strip():
        try:
            n = int(raw)
        except ValueError:
            raise UserError(f"{GPUS_ENV}={raw!r}: expected an integer >= 1") from None
        if n < 1:
            raise UserError(f"{GPUS_ENV}={raw!r}: expected an integer >= 1")
        return n
    if device.startswith("cuda"):
        import torch

        return max(1, torch.cuda.device_count())
    return 1


def training_state_bytes(params: int, dtype: str, beta: float, reference_dtype: str | None = None) -> float:
    """Bytes of the GRPO training state per full replica: weights, gradients, AdamW moments (fp32)
    and, with a KL term (beta > 0), the reference model in ``reference_dtype`` (None: ``dtype``, TRL's)."""
    width = 4 if dtype == "float32" else 2
    ref = width if reference_dtype is None else (4 if reference_dtype == "float32" else 2)
    return params * (width + width + 8 + (ref if beta > 0 else 0))


def choose_sharding(params: int, dtype: str, beta: float, gpu_memory_bytes: float, vllm_fraction: float) -> Sharding:
    """DDP when state + vLLM's share + the activation reserve fit one GPU, else FSDP."""
    need = training_state_bytes(params, dtype, beta) + (vllm_fraction + ACTIVATION_RESERVE) * gpu_memory_bytes
    return "ddp" if need <= gpu_memory_bytes else "fsdp"


def accelerate_config(sharding: Sharding, processes: int) -> dict[str, Any]:
    """The accelerate config of a one-node launch (what configs/accelerate/*.yaml hold, generated).

    Precision comes from the run config (grpo.bf16), so accelerate's mixed precision stays 'no'.
    """
    cfg: dict[str, Any] = {
        "compute_environment": "LOCAL_MACHINE", "distributed_type": "MULTI_GPU", "num_machines": 1,
        "machine_rank": 0, "num_processes": processes, "gpu_ids": "all", "rdzv_backend": "static",
        "same_network": True, "main_training_function": "main", "mixed_precision": "no", "downcast_bf16": "no",
        "use_cpu": False, "enable_cpu_affinity": False, "dynamo_config": {}, "tpu_env": [],
        "tpu_use_cluster": False, "tpu_use_sudo": False,
    }
    if sharding == "fsdp":
        cfg["distributed_type"] = "FSDP"
        cfg["fsdp_config"] = {
            "fsdp_version": 2, "fsdp_reshard_after_forward": True,
            "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP", "fsdp_state_dict_type": "FULL_STATE_DICT",
            # only local rank 0 reads the weights on the host; the others get them by broadcast, so host RAM holds one copy per node, not one per GPU
            "fsdp_cpu_ram_efficient_loading": True, "fsdp_offload_params": False,
            "fsdp_activation_checkpointing": False,
        }
    return cfg


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch_command(config_file: Path, accel_file: Path, out: Path, processes: int, port: int,
                   resume: bool, progress: bool = False) -> list[str]:
    """``python -m accelerate.commands.launch ... -m esreason.cli train grpo ...`` for one stage."""
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(accel_file),
           "--num_processes", str(processes), "--main_process_port", str(port),
           "-m", "esreason.cli", "train", "grpo", "--config", str(config_file), "--output", str(out)]
    return cmd + ([] if progress else ["--no-progress"]) + (["--resume"] if resume else [])


def launch_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The subprocess's environment: ours without a surrounding launcher's variables."""
    base = dict(os.environ if env is None else env)
    for key in LAUNCHER_VARS:
        base.pop(key, None)
    return base


def _sharding_for(cfg: Any) -> Sharding:
    """DDP or FSDP for ``cfg`` on this machine's GPUs (DDP on the CPU: accelerate shards GPUs only)."""
    if not cfg.device.startswith("cuda"):
        return "ddp"
    import torch

    from esreason.experiments import memplan

    try:
        memplan.architecture(cfg.model)
    except UserError:
        return "fsdp"  # unknown architecture: sharding always fits where a replica does
    local = memplan.local_gpu()  # torch's total_memory: the plan's H100 row holds the same figure
    total = local[1] if local is not None else memplan.GPU_MEMORY_GIB["h100"][1]
    # the traced memory plan (activations included), as `esreason experiment plan` reports it
    return memplan.pick_sharding(cfg, max(torch.cuda.device_count(), 1), total)


def check_grpo_fits(cfg: Any, processes: int, sharding: Sharding, gpu: tuple[str, float]) -> None:
    """UserError with the numbers when one GRPO training process of ``cfg`` on ``processes`` GPUs
    ``gpu`` = (name, GiB) does not fit under ``sharding`` (:func:`memplan.grpo_roles`, traced)."""
    from esreason.experiments import memplan

    name, gib = gpu
    v = memplan.grpo_verdict(cfg, processes, sharding, gib)
    if not v["fits"]:
        raise UserError(f"GRPO for {cfg.model} does not fit {processes} x {name} under {sharding.upper()}: one "
                        f"{v['role']} needs {v['total_gib']:.1f} GiB of {gib:.1f} (largest term {v['term']} "
                        f"{v['term_gib']:.1f} GiB); would change it: {memplan.advice_text(v['advice'])}; "
                        f"`esreason experiment plan` shows every term, {FORCE_ENV}=1 starts it anyway")


def _fit_gpu() -> tuple[str, float]:
    """The GPU the fit is decided for: the one torch sees, else the H100 (the plan's default)."""
    from esreason.experiments import memplan

    return memplan.local_gpu() or memplan.GPU_MEMORY_GIB["h100"]


def launch_grpo(cfg: Any, out: Path, *, resume: bool, processes: int, sharding: Sharding,
                progress: bool = False) -> None:
    """Run ``esreason train grpo`` for ``cfg`` as ``processes`` processes under accelerate (a subprocess)."""
    import yaml

    from esreason.config import to_dict
    from esreason.io.atomic import atomic_write_json, atomic_write_text

    launch = out / LAUNCH_DIR
    launch.mkdir(parents=True, exist_ok=True)
    config_file, accel_file = launch / "grpo.yaml", launch / "accelerate.yaml"
    atomic_write_text(config_file, yaml.safe_dump(to_dict(cfg), sort_keys=False))
    atomic_write_text(accel_file, yaml.safe_dump(accelerate_config(sharding, processes), sort_keys=False))
    cmd = launch_command(config_file, accel_file, out, processes, _free_port(), resume, progress)
    atomic_write_json(launch / "launch.json", {"processes": processes, "sharding": sharding, "command": cmd})
    print(f"GRPO stage {out}: accelerate launch, {processes} processes ({sharding.upper()}), one per GPU", flush=True)
    code = subprocess.run(cmd, env=launch_env()).returncode
    if code != 0:
        raise UserError(f"GRPO stage {out} failed under accelerate launch with {processes} processes "
                        f"(exit code {code}); command in {launch / 'launch.json'}; rerun to resume")


def train_grpo(cfg: Any, out: Path, *, resume: bool, progress: bool) -> tuple[int, Path | None]:
    """Train one GRPO stage: in-process on one GPU/CPU, under accelerate with one process per GPU
    otherwise. Returns (updates done, final checkpoint)."""
    processes = stage_processes(cfg.device)
    sharding = _sharding_for(cfg) if processes > 1 else "ddp"
    if cfg.device.startswith("cuda") and os.environ.get(FORCE_ENV, "") in ("", "0"):
        from esreason.experiments import memplan

        try:
            memplan.architecture(cfg.model)
        except UserError:
            pass  # no architecture to trace: nothing to decide with
        else:
            check_grpo_fits(cfg, processes, sharding, _fit_gpu())
    if processes == 1:
        from esreason.grpo.run import run_grpo

        result = run_grpo(cfg, out, resume=resume, progress=progress)
        return result.steps, result.final_checkpoint
    launch_grpo(cfg, out, resume=resume, processes=processes, sharding=sharding, progress=progress)
    from esreason.io import RunDir

    latest = RunDir(out).latest_checkpoint()  # the run saves a checkpoint after its last update
    return (0, None) if latest is None else (int(latest[0]), Path(latest[1]))


__all__ = ["ACTIVATION_RESERVE", "FORCE_ENV", "GPUS_ENV", "accelerate_config", "check_grpo_fits", "choose_sharding", "launch_command", "launch_env",
           "launch_grpo", "stage_processes", "train_grpo", "training_state_bytes"]
