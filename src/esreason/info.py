"""``esreason info``: versions, device, and where the embedded default lives.

Cheap by design: optional libraries (trl, vllm, ray, ...) are looked up with
``importlib.util.find_spec`` and their installed metadata, never imported; the embedded
model's size is read from its ``config.json`` and the safetensors *header* (shapes only),
without loading weights.

On a GPU machine it also reports the NVIDIA driver, the CUDA version torch was built for and
whether that driver can run it (a CUDA 13 torch on a driver older than 580 cannot: torch then
reports no CUDA device at all). The driver is read from NVML (``pynvml``, when installed), else
``nvidia-smi`` (with a timeout), else torch's CUDA driver API version. With none of them, and
no CUDA device visible to torch, the machine has "no GPU".
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import importlib.util
import json
import math
import os
import platform
import shutil
import struct
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

from esreason.backends import ray_niceness

# (distribution name, import name) shown besides esreason, python and torch.
_LIBRARIES = (("transformers", "transformers"), ("trl", "trl"), ("math-verify", "math_verify"),
              ("datasets", "datasets"), ("vllm", "vllm"), ("ray", "ray"))
NOT_INSTALLED = "not installed"

# Minimum Linux driver branch for each CUDA major release under minor-version compatibility:
# a binary built with any 12.x toolkit runs on a >= 525 driver, any 13.x one on >= 580.
# Source: NVIDIA, "CUDA Compatibility" > "Minor Version Compatibility", Table 1 ("CUDA Toolkit
# 11.x, 12.x, and 13.x Driver Version Ranges"),
# https://docs.nvidia.com/deploy/cuda-compatibility/minor-version-compatibility.html
MIN_LINUX_DRIVER: dict[int, int] = {11: 450, 12: 525, 13: 580}
NVIDIA_SMI_TIMEOUT_S = 5.0
OLDER_DRIVER_HINT = 'see docs/install.md, "Which NVIDIA driver the GPU line needs": the line for older drivers'


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


def _cuda_api_version(value: int) -> str:
    """CUDA driver API integer (``12040``) as ``"12.4"``."""
    return f"{value // 1000}.{value % 1000 // 10}"


def _text(value: Any) -> str:
    """NVML strings: ``bytes`` in older pynvml releases, ``str`` in newer ones."""
    return value.decode() if isinstance(value, bytes) else str(value)


def _driver_from_nvml() -> dict[str, Any] | None:
    """Driver version, its CUDA version and GPU names from NVML, or None without ``pynvml``/NVML."""
    try:
        with warnings.catch_warnings():  # the old ``pynvml`` dist warns that it is deprecated
            warnings.simplefilter("ignore", FutureWarning)
            import pynvml  # type: ignore[import-not-found]
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        try:
            driver = pynvml.nvmlSystemGetDriverVersion()
            cuda = pynvml.nvmlSystemGetCudaDriverVersion()
            names = [pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i))
                     for i in range(pynvml.nvmlDeviceGetCount())]
        finally:
            pynvml.nvmlShutdown()
    except pynvml.NVMLError:
        return None
    return {"driver": _text(driver), "driver_cuda": _cuda_api_version(int(cuda)),
            "gpus": [_text(n) for n in names], "source": "nvml"}


def _driver_from_nvidia_smi(timeout: float = NVIDIA_SMI_TIMEOUT_S) -> dict[str, Any] | None:
    """Driver version and GPU names from ``nvidia-smi --query-gpu``, or None when it is absent or fails."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        proc = subprocess.run([exe, "--query-gpu=driver_version,name", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    rows = [line.split(",", 1) for line in proc.stdout.splitlines() if line.strip()]
    if proc.returncode != 0 or not rows:
        return None
    return {"driver": rows[0][0].strip(), "driver_cuda": None,
            "gpus": [r[1].strip() for r in rows if len(r) == 2], "source": "nvidia-smi"}


def _driver_from_torch(torch: Any) -> dict[str, Any] | None:
    """The CUDA driver API version through torch (``torch._C._cuda_getDriverVersion``: 0 without a
    driver, absent from CPU builds); no driver number and no GPU names."""
    get = getattr(torch._C, "_cuda_getDriverVersion", None)
    if get is None:
        return None
    try:
        value = int(get())
    except (RuntimeError, TypeError, ValueError):
        return None
    if value <= 0:
        return None
    return {"driver": None, "driver_cuda": _cuda_api_version(value), "gpus": [], "source": "torch"}


def find_driver(torch: Any) -> dict[str, Any] | None:
    """The NVIDIA driver this machine has (NVML, else nvidia-smi, else torch), or None: no GPU driver."""
    return _driver_from_nvml() or _driver_from_nvidia_smi() or _driver_from_torch(torch)


def _major(version: str | None) -> int | None:
    """Leading integer of a dotted version ("580.65.06" -> 580), or None when absent or unparsable."""
    try:
        return int(str(version).split(".")[0]) if version else None
    except ValueError:
        return None


def driver_compatibility(torch_cuda: str | None, driver: str | None,
                         driver_cuda: str | None) -> dict[str, Any]:
    """Whether a driver can run torch's CUDA build.

    ``torch_cuda`` is ``torch.version.cuda`` ("13.0"; None for a CPU build), ``driver`` the
    driver version ("575.57.08"), ``driver_cuda`` the newest CUDA it supports ("12.9"); either
    may be None. The driver number is compared with :data:`MIN_LINUX_DRIVER` for torch's CUDA
    major; without it, the driver's CUDA major must reach torch's. Returns
    ``{"required_driver": int | None, "driver_ok": bool | None}`` (None: cannot tell).
    """
    cuda_major = _major(torch_cuda)
    required = MIN_LINUX_DRIVER.get(cuda_major) if cuda_major is not None else None
    driver_major, driver_cuda_major = _major(driver), _major(driver_cuda)
    if cuda_major is None:
        ok = None
    elif required is not None and driver_major is not None:
        ok = driver_major >= required
    elif driver_cuda_major is not None:
        ok = driver_cuda_major >= cuda_major
    else:
        ok = None
    return {"required_driver": required, "driver_ok": ok}


def device_info(torch: Any) -> dict[str, Any]:
    """The device part of :func:`info_dict`: ``type`` "cpu" (no GPU) or "cuda" (a driver or a CUDA
    device is present, usable by torch or not) with the driver and its compatibility."""
    available = bool(torch.cuda.is_available())
    drv = find_driver(torch)
    if drv is None and not available:
        from esreason import openmp

        return {"type": "cpu", "gpu": False, "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                "openmp_wait": openmp.describe()}
    drv = drv or {"driver": None, "driver_cuda": None, "gpus": [], "source": None}
    names = ([torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
             if available else drv["gpus"])
    return {"type": "cuda", "gpu": True, "cuda": torch.version.cuda, "torch_cuda_available": available,
            "devices": names, "driver": drv["driver"], "driver_cuda": drv["driver_cuda"],
            "driver_source": drv["source"],
            **driver_compatibility(torch.version.cuda, drv["driver"], drv["driver_cuda"])}


def info_dict() -> dict[str, Any]:
    """Everything ``esreason info`` reports, as plain data."""
    import torch

    from esreason import __version__
    from esreason.io.manifest import git_state

    return {
        "esreason": __version__,
        "esreason_path": str(Path(__file__).resolve().parent),
        "git": git_state(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "versions": {"torch": torch.__version__, **{d: _version(d, m) for d, m in _LIBRARIES}},
        "device": device_info(torch),
        "ray_workers": ray_niceness.describe(),
        "embedded": _embedded_info(),
    }


def _driver_line(dev: dict[str, Any]) -> str:
    """The ``driver`` line: driver and torch's CUDA build, and whether they fit."""
    seen = dev["driver"] or (f"supports CUDA {dev['driver_cuda']}" if dev["driver_cuda"] else "unknown")
    if dev["driver"] and dev["driver_cuda"]:
        seen += f" (CUDA {dev['driver_cuda']})"
    if dev["driver_source"]:
        seen += f" [{dev['driver_source']}]"
    if dev["cuda"] is None:
        return f"{seen}; torch is a CPU build: install a CUDA torch ({OLDER_DRIVER_HINT}, or the [gpu] line)"
    need = (f"needs driver >= {dev['required_driver']}" if dev["required_driver"]
            else f"needs a driver for CUDA {_major(dev['cuda'])}")
    verdict = {True: "ok", False: f"driver too old: upgrade it, or {OLDER_DRIVER_HINT}",
               None: "compatibility unknown"}[dev["driver_ok"]]
    line = f"{seen}; torch built for CUDA {dev['cuda']} {need}: {verdict}"
    if not dev["torch_cuda_available"]:
        line += " (torch sees no CUDA device)"
    return line


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
        gpus = ", ".join(f"[{i}] {name}" for i, name in enumerate(dev["devices"])) or "GPU names unknown"
        lines.append(f"{'device':<13} cuda {dev['cuda'] or '(CPU torch)'}: {gpus}")
        lines.append(f"{'driver':<13} {_driver_line(dev)}")
    else:
        lines.append(f"{'device':<13} no GPU: cpu ({dev['cpu_count']} cores, {dev['torch_threads']} torch threads, "
                     f"{dev.get('openmp_wait', 'OpenMP wait unknown')})")
    if "ray_workers" in info:
        lines.append(f"{'ray workers':<13} {info['ray_workers']}")
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
