"""Architecture of the embedded default: a standard ``LlamaForCausalLM``, only tiny.

Nothing here is custom modelling code: the checkpoint loads with plain
``AutoModelForCausalLM.from_pretrained`` / ``AutoTokenizer.from_pretrained`` and, with
head_dim 64 variants, with vLLM.

Why Llama and not Qwen2: transformers 5.x lists ``qwen2`` among the model types whose
hub tokenizer class it distrusts, so ``AutoTokenizer`` on a ``qwen2`` directory always
builds a ``Qwen2Tokenizer`` (byte-level BPE pre-tokenisation) over our character
vocabulary and silently drops spaces and newlines. A ``llama`` directory loads our
``tokenizer.json`` as written. ``attention_bias=True`` gives the q/k/v (and o)
projection biases that the paper's Qwen models have, so the localisation analysis has
attention biases to count.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

ASSET_DIR = Path(__file__).resolve().parent.parent / "assets" / "demo"


@dataclass(frozen=True)
class TinyArch:
    """Shape of the tiny model.

    hidden: model width.
    layers: decoder layers.
    heads: attention heads (head_dim = hidden / heads).
    kv_heads: key/value heads (grouped-query attention when < heads).
    intermediate: MLP width.
    max_positions: longest sequence (prompt + response) in tokens.
    tie_embeddings: share the input embedding and the LM head (perturbed once by ES).
    """

    hidden: int = 128
    layers: int = 4
    heads: int = 4
    kv_heads: int = 4
    intermediate: int = 384
    max_positions: int = 512
    tie_embeddings: bool = True


def build_model(tokenizer, arch: TinyArch = TinyArch(), seed: int = 0) -> LlamaForCausalLM:
    """A freshly initialised tiny Llama matching ``tokenizer`` (fp32, eval mode)."""
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=arch.hidden,
        num_hidden_layers=arch.layers,
        num_attention_heads=arch.heads,
        num_key_value_heads=arch.kv_heads,
        intermediate_size=arch.intermediate,
        max_position_embeddings=arch.max_positions,
        tie_word_embeddings=arch.tie_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        rope_theta=10000.0,
        attention_bias=True,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    return model.eval()


def demo_model_dir() -> Path:
    """Directory of the shipped embedded default (an ordinary HF model directory)."""
    return ASSET_DIR
