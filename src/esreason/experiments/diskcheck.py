"""``esreason experiment run`` checks the free disk before the first stage.

Four places fill up during an experiment, and each was found full only when the first checkpoint,
engine, download or evaluation was written, hours into a run:

- the experiment directory (``--output``): every trained run keeps its checkpoints (our
  ``step_N`` plus, for GRPO, TRL's trainer states). Their bytes are the plan's disk terms
  (:mod:`esreason.experiments.memplan_host`: ``checkpoints``, ``trainer_states``), summed over the
  training stages :func:`esreason.experiments.spec.run_stages` lists (every seed); and every
  evaluation's ``responses.jsonl`` (:func:`esreason.experiments.diskcache.eval_output_bytes`).
  Bytes already in the directory (a resumed experiment) count as written.
- the Hugging Face hub cache (``HF_HUB_CACHE``): the models and the paper datasets' files not
  downloaded yet (:mod:`esreason.experiments.diskcache`: weights from the parameter count and the
  published dtype; datasets from a stated size table);
- the ``datasets`` cache (``HF_DATASETS_CACHE``): the Arrow copy of every dataset not cached yet.
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
    """Bytes the experiment writes: ``checkpoints`` and ``eval_outputs`` (under --output),
    ``engine_state`` (the peak under the engine dir), ``hub_downloads`` (models and dataset files not in
    the hub cache yet) and ``datasets_arrow`` (their Arrow copies in the datasets cache)."""
    from esreason.experiments import diskcache
    from esreason.experiments.spec import run_stages

    checkpoints, engine = 0.0, 0.0
    for _name, kind, updates in run_stages(spec):
        if kind not in ("es", "grpo"):
            continue
        disk = _host_disk(kind, spec.es if kind == "es" else spec.grpo, updates)
        checkpoints += disk.get("checkpoints", 0.0) + disk.get("trainer_states", 0.0)
        engine = max(engine, ENGINE_STATE_COPIES * disk.get("start_state", 0.0))
    datasets = diskcache.dataset_download_bytes(spec)
    return {"checkpoints": int(checkpoints * GIB), "eval_outputs": diskcache.eval_output_bytes(spec),
            "engine_state": int(engine * GIB),
            "hub_downloads": sum(diskcache.model_download_bytes(spec).values()) + sum(d for d, _ in datasets.values()),
            "datasets_arrow": sum(a for _, a in datasets.values())}


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
    """Raise UserError (path, bytes needed, bytes free) when the planned checkpoints and evaluation
    outputs (under ``output``), the engines' start state (under ``engines``, default
    :func:`engine_dir`), the downloads (the hub cache) or their Arrow copies (the datasets cache) do
    not fit the free disk. ``free``: free bytes of the file system holding a path (tests replace it)."""
    from esreason.experiments import diskcache

    need = planned_disk_bytes(spec)
    outputs = max(0, need["checkpoints"] + need["eval_outputs"] - _bytes_in(output))
    places = [(output, outputs, "checkpoints and evaluation outputs (--output)"),
              (engines if engines is not None else engine_dir(), need["engine_state"],
               "engine start state (ESREASON_ENGINE_DIR, else the temp dir)"),
              (diskcache.hub_cache(), need["hub_downloads"], "model and dataset downloads (HF_HUB_CACHE)"),
              (diskcache.datasets_cache(), need["datasets_arrow"], "datasets' Arrow copies (HF_DATASETS_CACHE)")]
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
                            f"Free space, or write elsewhere (--output DIR, ESREASON_ENGINE_DIR=DIR, HF_HOME=DIR); "
                            f"`esreason experiment plan` shows each stage's disk; --force runs anyway")


__all__ = ["ENGINE_STATE_COPIES", "check_disk", "engine_dir", "planned_disk_bytes"]
