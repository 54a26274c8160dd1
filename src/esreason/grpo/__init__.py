"""GRPO comparator: the paper's GRPO on TRL's GRPOTrainer (trl==1.16.0), plus held-out tracking.

- :mod:`esreason.grpo.config`     GRPORunConfig and its sections; ``load_grpo_config``
- :mod:`esreason.grpo.plan`       one update = one rollout batch; mapping onto TRL's batching
- :mod:`esreason.grpo.objective`  reference group advantage and clipped objective (torch only)
- :mod:`esreason.grpo.variants`   named variants (Dr. GRPO, DAPO, BNPO, GSPO) as config overlays
- :mod:`esreason.grpo.reward`     the task verifier as a TRL reward function
- :mod:`esreason.grpo.trainer`    TRL wiring (the only module importing trl)
- :mod:`esreason.grpo.callbacks`  run-directory callbacks (metrics, held-out eval, checkpoints)
- :mod:`esreason.grpo.run`        ``run_grpo`` and the ``esreason train grpo`` registration

Importing this package is cheap: TRL, transformers and torch load only when a run starts.
"""

from __future__ import annotations

from typing import Any

__all__ = ["GRPOResult", "GRPORunConfig", "group_advantages", "grpo_loss", "load_grpo_config", "register",
           "run_grpo"]

_LAZY = {
    "GRPORunConfig": "esreason.grpo.config",
    "load_grpo_config": "esreason.grpo.config",
    "group_advantages": "esreason.grpo.objective",
    "grpo_loss": "esreason.grpo.objective",
    "GRPOResult": "esreason.grpo.run",
    "register": "esreason.grpo.run",
    "run_grpo": "esreason.grpo.run",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'esreason.grpo' has no attribute {name!r}")
