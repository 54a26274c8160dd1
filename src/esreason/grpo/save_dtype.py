"""The dtype GRPO checkpoints are written in (``checkpoint.save_dtype``).

GRPO trains on fp32 master weights (verl's FSDP mixed precision; our configs' ``dtype:
float32``), but the paper's bases are bf16 checkpoints. The weight analyses (relative drift,
max |Delta|, the ES-vs-GRPO drift ratios of paper §"What ES changes in the weights") compare a
tuned checkpoint with its base element by element; a GRPO checkpoint in fp32 sits on a
finer lattice than the bf16 base and the bf16 ES checkpoint, so its maxima would not be bf16
steps such as 2^-12 as in the paper. By default (``base``) a GRPO checkpoint is therefore
rounded once, to nearest-even, to the dtype the base model's checkpoint declares
(``config.json`` ``dtype``/``torch_dtype``; fp32 when it declares none), and config.json
states that dtype. TRL's own resume state (RUN/trl/) keeps the fp32 weights and moments,
so ``--resume`` stays exact whatever is chosen here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

SAVE_DTYPES = ("float32", "bfloat16", "float16")


def base_dtype_name(model_spec: str) -> str:
    """The dtype the base model's config.json declares ('float32' when it declares none)."""
    from transformers import AutoConfig

    from esreason.backends.hf import resolve_model_path
    from esreason.errors import UserError

    path = resolve_model_path(model_spec)
    try:
        config = AutoConfig.from_pretrained(path)
    except OSError as exc:
        raise UserError(f"cannot read the config of model {model_spec!r}: {str(exc).splitlines()[0]}") from None
    declared = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    name = str(declared).removeprefix("torch.") if declared is not None else "float32"
    if name not in SAVE_DTYPES:
        raise UserError(f"model {model_spec!r} declares dtype {name!r}; set checkpoint.save_dtype to one of "
                        f"{', '.join(SAVE_DTYPES)}")
    return name


def resolve_save_dtype(setting: str, model_spec: str) -> str:
    """``checkpoint.save_dtype`` -> a dtype name: 'base' reads the base model's declared dtype."""
    return base_dtype_name(model_spec) if setting == "base" else setting


def cast_state_dict(state_dict: Mapping[str, Any], dtype_name: str) -> dict[str, Any]:
    """Floating-point tensors cast to ``dtype_name`` (round to nearest even); others as they are.

    Tensors that share storage (tied embedding / LM head) stay one tensor after the cast, so
    ``save_pretrained`` still recognises and stores them once.
    """
    import torch

    target = getattr(torch, dtype_name)
    out: dict[str, Any] = {}
    seen: dict[tuple[int, tuple[int, ...], tuple[int, ...], torch.dtype], torch.Tensor] = {}
    for name, t in state_dict.items():
        if not (isinstance(t, torch.Tensor) and t.is_floating_point()) or t.dtype == target:
            out[name] = t
            continue
        key = (t.data_ptr(), tuple(t.shape), tuple(t.stride()), t.dtype)
        if key not in seen:
            seen[key] = t.detach().to(target)
        out[name] = seen[key]
    return out


def stamp_config_dtype(directory: str | Path, dtype_name: str) -> None:
    """Make ``directory``/config.json declare ``dtype_name`` (save_pretrained writes the model's own)."""
    path = Path(directory) / "config.json"
    config = json.loads(path.read_text())
    config["dtype"] = dtype_name
    if "torch_dtype" in config:
        config["torch_dtype"] = dtype_name
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


__all__ = ["SAVE_DTYPES", "base_dtype_name", "cast_state_dict", "resolve_save_dtype", "stamp_config_dtype"]
