"""The architectures of the models the shipped configs name, from JSON files in the repository.

``src/esreason/assets/models/*.json`` hold the public ``config.json`` values of each hub model
(architecture only; ``_model`` names the hub id). The memory tracer builds these models with fake
tensors (:mod:`esreason.experiments.memtrace`), so planning memory needs no hub access and no
weights. A model not listed here is read from a local directory's ``config.json`` when the
config names one.
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from esreason.errors import UserError


@lru_cache(maxsize=1)
def known() -> dict[str, dict[str, Any]]:
    """``{hub id: config dict}`` of every architecture file in the package."""
    out: dict[str, dict[str, Any]] = {}
    folder = resources.files("esreason") / "assets" / "models"
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".json"):
            data = json.loads(entry.read_text())
            out[data["_model"]] = data
    return out


def architecture(model: str) -> dict[str, Any]:
    """The ``config.json`` values of ``model``: a hub id listed in the package, or a local model
    directory. UserError naming the model otherwise."""
    table = known()
    if model in table:
        return dict(table[model])
    path = Path(model) / "config.json"
    if path.is_file():
        return json.loads(path.read_text())
    raise UserError(f"no architecture for model {model!r}: add its config.json values to "
                    f"src/esreason/assets/models/ (known: {', '.join(sorted(table))}) or pass a local model directory")


def hf_config(arch: dict[str, Any], layers: int | None = None):
    """A transformers config of ``arch`` (optionally with ``layers`` decoder layers), SDPA attention."""
    from transformers import AutoConfig

    values = {k: v for k, v in arch.items() if not k.startswith("_") and k not in ("architectures", "torch_dtype")}
    if layers is not None:
        values["num_hidden_layers"] = layers
    model_type = values.pop("model_type")
    cfg = AutoConfig.for_model(model_type, **values)
    cfg._attn_implementation = "sdpa"
    return cfg


def parameter_count(arch: dict[str, Any]) -> int:
    """Parameters of ``arch`` (tied embeddings once), from its shapes: Llama/Qwen2 decoder layers
    (Qwen2: q/k/v biases)."""
    h, i, layers = arch["hidden_size"], arch["intermediate_size"], arch["num_hidden_layers"]
    heads, kv = arch["num_attention_heads"], arch["num_key_value_heads"]
    head_dim = arch.get("head_dim") or h // heads
    vocab = arch["vocab_size"]
    attn = h * heads * head_dim + 2 * h * kv * head_dim + heads * head_dim * h
    if arch["model_type"] == "qwen2":
        attn += heads * head_dim + 2 * kv * head_dim  # q, k, v biases
    per_layer = attn + 3 * h * i + 2 * h
    embed = vocab * h * (1 if arch.get("tie_word_embeddings") else 2)
    return layers * per_layer + embed + h
