"""RUN/manifest.json: what produced a run (DESIGN §1).

Resolved config, package and library versions, Python/platform/device, the git SHA of the
esreason checkout (when running from one), model and dataset hashes, seeds, the command line
and a UTC timestamp. Building a manifest never fails for lack of git, CUDA or optional
libraries: those fields are then None.
"""

from __future__ import annotations

import datetime as _dt
import importlib.metadata as md
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

from esreason.errors import UserError
from esreason.io.atomic import atomic_write_json
from esreason.io.hashing import hash_directory_safetensors

MANIFEST_FILE = "manifest.json"
MANIFEST_VERSION = 1
# Distribution names (importlib.metadata); optional ones are None when not installed.
LIBRARIES = ("esreason", "torch", "transformers", "tokenizers", "safetensors", "numpy", "datasets", "trl",
             "math-verify", "vllm", "ray")


def library_versions(names: tuple[str, ...] = LIBRARIES) -> dict[str, str | None]:
    """Installed versions by distribution name, read from metadata (nothing is imported)."""
    out: dict[str, str | None] = {}
    for name in names:
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = None
    return out


def _git(repo: Path, *args: str) -> str | None:
    try:
        proc = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=10,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def git_state(package_dir: Path | None = None) -> dict[str, Any]:
    """``{"sha": str|None, "dirty": bool|None}`` of the checkout esreason is imported from.

    Only a checkout that actually contains the package counts (``<toplevel>/src/esreason``):
    an installed copy under some other repository's ``.venv`` reports None rather than
    that repository's SHA. ``dirty`` means tracked files differ from HEAD. Never raises.
    """
    pkg = (package_dir or Path(__file__).resolve().parent.parent).resolve()
    top = _git(pkg, "rev-parse", "--show-toplevel")
    if not top or Path(top).resolve() / "src" / pkg.name != pkg:
        return {"sha": None, "dirty": None}
    sha = _git(pkg, "rev-parse", "HEAD")
    status = _git(pkg, "status", "--porcelain", "--untracked-files=no")
    return {"sha": sha or None, "dirty": None if status is None else bool(status)}


def device_info() -> dict[str, Any]:
    """CUDA device names (and CUDA version) when available, else CPU cores, torch threads and the OpenMP
    wait setting (:mod:`esreason.openmp`)."""
    import torch

    if torch.cuda.is_available():
        return {"type": "cuda", "cuda": torch.version.cuda,
                "devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]}
    from esreason import openmp

    return {"type": "cpu", "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "openmp_wait": openmp.describe()}


def build_manifest(config_dict: dict[str, Any], *, seeds: dict[str, Any], model_dir: str | None = None,
                   datasets: dict[str, str] | None = None) -> dict[str, Any]:
    """The manifest of a run about to start.

    ``model_dir``: the model as given; when it is a local directory its tensors are hashed
    with :func:`hash_directory_safetensors` (None for hub ids and directories without
    safetensors). ``datasets``: name -> hash or description, recorded as given.
    """
    model_hash = None
    if model_dir and Path(model_dir).is_dir():
        try:
            model_hash = hash_directory_safetensors(model_dir)
        except UserError:  # e.g. a pytorch_model.bin-only directory
            model_hash = None
    git = git_state()
    return {
        "manifest_version": MANIFEST_VERSION,
        "created_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": list(sys.argv),
        "config": config_dict,
        "seeds": seeds,
        "versions": library_versions(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "device": device_info(),
        "git_sha": git["sha"],
        "git_dirty": git["dirty"],
        "model": {"path": model_dir, "sha256_tensors": model_hash},
        "datasets": dict(datasets or {}),
    }


def write_manifest(run_dir: str | Path, manifest: dict[str, Any]) -> Path:
    """Atomically write ``run_dir/manifest.json``; returns its path."""
    return atomic_write_json(Path(run_dir) / MANIFEST_FILE, manifest)


__all__ = ["MANIFEST_FILE", "build_manifest", "device_info", "git_state", "library_versions", "write_manifest"]
