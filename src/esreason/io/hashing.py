"""Content hashes of files, tensors and checkpoints (name-, dtype-, shape- and value-sensitive).

Used for the manifest's model hash, for "same config + same seed => same weights" checks
and for engine-consistency checksums (DESIGN §3, §5). A tensor hash covers the exact bytes,
so two checkpoints hash equal iff every named tensor is bit-identical.
"""

from __future__ import annotations

import contextlib
import hashlib
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Mapping

from esreason.errors import UserError

if TYPE_CHECKING:  # torch is imported lazily so `import esreason.io` stays light (CLI start-up)
    import torch


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file's bytes, read in ``chunk``-byte blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


def _update_tensor(h: "hashlib._Hash", name: str, t: torch.Tensor) -> None:
    """Feed one named tensor: a length-prefixed header, then its raw little-endian bytes.

    The header (name length, name, dtype, shape, byte count) makes the stream unambiguous, so
    a renamed, re-typed or reshaped tensor never hashes like the original. Bytes are taken
    through a flat ``uint8`` view, which covers every dtype (bf16/fp16 give the same bytes as
    the ``.view(torch.int16)`` route; fp8 and bool work too) without a numpy dtype for it.
    """
    import torch

    if not isinstance(t, torch.Tensor):
        raise TypeError(f"state_dict[{name!r}] is a {type(t).__name__}, not a tensor")
    if t.is_sparse or t.is_quantized or t.device.type == "meta":
        raise TypeError(f"state_dict[{name!r}]: cannot hash a {t.layout}/{t.device.type} tensor")
    flat = t.detach().to("cpu").contiguous().reshape(-1)      # [numel], same dtype
    raw = flat.view(torch.uint8)                                 # [numel * element_size]
    h.update(f"{len(name)}:{name}|{t.dtype}|{tuple(t.shape)}|{raw.numel()}\n".encode())
    h.update(raw.numpy().data)                                   # buffer, no extra copy


def _hash_items(items: Iterable[tuple[str, torch.Tensor]]) -> str:
    h = hashlib.sha256()
    for name, t in items:
        _update_tensor(h, name, t)
    return h.hexdigest()


def hash_state_dict(state_dict: Mapping[str, torch.Tensor]) -> str:
    """Hex sha256 over (name, dtype, shape, raw bytes) of every tensor, in sorted-name order.

    Independent of insertion order and device; sensitive to any change of name, dtype,
    shape or a single bit of value.
    """
    return _hash_items((name, state_dict[name]) for name in sorted(state_dict))


def hash_directory_safetensors(directory: str | Path) -> str:
    """:func:`hash_state_dict` of all tensors stored in ``directory/*.safetensors``.

    Tensors are keyed by name only, so the result does not depend on the files' metadata,
    on tensor order inside a file, or on how the checkpoint is sharded; it equals
    ``hash_state_dict`` of the same tensors in memory. Tensors are loaded one at a time
    (memory ~ the largest tensor). Raises :class:`UserError` when the directory has no
    ``*.safetensors`` file or a tensor name occurs in two shards.
    """
    from safetensors import safe_open

    directory = Path(directory)
    files = sorted(directory.glob("*.safetensors")) if directory.is_dir() else []
    if not files:
        raise UserError(f"{directory}: no *.safetensors files to hash")
    with contextlib.ExitStack() as stack:
        handles = [stack.enter_context(safe_open(str(f), framework="pt")) for f in files]
        owner: dict[str, int] = {}
        for i, fh in enumerate(handles):
            for key in fh.keys():
                if key in owner:
                    raise UserError(f"{directory}: tensor {key!r} is stored in both "
                                    f"{files[owner[key]].name} and {files[i].name}")
                owner[key] = i
        return _hash_items((key, handles[owner[key]].get_tensor(key)) for key in sorted(owner))


__all__ = ["hash_directory_safetensors", "hash_state_dict", "sha256_file"]
