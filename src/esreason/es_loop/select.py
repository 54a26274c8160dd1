"""Backend selection from ``backend.type`` (docs/gpu-layout.md).

:func:`build_evaluator` returns the population evaluator the ES trainer uses; the
trainer's in-process policy stays the authoritative centre in every mode.

- ``auto``: ``batched`` where it gives the checkpoints ``hf`` gives, faster; else ``hf`` (:func:`choose_auto`).
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


#: ``backend.type: auto`` picks ``batched`` only for models of at most this many parameters: batching
#: members saves per-call overhead, which shrinks beside the arithmetic as the model grows. Measured
#: (benchmarks/backend_auto.py, five runs on a busy 2-core CPU, docs/measurements.md "backend: auto"): batched
#: was faster than hf in every run up to 6.2M parameters (1.5-8.6x), 1.8x at 13.3M (median of 0.99, 1.58,
#: 2.00, 2.15) and as fast at 31.5M (0.97, 1.09), where its stacked weights cost memory for nothing; the
#: bound sits between the last two sizes (not measured at 16M itself).
AUTO_BATCHED_MAX_PARAMS = 16_000_000
#: ... and only while the members' stacked weights of one batched forward (``backend.population_batch``
#: members, or the population, x the model's float32 bytes) stay within this: they are held besides the
#: model, a copy per member.
AUTO_BATCHED_MAX_BYTES = 2 * 1024 ** 3


def choose_auto(cfg: Any, model: Any) -> tuple[str, str]:
    """(``"batched"`` or ``"hf"``, the reason) for ``backend.type: auto`` on the loaded ``model``.

    The rule: ``batched`` when it gives the checkpoints ``hf`` gives, which it is built and tested to do
    (bit-identical rewards, hence updates) for a float32 Llama/Qwen2-layout model
    (:func:`esreason.backends.popmodel.check_supported`) on the CPU, and when it is faster: a model of at
    most :data:`AUTO_BATCHED_MAX_PARAMS` parameters whose stacked member weights fit
    :data:`AUTO_BATCHED_MAX_BYTES`; ``hf`` otherwise. Not on CUDA: there GEMM results may depend on
    the batch's shape, so its rewards are not guaranteed equal (docs/internals.md, "Batched evaluation").
    benchmarks/backend_auto.py measures both choices side by side.
    """
    import torch

    from esreason.backends.popmodel import check_supported

    if torch.device(cfg.device).type != "cpu":
        return "hf", f"device {cfg.device!r}: batched equals hf bit for bit only on the CPU"
    if any(p.dtype != torch.float32 for p in model.parameters()):
        return "hf", f"dtype {cfg.dtype!r}: batched needs float32 weights"
    try:
        check_supported(model)
    except UserError as exc:
        return "hf", str(exc).replace("config key 'model': ", "")
    from esreason.es.params import unique_named_parameters

    unique = [p for _, p in unique_named_parameters(model)]
    count = sum(p.numel() for p in unique)
    if count > AUTO_BATCHED_MAX_PARAMS:
        return "hf", (f"{count / 1e6:.1f}M parameters: batched is faster only up to "
                      f"{AUTO_BATCHED_MAX_PARAMS / 1e6:.0f}M")
    members = cfg.backend.population_batch or cfg.es.population_size
    stacked = members * sum(p.numel() * p.element_size() for p in unique)
    if stacked > AUTO_BATCHED_MAX_BYTES:
        return "hf", (f"{members} members' stacked weights would take {stacked / 1024 ** 3:.1f} GiB "
                      f"(> {AUTO_BATCHED_MAX_BYTES / 1024 ** 3:.0f} GiB)")
    return "batched", (f"{getattr(model.config, 'model_type', '?')} model in float32 on the CPU, "
                       f"{count / 1e6:.2f}M parameters, {stacked / 1024 ** 2:.1f} MiB of stacked member weights")


def build_evaluator(cfg: Any, policy: Any, generator: Generator, tokenizer: Any) -> PopulationEvaluator:
    """The evaluator for ``cfg.backend.type``; bad combinations raise UserError naming the key."""
    kind = cfg.backend.type
    if kind == "auto":
        kind, reason = choose_auto(cfg, policy.model)
        evaluator = build_evaluator(_with_type(cfg, kind), policy, generator, tokenizer)
        evaluator.chosen_by_auto = reason  # type: ignore[attr-defined]  # RUN/backend.json says why
        return evaluator
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
    reason = getattr(evaluator, "chosen_by_auto", None)
    if reason is not None:
        from esreason.backends.batched import BatchedEvaluator

        kind = "batched" if isinstance(evaluator, BatchedEvaluator) else "hf"
        return {"type": kind, "engine": "hf", "engines": 1, "update": "replicated", "auto": reason}
    return {"type": cfg.backend.type, "engine": "hf", "engines": 1, "update": "replicated"}


def _with_type(cfg: Any, kind: str) -> Any:
    """``cfg`` with ``backend.type`` = ``kind`` (the choice of ``auto``)."""
    from dataclasses import replace

    return replace(cfg, backend=replace(cfg.backend, type=kind))
