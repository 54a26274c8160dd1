"""Content hashes of tensors and checkpoints (dtype-, shape- and value-sensitive)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Mapping

import torch


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


def _tensor_bytes(t: torch.Tensor) -> bytes:
    t = t.detach().cpu().contiguous()
    if t.dtype in (torch.bfloat16, torch.float16):
        t = t.view(torch.int16)
    return t.numpy().tobytes()


def hash_state_dict(state: Mapping[str, torch.Tensor]) -> str:
    """sha256 over (name, dtype, shape, raw bytes) in sorted-name order."""
    h = hashlib.sha256()
    for name in sorted(state):
        t = state[name]
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(_tensor_bytes(t))
    return h.hexdigest()


def hash_directory_safetensors(directory: str | Path) -> str:
    """Hash of all tensors in a checkpoint directory's *.safetensors (file metadata ignored)."""
    from safetensors import safe_open

    files = sorted(Path(directory).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no .safetensors files in {directory}")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        with safe_open(str(f), framework="pt") as fh:
            for key in fh.keys():
                state[f"{f.name}:{key}"] = fh.get_tensor(key)
    return hash_state_dict(state)
