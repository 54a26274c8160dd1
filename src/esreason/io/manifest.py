"""manifest.json: what produced a run (config, versions, git SHA, hashes, seeds)."""

from __future__ import annotations

import datetime as _dt
import importlib.metadata as md
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

from esreason.io.atomic import atomic_write_json
from esreason.io.hashing import hash_directory_safetensors

MANIFEST_FILE = "manifest.json"
_LIBS = ("esreason", "torch", "transformers", "tokenizers", "safetensors", "numpy", "trl", "math-verify",
         "datasets", "vllm", "ray")


def library_versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in _LIBS:
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = None
    return out


def git_sha() -> str | None:
    """SHA of the esreason source checkout (None outside git); never raises."""
    src = Path(__file__).resolve().parent
    try:
        proc = subprocess.run(["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True,
                              text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout.strip() or None if proc.returncode == 0 else None


def device_info() -> dict[str, Any]:
    import torch

    if torch.cuda.is_available():
        return {"type": "cuda", "devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]}
    return {"type": "cpu", "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads()}


def build_manifest(config: dict[str, Any], *, seeds: dict[str, Any], model_dir: str | None = None,
                   datasets: dict[str, str] | None = None) -> dict[str, Any]:
    model_hash = None
    if model_dir and Path(model_dir).is_dir():
        try:
            model_hash = hash_directory_safetensors(model_dir)
        except FileNotFoundError:
            model_hash = None
    return {
        "created_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": sys.argv,
        "config": config,
        "seeds": seeds,
        "versions": library_versions(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "device": device_info(),
        "git_sha": git_sha(),
        "model": {"path": model_dir, "sha256_tensors": model_hash},
        "datasets": datasets or {},
    }


def write_manifest(run_dir: str | Path, manifest: dict[str, Any]) -> Path:
    path = Path(run_dir) / MANIFEST_FILE
    atomic_write_json(path, manifest)
    return path
