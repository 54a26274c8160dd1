"""Section ``es_stage_release`` of the GPU acceptance (benchmarks/gpu_acceptance.py): does GPU 0 hold
anything of an ES stage once ``experiment run`` has finished it?

This process stands in for the runner of ``esreason experiment run``: it trains one ES stage exactly
as the runner does (``esreason.experiments.sequence.train_method("es", ...)``: on a GPU a child
process, esreason.experiments.es_stage), then reports what it holds as the next stage would start:
whether CUDA was ever initialised here, the bytes torch's allocator reserves here, the transformers
models alive here, and the GPU's compute processes as nvidia-smi lists them (this process must not be
among them). The CPU twin asks for the child with ``ESREASON_ES_PROCESS=child`` (the GPU's default).

Usage: python benchmarks/gpu_acceptance_release.py MODEL_DIR DEVICE WORK_DIR OUT.json
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_acceptance_runs as runs  # noqa: E402


def gpu_processes() -> list[dict[str, Any]] | str:
    """The GPU's compute processes (pid, MiB) as nvidia-smi lists them, or why not."""
    try:
        lines = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                               capture_output=True, text=True, timeout=30, check=True).stdout.strip().splitlines()
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{type(exc).__name__}: {exc}"
    out = []
    for line in lines:
        pid, mib = (x.strip() for x in line.split(","))
        out.append({"pid": int(pid), "used_mib": float(mib)})
    return out


def live_models() -> int:
    from transformers import PreTrainedModel

    gc.collect()
    with warnings.catch_warnings():  # isinstance() on every live object touches deprecated module aliases
        warnings.simplefilter("ignore")
        return sum(1 for o in gc.get_objects() if isinstance(o, PreTrainedModel))


def release(model_dir: str, device: str, work: Path) -> dict[str, Any]:
    import torch

    from esreason.config import load_config
    from esreason.experiments.es_stage import LAUNCH_FILE, es_process
    from esreason.experiments.launch import LAUNCH_DIR
    from esreason.experiments.sequence import train_method

    shapes = {"population": 4, "prompts": 4, "tokens": 64}
    cfg = load_config(runs.ES_CONFIG, runs.es_overrides(model_dir, device, shapes, 1))
    run = work / "release-run"
    steps, final = train_method("es", cfg, run, False)
    launch_file = run / LAUNCH_DIR / LAUNCH_FILE
    launch = json.loads(launch_file.read_text()) if launch_file.is_file() else {}
    initialised = torch.cuda.is_initialized()
    procs = gpu_processes() if device.startswith("cuda") else None
    on_gpu = isinstance(procs, list) and any(p["pid"] == os.getpid() for p in procs)
    out = {"runner_pid": os.getpid(), "es_process": es_process(cfg), "es_child_pid": launch.get("pid"),
           "updates": steps, "final_checkpoint": str(final),
           "cuda_initialized_in_runner": initialised,
           "memory_reserved_in_runner_bytes": torch.cuda.memory_reserved() if initialised else 0,
           "models_alive_in_runner": live_models(), "gpu_compute_processes": procs, "runner_on_gpu": on_gpu}
    out["ok"] = (steps == 1 and out["es_process"] == "child" and out["es_child_pid"] not in (None, os.getpid())
                 and not initialised and out["models_alive_in_runner"] == 0 and not on_gpu)
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 4:
        raise SystemExit("usage: gpu_acceptance_release.py MODEL_DIR DEVICE WORK_DIR OUT.json")
    Path(argv[3]).write_text(json.dumps(release(argv[0], argv[1], Path(argv[2])), indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
