"""The preflight of the GPU acceptance (benchmarks/gpu_acceptance.py), run as a child process before
any section starts; its JSON goes into the result's head.

- ``imports``: each module the sections need (``trl.trainer.grpo_trainer`` -- TRL imports peft
  whenever peft is installed --, ``datasets``, ``math_verify``, ``peft``, ``pyarrow``, ...), its
  package's version and the directory it was imported from (the wheels' ``--target`` directory or the
  machine's own site-packages), or the import error. A section whose module fails to import is
  skipped with that error as its reason (:data:`SECTION_NEEDS`).
- ``requirements``: what each carried package (transformers, TRL, datasets, peft, math-verify)
  declares against what is installed, and the unmet ones in one list (datasets 5.2 wants pyarrow >= 24;
  the machine's pyarrow is not carried: its wheel alone is over half of the 64 MiB a device call carries).
- ``disk``: free bytes where the sections write (the scratch directory; ``$OUT``).
- ``gpu``: the GPU as torch reports it (name, ``total_memory``, free memory by ``cudaMemGetInfo``,
  multiprocessors, compute capability), the plan's row for it (``memplan.gpu_type_of``) and that
  row's capacity; ``nvidia_smi``: name, memory.total and driver version as the driver reports them.

Usage: python benchmarks/gpu_acceptance_preflight.py DEVICE WORK_DIR OUT.json
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

#: The modules a section imports (in its child processes) beyond torch and transformers.
MODULES = ("torch", "transformers", "accelerate", "tokenizers", "safetensors", "huggingface_hub", "esreason.cli",
           "esreason.experiments.plan", "trl.trainer.grpo_trainer", "datasets", "math_verify", "peft", "pyarrow",
           "fsspec")
#: Section -> the modules it cannot run without (esreason.cli and the math verifier: demo-add's rewards).
SECTION_NEEDS: dict[str, tuple[str, ...]] = {
    "setup": ("transformers", "esreason.cli"),
    "es_resume_embedded": ("esreason.cli", "math_verify"),
    "es_resume": ("esreason.cli", "math_verify"),
    "grpo": ("esreason.cli", "trl.trainer.grpo_trainer", "datasets", "math_verify"),
    "grpo_plan": ("esreason.experiments.plan",),
    "eval": ("esreason.cli", "math_verify"),
    "es_stage_release": ("esreason.cli", "math_verify"),
    "sampler_vs_generate": ("transformers",),
}


def imports() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in MODULES:
        try:
            mod = importlib.import_module(name)
            top = importlib.import_module(name.split(".")[0])
            out[name] = {"version": getattr(top, "__version__", None), "from": str(Path(top.__file__).parent.parent)}
        except Exception as exc:  # noqa: BLE001 -- a failed import is the finding, reported as such
            out[name] = {"error": f"{type(exc).__name__}: {exc}"}
    return out


#: The packages the wheels carry, whose declared requirements the machine's packages must meet.
CARRIED = ("transformers", "trl", "datasets", "peft", "math-verify")


def requirements() -> dict[str, Any]:
    """Each carried package's declared requirements (extras left out) against the installed versions:
    ``{package: {requirement: {"wants", "installed", "satisfied"}}}`` and ``unmet``, a flat list."""
    from importlib import metadata

    from packaging.requirements import Requirement

    out: dict[str, Any] = {"unmet": []}
    for pkg in CARRIED:
        try:
            reqs = [Requirement(r) for r in metadata.requires(pkg) or []]
        except metadata.PackageNotFoundError:
            out[pkg] = "not installed"
            continue
        rows = {}
        for req in reqs:
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue  # an extra's requirement, or one for another platform
            try:
                have = metadata.version(req.name)
            except metadata.PackageNotFoundError:
                have = None
            ok = have is not None and req.specifier.contains(have, prereleases=True)
            rows[req.name] = {"wants": str(req.specifier), "installed": have, "satisfied": ok}
            if not ok:
                out["unmet"].append(f"{pkg} wants {req.name}{req.specifier or ''}, installed: {have}")
        out[pkg] = rows
    return out


def disk(paths: dict[str, Path]) -> dict[str, Any]:
    out = {}
    for label, path in paths.items():
        p = path
        while not p.exists() and p != p.parent:
            p = p.parent
        usage = shutil.disk_usage(p)
        out[label] = {"path": str(path), "free_bytes": usage.free, "free_gib": round(usage.free / 2 ** 30, 2)}
    return out


def nvidia_smi() -> dict[str, Any]:
    try:
        line = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
                               "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=30,
                              check=True).stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError) as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    name, mib, driver = (x.strip() for x in line.split(","))
    return {"name": name, "memory_total_mib": int(float(mib)), "memory_total_gib": round(float(mib) / 1024, 2),
            "driver_version": driver}


def gpu(device: str) -> dict[str, Any]:
    import torch

    if not device.startswith("cuda"):
        return {"device": device, "cuda_available": torch.cuda.is_available()}
    from esreason.experiments import memplan

    props = torch.cuda.get_device_properties(0)
    free, total = torch.cuda.mem_get_info(0)
    kind = memplan.gpu_type_of(props.name)
    plan_gib = memplan.GPU_MEMORY_GIB[kind][1] if kind else None
    torch_gib = props.total_memory / memplan.GIB
    return {"device": device, "name": props.name, "total_memory_bytes": props.total_memory,
            "total_memory_gib": round(torch_gib, 3), "free_at_start_gib": round(free / memplan.GIB, 3),
            "mem_get_info_total_gib": round(total / memplan.GIB, 3), "multiprocessors": props.multi_processor_count,
            "compute_capability": f"{props.major}.{props.minor}", "torch_cuda": torch.version.cuda,
            "plan_gpu_type": kind, "plan_capacity_gib": plan_gib,
            "plan_minus_torch_gib": None if plan_gib is None else round(plan_gib - torch_gib, 3)}


def preflight(device: str, work: Path, out_dir: Path | None) -> dict[str, Any]:
    paths = {"work": work, **({"out": out_dir} if out_dir is not None else {})}
    result: dict[str, Any] = {"python": sys.version.split()[0], "cpu_count": os.cpu_count(), "imports": imports()}
    result["requirements"] = requirements()
    result["disk"] = disk(paths)
    result["gpu"] = gpu(device)
    result["nvidia_smi"] = nvidia_smi() if device.startswith("cuda") else None
    return result


def missing(pre: dict[str, Any], section: str) -> str | None:
    """Why ``section`` cannot run (its first module that failed to import), or None."""
    for name in SECTION_NEEDS.get(section, ()):
        info = pre.get("imports", {}).get(name, {})
        if "error" in info:
            return f"needs {name}, which failed to import: {info['error']}"
    return None


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        raise SystemExit("usage: gpu_acceptance_preflight.py DEVICE WORK_DIR OUT.json")
    device, work, out = argv[0], Path(argv[1]), Path(argv[2])
    env_out = os.environ.get("OUT")
    out.write_text(json.dumps(preflight(device, work, Path(env_out) if env_out else None), indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
