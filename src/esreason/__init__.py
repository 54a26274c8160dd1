"""esreason: Evolution Strategies post-training for LLM reasoning.

Implements the system of "Understanding Evolution Strategies for LLM Reasoning:
Broader Reasoning Coverage than GRPO": full-parameter one-point ES with seeded
perturbations and z-scored rewards, a FLOP-matched GRPO comparator, a Pass@K /
Maj@K evaluation harness and analyses of what ES does to the weights.

The Python API (imported on first use, so ``import esreason`` stays light)::

    from esreason import ESConfig, ESTrainer, GRPOComparator, evaluate, register_task, register_verifier, Task, Problem
"""

from __future__ import annotations

from typing import Any

import os as _os
import sys as _sys

from esreason import openmp as _openmp

__version__ = "0.1.0"

# The bounded OpenMP spin the CLI sets (esreason.openmp) applies to Python users too: libgomp reads it
# once, when torch is imported, so it is set here, before esreason imports torch. The user's own
# GOMP_SPINCOUNT / OMP_WAIT_POLICY wins; when torch was imported first it is too late (the API warns).
OPENMP_TOO_LATE = "torch" in _sys.modules and not {"GOMP_SPINCOUNT", "OMP_WAIT_POLICY"} & set(_os.environ)
_openmp.configure()
# As the CLI: the tokenizers library's own thread pool stays off (it competes with torch's threads and
# warns, then disables itself, when a process forks after using it). The user's setting wins.
_os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

_API = {
    "ESConfig": "esreason.api.config",
    "ESTrainer": "esreason.api.trainer",
    "evaluate": "esreason.api.evaluate",
    "GRPOComparator": "esreason.api.grpo",
    "Task": "esreason.tasks.base",
    "Problem": "esreason.tasks.base",
    "Verdict": "esreason.verifiers.base",
    "register_task": "esreason.tasks.registry",
    "register_verifier": "esreason.verifiers",
    "add_tasks_dir": "esreason.tasks.registry",
}

__all__ = ["__version__", *_API]


def __getattr__(name: str) -> Any:
    if name in _API:
        import importlib

        module = importlib.import_module(_API[name])
        return getattr(module, "register" if name in ("register_task", "register_verifier") else name)
    raise AttributeError(f"module 'esreason' has no attribute {name!r}")
