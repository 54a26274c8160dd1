"""Parameter categories for the localisation and per-module breakdowns (paper §RQ2).

The paper reports where the largest updates sit: "LayerNorm weights and attention
projections" for ES (input-LayerNorm weights singled out; attention-projection biases
counted apart), token embeddings and the LM head for GRPO. :func:`categorize` maps a
tensor name to one of :data:`CATEGORIES` by its name components, for the Llama/Qwen
naming that HF uses (``model.layers.N.input_layernorm.weight``,
``model.layers.N.self_attn.q_proj.bias``, ``model.layers.N.mlp.up_proj.weight``, ...)
and the GPT-2/NeoX spellings where they differ. Rules, first match wins:

1. ``input_layernorm`` (or GPT-2 ``ln_1``, Llama-original ``attention_norm``) -> input_layernorm
2. any other component containing ``norm`` or named ``ln_*`` -> other_norm (post-attention,
   final norm, q/k norms)
3. embedding tables (``embed_tokens``, ``wte``, ``wpe``, ``embed_in``, ``word_embeddings``) -> embedding
4. ``lm_head`` / ``embed_out`` -> lm_head
5. inside an attention block (``self_attn``, ``attn``, ``attention``): ``.bias`` -> attn_bias,
   otherwise attn_proj
6. inside an MLP (``mlp``, ``feed_forward``, ``ffn``) -> mlp
7. anything else -> other
"""

from __future__ import annotations

CATEGORIES = ("input_layernorm", "other_norm", "attn_proj", "attn_bias", "mlp", "embedding", "lm_head", "other")

#: Roll-ups used in the paper's sentences ("normalization parameters", "attention").
GROUPS = {
    "normalization": ("input_layernorm", "other_norm"),
    "attention": ("attn_proj", "attn_bias"),
}

_EMBED = {"embed_tokens", "wte", "wpe", "embed_in", "word_embeddings", "embeddings"}
_HEAD = {"lm_head", "embed_out"}
_ATTN = {"self_attn", "attn", "attention", "self_attention", "cross_attn"}
_MLP = {"mlp", "feed_forward", "ffn"}


def categorize(name: str) -> str:
    """Category of a parameter tensor name (see module docstring for the rules)."""
    parts = name.lower().split(".")
    if any(p in ("input_layernorm", "ln_1", "attention_norm") for p in parts):
        return "input_layernorm"
    if any("norm" in p or (p.startswith("ln_") and p != "ln_1") for p in parts):
        return "other_norm"
    if any(p in _EMBED for p in parts):
        return "embedding"
    if any(p in _HEAD for p in parts):
        return "lm_head"
    if any(p in _ATTN for p in parts):
        return "attn_bias" if parts[-1] == "bias" else "attn_proj"
    if any(p in _MLP for p in parts):
        return "mlp"
    return "other"


def layer_index(name: str) -> int | None:
    """Decoder layer of a tensor (``...layers.12...`` / ``...h.12...``), or None."""
    parts = name.split(".")
    for i, p in enumerate(parts[:-1]):
        if p in ("layers", "h", "layer", "blocks") and parts[i + 1].isdigit():
            return int(parts[i + 1])
    return None
