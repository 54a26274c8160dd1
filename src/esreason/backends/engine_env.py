"""Where and how long a pool engine starts: its GPU under Ray, and the start-up limit.

**GPU placement.** Ray sets ``CUDA_VISIBLE_DEVICES`` for an actor that asked for GPUs, so each
vLLM engine sees only its own GPU as ``cuda:0``. Clusters that set
``RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES`` (common where another launcher manages
devices) turn that off, and every engine would land on the node's first GPU.
:func:`pin_visible_gpu` sets the variable from ``ray.get_gpu_ids()`` before vLLM starts, as
OpenRLHF's vLLM actors do.

**Start-up limit.** An engine start is vLLM's model build, torch.compile and CUDA-graph
capture (minutes on a cold compile cache at 7B, for all engines of a node at once), then
loading the start state and the in-place self-check (:mod:`esreason.backends.inplace_check`).
vLLM engines get :data:`VLLM_START_TIMEOUT_S`; ``ESREASON_ENGINE_START_TIMEOUT_S`` overrides
it for every engine kind.
"""

from __future__ import annotations

from typing import Any, MutableMapping, Sequence

from esreason.errors import UserError

NOSET_VISIBLE_DEVICES = "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"
VLLM_START_TIMEOUT_S = 1800.0
HF_START_TIMEOUT_S = 300.0


def pin_visible_gpu(env: MutableMapping[str, str], gpu_ids: Sequence[Any]) -> str | None:
    """Set ``env['CUDA_VISIBLE_DEVICES']`` to ``gpu_ids`` when Ray was told not to; returns the
    value set, or None when nothing changed (Ray set it already, or the actor has no GPU)."""
    if env.get(NOSET_VISIBLE_DEVICES, "") in ("", "0") or not gpu_ids:
        return None
    value = ",".join(str(g) for g in gpu_ids)
    env["CUDA_VISIBLE_DEVICES"] = value
    return value


def engine_start_timeout(kind: str, env: MutableMapping[str, str]) -> float:
    """Seconds engines of ``kind`` ('hf' | 'vllm') may take to be placed and to start."""
    raw = env.get("ESREASON_ENGINE_START_TIMEOUT_S")
    if not raw:
        return VLLM_START_TIMEOUT_S if kind == "vllm" else HF_START_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        raise UserError(f"ESREASON_ENGINE_START_TIMEOUT_S must be a number of seconds (got {raw!r})") from None
    if value <= 0:
        raise UserError(f"ESREASON_ENGINE_START_TIMEOUT_S must be > 0 (got {raw!r})")
    return value


__all__ = ["HF_START_TIMEOUT_S", "NOSET_VISIBLE_DEVICES", "VLLM_START_TIMEOUT_S", "engine_start_timeout",
           "pin_visible_gpu"]
