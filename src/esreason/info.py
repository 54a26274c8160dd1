"""``esreason info``: versions, device, and where the embedded default lives.

Cheap by design: optional libraries (trl, vllm, ray, ...) are looked up with
``importlib.util.find_spec`` and their installed metadata, never imported; the embedded
model's size is read from its ``config.json`` and the safetensors *header* (shapes only),
without loading weights.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import importlib.util
import json
import math
import os
import platform
import struct
import sys
from pathlib import Path
from typing import Any

# (distribution name, import name) shown besides esreason, python and torch.
_LIBRARIES = (("transformers", "transformers"), ("trl", "trl"), ("math-verify", "math_verify"),
              ("datasets", "datasets"), ("vllm", "vllm"), ("ray", "ray"))
NOT_INSTALLED = "not installed"


def _version(dist: str, module: str) -> str:
    """Installed version of ``dist``, or "not installed" (checked without importing it)."""
    try:
        if importlib.util.find_spec(module) is None:
            return NOT_INSTALLED
    except (ImportError, ValueError):
        return NOT_INSTALLED
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return NOT_INSTALLED


def safetensors_parameter_count(model_dir: Path) -> int:
    """Number of stored parameters, summed from the shapes in each ``*.safetensors`` header.

    A safetensors file starts with an 8-byte little-endian header length and a JSON header
    mapping tensor names to dtype/shape/offsets; no tensor data is read. Tied weights are
    stored once, so this matches ``sum(p.numel() for p in model.parameters())``.
    """
    total = 0
    for f in sorted(model_dir.glob("*.safetensors")):
        with open(f, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n))
        total += sum(math.prod(v["shape"]) for k, v in header.items() if k != "__metadata__")
    return total


def _embedded_info() -> dict[str, Any]:
    from esreason.embedded import demo_model_dir

    path = Path(demo_model_dir())
    cfg_file = path / "config.json"
    out: dict[str, Any] = {"path": str(path), "exists": cfg_file.is_file() and any(path.glob("*.safetensors"))}
    if cfg_file.is_file():
        cfg = json.loads(cfg_file.read_text(encoding="utf-8"))
        out.update({k: cfg.get(k) for k in ("model_type", "hidden_size", "num_hidden_layers", "vocab_size")})
    if out["exists"]:
        out["parameters"] = safetensors_parameter_count(path)
    return out


def info_dict() -> dict[str, Any]:
    """Everything ``esreason info`` reports, as plain data."""
    import torch

    from esreason import __version__
    from esreason.io.manifest import git_state

    if torch.cuda.is_available():
        device: dict[str, Any] = {"type": "cuda", "cuda": torch.version.cuda,
                                  "devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]}
    else:
        device = {"type": "cpu", "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads()}
    return {
        "esreason": __version__,
        "esreason_path": str(Path(__file__).resolve().parent),
        "git": git_state(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "versions": {"torch": torch.__version__, **{d: _version(d, m) for d, m in _LIBRARIES}},
        "device": device,
        "embedded": _embedded_info(),
    }


def format_info(info: dict[str, Any]) -> str:
    """Human-readable lines for :func:`info_dict`'s result."""
    git = info["git"]
    src = info["esreason_path"]
    if git.get("sha"):
        src += f" (git {git['sha'][:12]}{', modified' if git.get('dirty') else ''})"
    lines = [f"{'esreason':<13} {info['esreason']}  {src}",
             f"{'python':<13} {info['python']}  ({info['platform']})"]
    lines += [f"{name:<13} {version}" for name, version in info["versions"].items()]
    dev = info["device"]
    if dev["type"] == "cuda":
        lines.append(f"{'device':<13} cuda {dev['cuda']}: " + ", ".join(
            f"[{i}] {name}" for i, name in enumerate(dev["devices"])))
    else:
        lines.append(f"{'device':<13} cpu ({dev['cpu_count']} cores, {dev['torch_threads']} torch threads)")
    emb = info["embedded"]
    if emb["exists"]:
        lines.append(f"{'embedded':<13} {emb['path']}  ({emb.get('model_type')}, {emb['parameters']:,} parameters, "
                     f"hidden {emb.get('hidden_size')}, {emb.get('num_hidden_layers')} layers, "
                     f"vocab {emb.get('vocab_size')})")
    else:
        lines.append(f"{'embedded':<13} {emb['path']}  (missing: run `esreason pretrain-demo`)")
    return "\n".join(lines)


def info_text() -> str:
    """The text ``esreason info`` prints."""
    return format_info(info_dict())


def run_info(args: argparse.Namespace | None = None) -> int:
    """CLI entry: print :func:`info_text` (or JSON when ``args.json`` is set); exit status 0."""
    if getattr(args, "json", False):
        print(json.dumps(info_dict(), indent=2))
    else:
        print(info_text())
    return 0
