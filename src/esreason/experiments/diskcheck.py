"""``esreason experiment run`` checks the free disk before the first stage (issue 35, item 6).

Two places fill up during an experiment, and both were found full only when the first checkpoint
(or the first engine) was written, hours into a run:

- the experiment directory (``--output``): every trained run keeps its checkpoints (our
  ``step_N`` plus, for GRPO, TRL's trainer states). Their bytes are the plan's disk terms
  (:mod:`esreason.experiments.memplan_host`: ``checkpoints``, ``trainer_states``), summed over the
  training stages :func:`esreason.experiments.spec.run_stages` lists (every seed); bytes already in
  the directory (a resumed experiment) count as written.
- the engines' start state (``ESREASON_ENGINE_DIR`` or the temp dir,
  :func:`esreason.backends.engine.shared_state_root`): an ES stage on Ray/vLLM engines writes the
  start state once per node (the plan's ``start_state``: weights and fp32 masters) and, at each
  checkpoint, exports the centre to a temporary directory of the same size beside it
  (:meth:`esreason.backends.vllm.VLLMEngine.export_state`), so its peak is twice the start state;
  stages run one after another and a pool removes its state at close, so the largest stage counts.

Where both are on one file system their sums are checked together. The error names the path, the
bytes needed and the bytes free.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable

from esreason.errors import UserError

GIB = 2 ** 30
#: Peak engine state per ES stage, in start states: the shared start state plus one exported centre.
ENGINE_STATE_COPIES = 2


def _host_disk(kind: str, cfg: Any, updates: int) -> dict[str, float]:
    """The plan's disk terms (GiB) of one training stage; {} for a model the plan cannot price."""
    from esreason.experiments import memplan_host

    def host(c: Any) -> dict[str, Any]:
        if kind == "es":
            engines = c.backend.engines if c.backend.type == "ray" else 1
            return memplan_host.es_host(c, engines, 80.0, 0.0, updates)  # disk terms ignore the GPU figures
        return memplan_host.grpo_host(c, 1, "ddp", updates)  # disk terms ignore processes and sharding

    try:
        return host(cfg)["disk_gib"]
    except UserError:
        pass
    try:  # 'demo' or a local directory: its config.json
        from esreason.backends.hf import resolve_model_path

        return host(dataclasses.replace(cfg, model=resolve_model_path(cfg.model)))["disk_gib"]
    except UserError:
        return {}


def planned_disk_bytes(spec: Any) -> dict[str, int]:
    """``{"checkpoints": bytes under --output, "engine_state": peak bytes under the engine dir}``."""
    from esreason.experiments.spec import run_stages

    checkpoints, engine = 0.0, 0.0
    for _name, kind, updates in run_stages(spec):
        if kind not in ("es", "grpo"):
            continue
        disk = _host_disk(kind, spec.es if kind == "es" else spec.grpo, updates)
        checkpoints += disk.get("checkpoints", 0.0) + disk.get("trainer_states", 0.0)
        engine = max(engine, ENGINE_STATE_COPIES * disk.get("start_state", 0.0))
    return {"checkpoints": int(checkpoints * GIB), "engine_state": int(engine * GIB)}


def engine_dir() -> Path:
    """Where engines write their start state (:func:`esreason.backends.engine.shared_state_root`'s parent)."""
    return Path(os.environ.get("ESREASON_ENGINE_DIR") or tempfile.gettempdir())


def _existing(path: Path) -> Path:
    """``path`` or its nearest existing ancestor (the file system it will be created on)."""
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _bytes_in(path: Path) -> int:
    if not path.is_dir():
        return 0
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def check_disk(spec: Any, output: Path, engines: Path | None = None,
               free: Callable[[Path], int] = lambda p: shutil.disk_usage(p).free) -> None:
    """Raise UserError (path, bytes needed, bytes free) when the planned checkpoints (under
    ``output``) or the engines' start state (under ``engines``, default :func:`engine_dir`) do not
    fit the free disk. ``free``: free bytes of the file system holding a path (tests replace it)."""
    need = planned_disk_bytes(spec)
    outputs = max(0, need["checkpoints"] - _bytes_in(output))
    places = [(output, outputs, "checkpoints (--output)"),
              (engines if engines is not None else engine_dir(), need["engine_state"],
               "engine start state (ESREASON_ENGINE_DIR, else the temp dir)")]
    by_device: dict[int, list[tuple[Path, int, str]]] = {}
    for path, nbytes, what in places:
        if nbytes > 0:
            by_device.setdefault(os.stat(_existing(path)).st_dev, []).append((path, nbytes, what))
    for group in by_device.values():
        total = sum(n for _, n, _ in group)
        have = free(_existing(group[0][0]))
        if total > have:
            parts = "; ".join(f"{what} under {path}: {n:,} bytes ({n / GIB:.1f} GiB)" for path, n, what in group)
            raise UserError(f"experiment {spec.name}: not enough free disk: {parts}; {have:,} bytes "
                            f"({have / GIB:.1f} GiB) free on the file system of {_existing(group[0][0])}. "
                            f"Free space, or write elsewhere (--output DIR, ESREASON_ENGINE_DIR=DIR); "
                            f"`esreason experiment plan` shows each stage's disk; --force runs anyway")


__all__ = ["ENGINE_STATE_COPIES", "check_disk", "engine_dir", "planned_disk_bytes"]
