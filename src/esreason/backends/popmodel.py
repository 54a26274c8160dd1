"""Population forward: many perturbed copies of one Llama/Qwen2 causal LM in one batched call.

ES evaluates N members theta_i = centre + sigma_i * eps(seed_i) on the same prompts
(paper appendix "Implementation Procedure", step 3). For a small model one member's
forward is dominated by per-call overhead, so here every weight tensor is *stacked* over
members ([P, *shape]) and every linear layer is one ``baddbmm`` over the P members.

Exactness. The stacked member weights are copied out of the model while the ES policy
holds each member (``HFPolicy.perturb(seed, sigma)`` ... ``restore()``), so they are
bit-identical to what sequential evaluation uses, whatever the perturbation mode. The forward re-uses the model's own pieces where they carry
numerics (its rotary-embedding module, ``apply_rotary_pos_emb``, its attention function
and mask function from transformers' registries, its activation) and mirrors the rest
(RMSNorm, residuals) operation for operation. ``baddbmm`` over members gives, per member,
the same bits as ``F.linear`` on that member's rows (measured on CPU, fp32, MKL), so the
logits equal the sequential ones as long as each member's GEMM has a row count in the
same kernel class as the sequential sampler's (see ``EXACT_ROWS_BELOW`` in
:mod:`esreason.backends.batched`).

Supported: ``LlamaForCausalLM`` and ``Qwen2ForCausalLM`` (same structure; Qwen2 has q/k/v
biases) with full attention, any GQA ratio, tied or untied LM head, ``sdpa`` or ``eager``
attention, rope types without a per-batch dynamic update. Anything else raises
:class:`~esreason.errors.UserError` from :func:`check_supported`.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from esreason.backends.kvcache import grown, window
from esreason.errors import UserError
from esreason.es.params import unique_named_parameters

SUPPORTED_MODEL_TYPES = ("llama", "qwen2")
SUPPORTED_ATTENTION = ("sdpa", "eager", "esreason_cpu")  # the last: esreason.backends.cpu_attention
# rope types whose inv_freq depends on the batch's positions (dynamic_rope_update): the
# population batch would see different positions than a sequential batch.
_DYNAMIC_ROPE = ("dynamic", "longrope")


def check_supported(model: Any) -> None:
    """Raise UserError (naming ``model``) unless the population forward reproduces ``model``."""
    config = getattr(model, "config", None)
    mtype = getattr(config, "model_type", None)
    if mtype not in SUPPORTED_MODEL_TYPES:
        raise UserError(f"config key 'model': backend.type 'batched' supports model types "
                        f"{', '.join(SUPPORTED_MODEL_TYPES)}; this model is {mtype!r} "
                        "(use backend.type: hf)")
    impl = getattr(config, "_attn_implementation", None) or "eager"
    if impl not in SUPPORTED_ATTENTION:
        raise UserError(f"config key 'model': backend.type 'batched' supports attention "
                        f"{', '.join(SUPPORTED_ATTENTION)}; this model uses {impl!r}")
    layer_types = getattr(config, "layer_types", None) or []
    if getattr(config, "use_sliding_window", False) or any(t != "full_attention" for t in layer_types):
        raise UserError("config key 'model': backend.type 'batched' needs full attention in every layer "
                        "(sliding-window layers found)")
    rope = (getattr(config, "rope_parameters", None) or {}).get("rope_type", "default")
    if rope in _DYNAMIC_ROPE:
        raise UserError(f"config key 'model': backend.type 'batched' does not support rope_type {rope!r}")
    if getattr(config, "pretraining_tp", 1) not in (None, 1):
        raise UserError("config key 'model': backend.type 'batched' needs pretraining_tp == 1")
    inner = getattr(model, "model", None)
    if inner is None or not hasattr(inner, "layers") or not hasattr(model, "lm_head"):
        raise UserError(f"config key 'model': {type(model).__name__} does not have the "
                        "Llama layout (model.layers, lm_head) the batched backend needs")


@dataclass(frozen=True)
class LayerNames:
    """Stable parameter names (``unique_named_parameters``) of one decoder layer; None = no bias."""

    input_norm: str
    q: str
    q_b: str | None
    k: str
    k_b: str | None
    v: str
    v_b: str | None
    o: str
    o_b: str | None
    post_norm: str
    gate: str
    gate_b: str | None
    up: str
    up_b: str | None
    down: str
    down_b: str | None


def linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """Per-member linear layer: x [P, R, in], w [P, out, in], b [P, out] | None -> [P, R, out].

    ``baddbmm(bias, x, w^T)`` has the same per-member bits as ``F.linear(x_p, w_p, b_p)``
    (which lowers to ``addmm``) on CPU fp32; measured in tests/test_batched.py end to end.
    """
    wt = w.transpose(1, 2)  # [P, in, out] view
    if b is None:
        return torch.bmm(x, wt)
    return torch.baddbmm(b.unsqueeze(1), x, wt)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """LlamaRMSNorm with a per-member weight: x [P, R, D], weight [P, D] -> [P, R, D] (same op order as HF)."""
    dtype = x.dtype
    h = x.to(torch.float32)
    var = h.pow(2).mean(-1, keepdim=True)  # [P, R, 1]
    h = h * torch.rsqrt(var + eps)
    return weight.unsqueeze(1) * h.to(dtype)


class PopulationKV:
    """Key/value buffers of one population block: per layer [rows, kv_heads, width, head_dim].

    ``rows`` = member positions x slots per member, flattened member-major. Kept like
    :class:`esreason.backends.kvcache.PreallocatedLayer`: contiguous buffers written in place and
    widened to :func:`esreason.backends.kvcache.window` of the positions written, attention over the
    whole width (the mask hides the zeros past the written positions), so a member's rows see the
    widths and masks the sequential sampler's rows see.
    """

    def __init__(self, layers: int, rows: int, kv_heads: int, capacity: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device) -> None:
        shape = (rows, kv_heads, 0, head_dim)  # widened by the first update
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.capacity = capacity

    @property
    def width(self) -> int:
        return int(self.keys[0].shape[-2]) if self.keys else 0

    def width_for(self, end: int) -> int:
        """The width attention reads once ``end`` positions are written (the mask's kv length)."""
        return window(end, self.capacity)

    def _widen(self, layer: int, length: int, width: int) -> None:
        if self.keys[layer].shape[-2] < width:
            self.keys[layer] = grown(self.keys[layer], length, width)
            self.values[layer] = grown(self.values[layer], length, width)

    def update(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor, rows: int,
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write k, v [rows, Hkv, T, d] at positions start..start+T of the first ``rows`` rows; return the
        [rows, Hkv, width, d] buffers (contiguous: a prefix of the rows)."""
        end = start + k.shape[-2]
        self._widen(layer, start, self.width_for(end))
        kb, vb = self.keys[layer], self.values[layer]
        kb[:rows, :, start:end] = k
        vb[:rows, :, start:end] = v
        return kb[:rows], vb[:rows]

    def copy_rows(self, dst: torch.Tensor, src_kv: "PopulationKV", src: torch.Tensor, length: int) -> None:
        """self rows ``dst`` <- ``src_kv`` rows ``src`` (LongTensors of equal length), all layers; the first
        ``length`` positions are valid in ``src_kv``."""
        for layer in range(len(self.keys)):
            w = src_kv.keys[layer].shape[-2]
            self._widen(layer, length, w)
            self.keys[layer][dst, :, :w] = src_kv.keys[layer][src, :, :w]
            self.values[layer][dst, :, :w] = src_kv.values[layer][src, :, :w]

    def gathered(self, rows: torch.Tensor, length: int) -> "PopulationKV":
        """A new cache holding rows ``rows`` (LongTensor) of this one, in that order (one contiguous gather
        per buffer; ``length`` positions are valid)."""
        out = object.__new__(PopulationKV)
        out.capacity = self.capacity
        out.keys = [buf.index_select(0, rows) for buf in self.keys]
        out.values = [buf.index_select(0, rows) for buf in self.values]
        return out


class PopulationModel:
    """The population forward of one HF model whose *current* weights are the ES centre.

    model: a supported causal LM (:func:`check_supported`). Its parameters are read at every
    :meth:`member_weights` call, so updates applied to the model in place are seen.
    """

    def __init__(self, model: Any) -> None:
        check_supported(model)
        self.model = model
        self.config = model.config
        self.params = unique_named_parameters(model)
        name_of = {id(p): n for n, p in self.params}
        used: set[str] = set()

        def nm(t: torch.Tensor | None) -> str | None:
            if t is None:
                return None
            name = name_of[id(t)]
            used.add(name)
            return name

        inner = model.model
        self.embed = nm(inner.embed_tokens.weight)
        self.final_norm = nm(inner.norm.weight)
        self.lm_head = nm(model.lm_head.weight)
        self.lm_head_b = nm(getattr(model.lm_head, "bias", None))
        self.layers: list[LayerNames] = []
        for layer in inner.layers:
            a, m = layer.self_attn, layer.mlp
            self.layers.append(LayerNames(
                input_norm=nm(layer.input_layernorm.weight), post_norm=nm(layer.post_attention_layernorm.weight),
                q=nm(a.q_proj.weight), q_b=nm(a.q_proj.bias), k=nm(a.k_proj.weight), k_b=nm(a.k_proj.bias),
                v=nm(a.v_proj.weight), v_b=nm(a.v_proj.bias), o=nm(a.o_proj.weight), o_b=nm(a.o_proj.bias),
                gate=nm(m.gate_proj.weight), gate_b=nm(m.gate_proj.bias), up=nm(m.up_proj.weight),
                up_b=nm(m.up_proj.bias), down=nm(m.down_proj.weight), down_b=nm(m.down_proj.bias)))
        missing = [n for n, _ in self.params if n not in used]
        if missing:
            raise UserError(f"config key 'model': parameters the batched forward does not know: {missing[:3]}")
        self.attn_modules = [layer.self_attn for layer in inner.layers]
        self.norm_eps = [(layer.input_layernorm.variance_epsilon, layer.post_attention_layernorm.variance_epsilon)
                         for layer in inner.layers]
        self.final_eps = inner.norm.variance_epsilon
        self.act: Callable[[torch.Tensor], torch.Tensor] = inner.layers[0].mlp.act_fn
        self.rotary = inner.rotary_emb
        self.apply_rope = sys.modules[type(self.attn_modules[0]).__module__].apply_rotary_pos_emb
        self.head_dim = int(self.attn_modules[0].head_dim)
        self.kv_heads = int(self.config.num_key_value_heads)
        self._set_attention()

    def _set_attention(self) -> None:
        from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, causal_mask_function
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        impl = self.config._attn_implementation or "eager"
        module = sys.modules[type(self.attn_modules[0]).__module__]
        self.attn_fn = ALL_ATTENTION_FUNCTIONS.get_interface(impl, module.eager_attention_forward)
        self.mask_fn = ALL_MASK_ATTENTION_FUNCTIONS[impl]
        self.causal = causal_mask_function

    @property
    def dtype(self) -> torch.dtype:
        return self.params[0][1].dtype

    @property
    def device(self) -> torch.device:
        return self.params[0][1].device

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @torch.no_grad()
    def stack_members(self, policy: Any, seeds: Sequence[int], sigmas: Sequence[float]) -> dict[str, torch.Tensor]:
        """name -> [P, *shape]: member p's weights exactly as ``policy.perturb(seeds[p], sigmas[p])`` sets them.

        The policy itself perturbs (and restores) the model once per member and the result is
        copied out, so the stacked weights are bit-identical to sequential evaluation in every
        perturbation mode the policy has (dense or low-rank directions, fp32 masters, and even
        ``restore: subtract``, whose drift then accumulates in the same member order), and the
        policy's direction cache is filled for the update exactly as in sequential evaluation.
        """
        out = {name: torch.empty((len(seeds), *p.shape), dtype=p.dtype, device=p.device) for name, p in self.params}
        for i, (seed, sigma) in enumerate(zip(seeds, sigmas)):
            policy.perturb(int(seed), float(sigma))
            try:
                for name, p in self.params:
                    out[name][i].copy_(p.detach())
            finally:
                policy.restore()
        return out

    # ------------------------------------------------------------------ forward

    def new_cache(self, rows: int, capacity: int) -> PopulationKV:
        return PopulationKV(self.num_layers, rows, self.kv_heads, capacity, self.head_dim, self.dtype, self.device)

    @torch.inference_mode()
    def forward(self, w: dict[str, torch.Tensor], ids: torch.Tensor, pos: torch.Tensor, mask2d: torch.Tensor,
                cache: PopulationKV, past: int) -> torch.Tensor:
        """Logits at the last input position of every row.

        w: name -> [P, *shape] member weights (P = ids.shape[0]).
        ids, pos: [P, M, T] token ids and position ids (M slots per member, T new tokens).
        mask2d: [P*M, past+T] bool, True on real tokens (padding False).
        cache: KV buffers with at least P*M rows; rows 0..P*M-1 are used, positions 0..past-1 hold the past.
        Returns [P, M, V] logits in the model dtype.
        """
        n, m, t = ids.shape
        rows = n * m
        idx = torch.arange(n, device=ids.device).unsqueeze(1)  # [P, 1]
        h = w[self.embed][idx, ids.reshape(n, m * t)]  # [P, M*T, D] embedding rows
        pos_rows = pos.reshape(rows, t)  # [R, T]
        cos, sin = self.rotary(h, pos_rows)  # [R, T, d] each
        width = cache.width_for(past + t)  # the kv length attention reads (zeros past past+T are masked)
        attn_mask = self.mask_fn(batch_size=rows, q_length=t, kv_length=width, q_offset=past, kv_offset=0,
                                 mask_function=self.causal, attention_mask=mask2d, allow_is_causal_skip=True,
                                 dtype=h.dtype, config=self.config, use_vmap=False, device=h.device)
        hd = self.head_dim
        for li, names in enumerate(self.layers):
            eps_in, eps_post = self.norm_eps[li]
            module = self.attn_modules[li]
            x = rms_norm(h, w[names.input_norm], eps_in)  # [P, M*T, D]
            q = linear(x, w[names.q], _b(w, names.q_b)).view(rows, t, -1, hd).transpose(1, 2)  # [R, H, T, d]
            k = linear(x, w[names.k], _b(w, names.k_b)).view(rows, t, -1, hd).transpose(1, 2)  # [R, Hkv, T, d]
            v = linear(x, w[names.v], _b(w, names.v_b)).view(rows, t, -1, hd).transpose(1, 2)  # [R, Hkv, T, d]
            q, k = self.apply_rope(q, k, cos, sin)
            k_all, v_all = cache.update(li, past, k, v, rows)  # [R, Hkv, width >= past+T, d]
            o, _ = self.attn_fn(module, q, k_all, v_all, attn_mask, dropout=0.0, scaling=module.scaling)
            o = o.reshape(n, m * t, -1)  # [R, T, H, d] -> [P, M*T, H*d]
            h = h + linear(o, w[names.o], _b(w, names.o_b))
            x = rms_norm(h, w[names.post_norm], eps_post)
            g = self.act(linear(x, w[names.gate], _b(w, names.gate_b)))  # [P, M*T, I]
            u = linear(x, w[names.up], _b(w, names.up_b))
            h = h + linear(g * u, w[names.down], _b(w, names.down_b))
        last = h.view(n, m, t, -1)[:, :, -1]  # [P, M, D]
        last = rms_norm(last, w[self.final_norm], self.final_eps)
        return linear(last, w[self.lm_head], _b(w, self.lm_head_b))  # [P, M, V]


def _b(w: dict[str, torch.Tensor], name: str | None) -> torch.Tensor | None:
    return None if name is None else w[name]
