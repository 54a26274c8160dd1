"""Attention for transformers models on the CPU: matmul-softmax-matmul for one-token decode steps.

Why. On the CPU, PyTorch's ``scaled_dot_product_attention`` dispatches to its flash-attention
kernel (``_scaled_dot_product_flash_attention_for_cpu``), which tiles over query blocks; a decode
step has one query per row, so the kernel does a block's bookkeeping for a single row. Profiled on
the demo's evaluation (embedded default, 2,048 rows = 64 problems x 32 samples, 64 new tokens,
2 cores): that kernel was 35 % of the sampler's time, more than every linear layer together
(24 %). transformers' ``eager`` attention (two batched matmuls and a softmax) makes the same step
about 18 % faster end to end, with the same token ids on that call. But ``eager`` also materialises
the full [B, heads, L, L] score tensor in the prefill, which for long prompts on a larger model
(HotpotQA's ~1,500-token prompts, 12 heads, 64 rows: ~7 GB) is a memory hazard ``sdpa`` avoids.

So this module registers one implementation, :data:`NAME`, with transformers' two registries
(``AttentionInterface`` for the attention, ``AttentionMaskInterface`` for the mask, the ``sdpa``
mask builder): a forward whose query has one position per row (a decode step) runs the eager
computation — ``softmax(q k^T * scaling + mask) v`` with the softmax in float32, as transformers'
``eager_attention_forward`` does, masked positions set to the dtype's minimum before the softmax —
and every other forward (prefill, training) is ``sdpa`` unchanged. :func:`load_model
<esreason.backends.hf.load_model>` selects it for models that run on the CPU
(:func:`attention_for`); on CUDA the default stays ``sdpa`` (flash / memory-efficient kernels).

Contracts it keeps: it is a function of the rows it is given (no cross-row state), so the
population forward (:mod:`esreason.backends.popmodel`, which calls the model's registered attention)
and the sequential sampler still agree bit for bit, and one evaluation engine still equals E engines.
It is registered in every process that loads a model through ``load_model`` (Ray actors and
``accelerate`` processes included); the name is not written into saved checkpoints
(``config._attn_implementation`` is not serialised), so a checkpoint loads anywhere.
"""

from __future__ import annotations

from typing import Any

import torch

NAME = "esreason_cpu"
"""The registered implementation's name (``model.config._attn_implementation``)."""


def _decode_or_sdpa(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                    **kwargs: Any) -> tuple[torch.Tensor, None]:
    """query [B, H, q, d], key/value [B, Hkv, kv, d], mask bool [B, 1, q, kv] (True: attend) or None.

    Returns (output [B, q, H, d], None), the layout of transformers' attention functions.
    """
    from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward

    if query.shape[-2] != 1 or (dropout and module.training) or kwargs.get("output_attentions"):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, **kwargs)
    groups = query.shape[1] // key.shape[1]
    key, value = repeat_kv(key, groups), repeat_kv(value, groups)  # [B, H, kv, d]
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    scores = torch.matmul(query, key.transpose(2, 3)) * scale  # [B, H, 1, kv]
    if attention_mask is not None:
        if attention_mask.dtype == torch.bool:
            scores.masked_fill_(~attention_mask[..., -key.shape[-2]:], torch.finfo(scores.dtype).min)
        else:  # an additive float mask (0 / dtype minimum)
            scores = scores + attention_mask[..., -key.shape[-2]:]
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)  # [B, H, 1, kv]
    out = torch.matmul(probs, value)  # [B, H, 1, d]
    return out.transpose(1, 2).contiguous(), None  # [B, 1, H, d]


def register() -> str:
    """Register :data:`NAME` with transformers (idempotent); returns the name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface, sdpa_mask

    if NAME not in ALL_MASK_ATTENTION_FUNCTIONS:
        AttentionInterface.register(NAME, _decode_or_sdpa)
        AttentionMaskInterface.register(NAME, sdpa_mask)
    return NAME


def attention_for(device: Any) -> str | None:
    """The attention implementation for a model that runs on ``device``: :data:`NAME` on the CPU,
    None (keep the model's own choice, ``sdpa`` by default) elsewhere."""
    return register() if torch.device(device).type == "cpu" else None


def use_on(model: Any, device: Any) -> Any:
    """Switch ``model`` to :func:`attention_for` ``device`` when it names one; returns the model.

    Only models whose config offers the switch and whose current implementation is ``sdpa`` or
    ``eager`` are switched (flash-attention or custom choices made by the caller are kept).
    """
    name = attention_for(device)
    config = getattr(model, "config", None)
    current = getattr(config, "_attn_implementation", None)
    if name is None or current not in ("sdpa", "eager") or not hasattr(model, "set_attn_implementation"):
        return model
    model.set_attn_implementation(name)
    return model
