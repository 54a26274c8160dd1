"""Where an ES stage of ``esreason experiment run`` / ``train sequence`` runs: a child process on a GPU.

The runner trains every method of an experiment one after another and evaluates each in between.
An ES stage run inside the runner's own process would leave that process holding GPU 0 through
every later stage: its CUDA context (cuBLAS workspaces, kernel images; the plan's ``cuda_context``
term, ~0.75 GiB) cannot be released from inside a process -- PyTorch has no call that destroys the
primary context, and ``torch.cuda.empty_cache()`` returns only the allocator's cached blocks -- and
any tensor still referenced after the stage (a policy, a saved centre, a direction cache) keeps its
blocks as well. The GRPO stage after it (one accelerate process per GPU, process 0 on GPU 0) and the
evaluation engines are planned without that memory (the Hard setting's GRPO stage has a 10 %
margin on an 80 GB GPU). So on a GPU the ES stage runs as ``python -m esreason.cli train es`` in a
child process, as the GRPO stage runs under ``accelerate launch``: when it exits, the driver frees
everything it held, and the runner process has not touched the GPU for it.

- Where: :data:`PROCESS_ENV` (``ESREASON_ES_PROCESS``) ``child`` or ``inprocess`` when set, else
  ``child`` for ``device: cuda...`` and ``inprocess`` on the CPU (no device memory to release; a
  child costs a process start and the imports, seconds per stage on a small CPU run).
- The child gets the stage's resolved config as ``RUN/launch/es.yaml`` and the command line in
  ``RUN/launch/es-launch.json`` (with the child's process id once it has started), so the run does
  not depend on files outside the run directory; ``--resume`` is passed when the run has traces.
- The stage's result is read back from the run directory: the updates done are the step of the
  final checkpoint (an ES run saves one after its last update).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Mapping

from esreason.errors import UserError

PROCESS_ENV = "ESREASON_ES_PROCESS"
CHOICES = ("child", "inprocess")
CONFIG_FILE = "es.yaml"
LAUNCH_FILE = "es-launch.json"


def es_process(cfg: Any, env: Mapping[str, str] | None = None) -> str:
    """``"child"`` or ``"inprocess"`` for an ES stage of ``cfg`` (module docstring)."""
    env = os.environ if env is None else env
    raw = (env.get(PROCESS_ENV) or "").strip()
    if raw:
        if raw not in CHOICES:
            raise UserError(f"{PROCESS_ENV}={raw!r}: expected one of {', '.join(CHOICES)}")
        return raw
    return "child" if str(cfg.device).startswith("cuda") else "inprocess"


def es_command(config_file: Path, out: Path, resume: bool, progress: bool) -> list[str]:
    """``python -m esreason.cli train es --config RUN/launch/es.yaml --output RUN [--resume]``."""
    cmd = [sys.executable, "-m", "esreason.cli", "train", "es", "--config", str(config_file), "--output", str(out)]
    return cmd + ([] if progress else ["--no-progress"]) + (["--resume"] if resume else [])


def launch_es(cfg: Any, out: Path, *, resume: bool, progress: bool) -> tuple[int, Path | None]:
    """Run the ES stage of ``cfg`` into ``out`` in a child process; (updates done, final checkpoint)."""
    import yaml

    from esreason.config import to_dict
    from esreason.experiments.launch import LAUNCH_DIR, launch_env
    from esreason.io import RunDir
    from esreason.io.atomic import atomic_write_json, atomic_write_text

    launch = out / LAUNCH_DIR
    launch.mkdir(parents=True, exist_ok=True)
    config_file = launch / CONFIG_FILE
    atomic_write_text(config_file, yaml.safe_dump(to_dict(cfg), sort_keys=False))
    cmd = es_command(config_file, out, resume, progress)
    record: dict[str, Any] = {"command": cmd, "parent_pid": os.getpid()}
    atomic_write_json(launch / LAUNCH_FILE, record)
    print(f"ES stage {out}: a child process (device {cfg.device}), so that it frees the GPU when it ends", flush=True)
    proc = subprocess.Popen(cmd, env=launch_env())
    atomic_write_json(launch / LAUNCH_FILE, {**record, "pid": proc.pid})
    code = proc.wait()
    if code != 0:
        raise UserError(f"ES stage {out} failed in its child process (exit code {code}); command in "
                        f"{launch / LAUNCH_FILE}; rerun to resume")
    latest = RunDir(out).latest_checkpoint()  # the run saves a checkpoint after its last update
    return (0, None) if latest is None else (int(latest[0]), Path(latest[1]))


def train_es(cfg: Any, out: Path, *, resume: bool, progress: bool) -> tuple[int, Path | None]:
    """Train one ES stage: in a child process on a GPU, in this process on the CPU (:func:`es_process`)."""
    if es_process(cfg) == "child":
        return launch_es(cfg, out, resume=resume, progress=progress)
    from esreason.es_loop.run import run_es
    from esreason.experiments.memplan_engines import resolve_at_run

    result = run_es(cfg, out, resume=resume, progress=progress, resolve_engines=resolve_at_run)
    return result.steps, result.final_checkpoint


__all__ = ["CHOICES", "PROCESS_ENV", "es_command", "es_process", "launch_es", "train_es"]
