"""The plan's tensor-parallel terms (``backend.tensor_parallel_size`` / ``eval.tensor_parallel_size`` = TP).

An engine of TP GPUs splits every layer (:mod:`esreason.backends.vllm_layout`), so per GPU:

- **weights and KV cache**: 1/TP of the weights (norms replicated) and 1/min(TP, KV heads) of the
  KV cache (a KV head is replicated when there are fewer heads than ranks);
- **all-reduce per layer per decoded token**: every decoder layer ends its attention (o_proj) and
  its MLP (down_proj) with an all-reduce of the rows' hidden states (bf16), so a decode step of r
  rows runs 2 x layers all-reduces of r x hidden x 2 bytes. A ring all-reduce moves
  2 (TP - 1) / TP of the message over each GPU's link (NCCL's bus-bandwidth model) at the GPU's
  NVLink bandwidth per direction (plan_table.GPUS: 450 GB/s on the H100 SXM5, NVIDIA's datasheet
  "NVLink 900 GB/s"), plus a fixed latency per all-reduce (:data:`ALLREDUCE_LATENCY`): at decode
  sizes (64 rows x 5,120 x 2 B = 640 KiB) the latency dominates;
- **ES noise work**: a rank draws every noise block its shards touch (:mod:`esreason.es.region`):
  1/TP of each column-parallel weight (plus the partly used blocks at its ends) but *all* of each
  row-parallel weight (o_proj, down_proj), whose band of columns spans every block. So the RNG work
  per rank is :func:`layout` ``drawn`` elements, not P / TP; the elementwise work is ``held``.

:func:`layout` counts both exactly, with the engines' own layout code, from the architecture.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any

from esreason.experiments.plan_table import Assumption

ALLREDUCE_LATENCY = Assumption(
    "allreduce_latency_us", 10.0, "us per all-reduce of a decode step's hidden states (TP > 1)",
    "assumption (ours): a small-message all-reduce inside an NVLink/NVSwitch node costs ~5-20 us (vLLM's "
    "custom one-shot all-reduce at the low end, NCCL's ring at the high end); decode sizes are latency-bound")


def tp_of(section: Any) -> int:
    """``tensor_parallel_size`` of a backend or eval section (1 when absent)."""
    return int(getattr(section, "tensor_parallel_size", 1) or 1)


def _tensors(arch: dict[str, Any]) -> list[tuple[str, tuple[int, ...]]]:
    """(HF name, shape) of one decoder layer (index 0) and of the embeddings / head, Llama or Qwen2."""
    h, i = int(arch["hidden_size"]), int(arch["intermediate_size"])
    heads, kv = int(arch["num_attention_heads"]), int(arch.get("num_key_value_heads") or arch["num_attention_heads"])
    hd = int(arch.get("head_dim") or h // heads)
    v = int(arch["vocab_size"])
    p = "model.layers.0."
    out = [(p + "self_attn.q_proj.weight", (heads * hd, h)), (p + "self_attn.k_proj.weight", (kv * hd, h)),
           (p + "self_attn.v_proj.weight", (kv * hd, h)), (p + "self_attn.o_proj.weight", (h, heads * hd)),
           (p + "mlp.gate_proj.weight", (i, h)), (p + "mlp.up_proj.weight", (i, h)),
           (p + "mlp.down_proj.weight", (h, i)), (p + "input_layernorm.weight", (h,)),
           (p + "post_attention_layernorm.weight", (h,))]
    if arch.get("model_type") == "qwen2" or arch.get("attention_bias"):
        out += [(p + "self_attn.q_proj.bias", (heads * hd,)), (p + "self_attn.k_proj.bias", (kv * hd,)),
                (p + "self_attn.v_proj.bias", (kv * hd,))]
    out += [("model.embed_tokens.weight", (v, h)), ("model.norm.weight", (h,))]
    if not arch.get("tie_word_embeddings"):
        out.append(("lm_head.weight", (v, h)))
    return out


def _specs(arch: dict[str, Any], tp: int, rank: int) -> dict[str, Any]:
    """The :class:`ShardSpec` vLLM's layers would carry for rank ``rank`` of ``tp`` (vllm_layout's table)."""
    from esreason.backends.vllm_layout import ShardSpec

    h, i = int(arch["hidden_size"]), int(arch["intermediate_size"])
    heads, kv = int(arch["num_attention_heads"]), int(arch.get("num_key_value_heads") or arch["num_attention_heads"])
    hd = int(arch.get("head_dim") or h // heads)
    q, kvl = heads // tp * hd, max(1, kv // tp) * hd
    reps = max(1, tp // kv)
    per = -(-int(arch["vocab_size"]) // 64) * 64 // tp
    start, end = min(rank * per, int(arch["vocab_size"])), min((rank + 1) * per, int(arch["vocab_size"]))
    p = "model.layers.0."
    vocab = ShardSpec("column", rank, tp, ((start, end - start),), (True,))
    return {p + "self_attn.qkv_proj": ShardSpec("column", rank, tp, ((rank * q, q), (rank // reps * kvl, kvl),
                                                                     (rank // reps * kvl, kvl)),
                                                (True, rank % reps == 0, rank % reps == 0)),
            p + "self_attn.o_proj": ShardSpec("row", rank, tp, band=(rank * heads * hd // tp, heads * hd // tp)),
            p + "mlp.gate_up_proj": ShardSpec("column", rank, tp, ((rank * i // tp, i // tp),) * 2, (True, True)),
            p + "mlp.down_proj": ShardSpec("row", rank, tp, band=(rank * i // tp, i // tp)),
            "model.embed_tokens": vocab, "lm_head": vocab}


@lru_cache(maxsize=32)
def _layout(arch_key: str, tp: int) -> dict[str, float]:
    import json

    from esreason.backends.vllm_layout import ShardSpec, plan_slots, vllm_name

    arch = json.loads(arch_key)
    layers = int(arch["num_hidden_layers"])
    tensors = _tensors(arch)
    total = sum(math.prod(s) * (layers if n.startswith("model.layers.") else 1) for n, s in tensors)
    held = drawn = 0.0
    for rank in range(tp):
        specs = _specs(arch, tp, rank) if tp > 1 else {}
        if tp > 1:  # replicated tensors (norms) are held by every rank
            specs.update({n.rsplit(".", 1)[0]: ShardSpec("replicated", rank, tp) for n, _ in tensors
                          if n.rsplit(".", 1)[0] not in specs and vllm_name(n)[0].rsplit(".", 1)[0] not in specs})
        shapes = dict(tensors)
        slots = plan_slots(shapes, {vllm_name(n)[0]: (0,) for n in shapes}, specs)
        h = d = 0.0
        for s in slots:
            times = layers if s.hf_name.startswith("model.layers.") else 1
            if s.region is None:
                h += times * math.prod(s.shape)
                d += times * math.prod(s.shape)
            else:
                h += times * s.region.local_numel
                d += times * sum(size for _, size, _, _ in s.region.pieces())
        held, drawn = max(held, h), max(drawn, d)
    return {"params": total, "held": held, "drawn": drawn}


def layout(model: str, tp: int) -> dict[str, float]:
    """Elements per rank of a TP engine of ``model``: ``held`` (its shards: elementwise work, memory)
    and ``drawn`` (the noise blocks its shards touch: RNG work), the largest over the ranks, and
    ``params``. TP = 1: all three are the parameter count."""
    import json

    from esreason.io.architectures import architecture

    arch = architecture(model)
    return _layout(json.dumps({k: v for k, v in arch.items() if not k.startswith("_")}, sort_keys=True), int(tp))


def kv_split(model: str, tp: int) -> int:
    """How many ways the KV cache is split: min(TP, KV heads)."""
    from esreason.io.architectures import architecture

    arch = architecture(model)
    return max(1, min(int(tp), int(arch.get("num_key_value_heads") or arch["num_attention_heads"])))


def allreduce_s(ctx: Any, model: str, rows: float, tp: int) -> float:
    """Seconds of one decode step's all-reduces (2 per layer) of ``rows`` rows on a TP engine."""
    if tp <= 1:
        return 0.0
    from esreason.io.architectures import architecture

    arch = architecture(model)
    message = rows * int(arch["hidden_size"]) * 2  # bf16 hidden states of the step's rows
    link = ctx.gpu["nvlink_bytes_per_s"]
    one = ctx.note(ALLREDUCE_LATENCY) * 1e-6 + 2 * (tp - 1) / tp * message / link
    return 2 * int(arch["num_hidden_layers"]) * one


__all__ = ["ALLREDUCE_LATENCY", "allreduce_s", "kv_split", "layout", "tp_of"]
