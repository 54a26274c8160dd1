"""Backend selection from ``backend.type`` (docs/gpu-layout.md).

:func:`build_evaluator` returns the population evaluator the ES trainer uses; the
trainer's in-process policy stays the authoritative centre in every mode.

- ``hf``: :class:`esreason.es_loop.evaluate.SequentialEvaluator`, one member at a time (the reference).
- ``batched``: :class:`esreason.backends.batched.BatchedEvaluator`, groups of
  ``backend.population_batch`` members in one stacked-weight forward (same rewards).
- ``ray``: :func:`esreason.backends.ray_pool.build_ray_pool` (engine actors, HF on CPU, vLLM on GPUs).
- ``vllm``: :func:`esreason.backends.vllm.build_vllm_evaluator` (one in-process vLLM engine).
"""

from __future__ import annotations

from typing import Any

from esreason.backends.base import Generator, PopulationEvaluator
from esreason.errors import UserError


def build_evaluator(cfg: Any, policy: Any, generator: Generator, tokenizer: Any) -> PopulationEvaluator:
    """The evaluator for ``cfg.backend.type``; bad combinations raise UserError naming the key."""
    kind = cfg.backend.type
    if kind == "hf":
        from esreason.es_loop.evaluate import SequentialEvaluator

        return SequentialEvaluator(policy, generator)
    if kind == "batched":
        return _build_batched(cfg, policy, generator)
    # --- ray: engine pool (backends/ray_pool.py) -------------------------------------
    if kind == "ray":
        from esreason.backends.ray_pool import build_ray_pool

        return build_ray_pool(cfg, policy)
    # --- vllm: in-process vLLM engine (backends/vllm.py) ------------------------------
    if kind == "vllm":
        from esreason.backends.vllm import build_vllm_evaluator

        return build_vllm_evaluator(cfg, policy)
    raise UserError(f"config key 'backend.type': {kind!r} is not available in this build")


def _build_batched(cfg: Any, policy: Any, generator: Generator) -> PopulationEvaluator:
    """``backend.type: batched``: float32 Llama/Qwen2 models on CPU or CUDA, with the Sampler."""
    from esreason.backends.batched import BatchedEvaluator, check_batched_config
    from esreason.backends.sampling import Sampler

    check_batched_config(cfg)
    if not isinstance(generator, Sampler):
        raise UserError("config key 'backend.type': 'batched' reproduces the transformers Sampler; "
                        f"this run's generator is {type(generator).__name__}")
    if cfg.backend.population_batch > cfg.es.population_size:
        raise UserError(f"config key 'backend.population_batch': {cfg.backend.population_batch} is larger than "
                        f"es.population_size={cfg.es.population_size} (use 0 for the whole population)")
    return BatchedEvaluator(policy, generator, population_batch=cfg.backend.population_batch)


def describe_evaluator(cfg: Any, evaluator: Any) -> dict[str, Any]:
    """What population evaluation actually runs (``RUN/backend.json``): the backend, the engine
    kind, how many engines started, the update mode, each engine's host and Ray GPU ids (engines
    that share a GPU under ``backend.engines_per_gpu`` show the same id), the CPU niceness each
    engine runs at (0: normal priority; :mod:`esreason.backends.ray_niceness`) and its Ray node id."""
    slots = getattr(evaluator, "slots", None)
    if slots is not None:  # a Ray pool (backends/ray_pool.py)
        return {"type": "ray", "engine": evaluator.kind, "engines": len(slots), "update": evaluator.update_mode,
                "gpus_per_engine": evaluator.gpus,
                "engines_per_gpu": getattr(cfg.backend, "engines_per_gpu", 1),
                "tensor_parallel_size": getattr(cfg.backend, "tensor_parallel_size", 1),
                "hosts": [evaluator.engine_hosts.get(s.rank, "?") for s in slots],
                "gpu_ids": [getattr(evaluator, "engine_gpus", {}).get(s.rank, []) for s in slots],
                "niceness": [getattr(evaluator, "engine_niceness", {}).get(s.rank) for s in slots],
                "nodes": [getattr(evaluator, "engine_nodes", {}).get(s.rank, "?") for s in slots]}
    if getattr(getattr(evaluator, "engine", None), "llm", None) is not None:
        return {"type": "vllm", "engine": "vllm", "engines": 1, "update": "replicated",
                "tensor_parallel_size": int(evaluator.engine.setup.get("ranks", 1))}
    return {"type": cfg.backend.type, "engine": "hf", "engines": 1, "update": "replicated"}
