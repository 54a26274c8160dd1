"""Merge a tensor-parallel engine's per-rank exports into one Hugging Face checkpoint.

Each rank of an engine whose ranks hold shards (or whose model stores its ES tensors differently
in the checkpoint: stacked experts) writes its slots, by slot key, to ``es-rank{r}.safetensors``
(and its fp32 masters to ``es-rank{r}.master.safetensors``; :meth:`ESWorkerExtension.es_export`).
:func:`merge_rank_exports` rebuilds every ES tensor from the ranks' regions (a replicated tensor
is taken from the first rank that has it), cuts it into the checkpoint's tensors
(:mod:`esreason.backends.ckpt_layout`) and streams them into ``model.safetensors`` in name order
(the bytes :meth:`HFPolicy.save` writes) -- the ES tensors of one layer's experts, or one dense
tensor, in host memory at a time -- then the masters into ``es_master/master.safetensors`` by ES name, as
:meth:`HFPolicy.save` writes them. The rank files are removed.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from esreason.backends.ckpt_layout import scatter_region
from esreason.backends.hf import MASTER_FILE
from esreason.backends.tp_checksum import layout_slots
from esreason.io.safetensors_stream import ST_DTYPES, SafetensorsStreamWriter

WEIGHTS_FILE = "model.safetensors"
RANK_FILE = "es-rank{rank}.safetensors"
RANK_MASTER_FILE = "es-rank{rank}.master.safetensors"


def _dtype(path: Path, key: str) -> str:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        return str(f.get_slice(key).get_dtype())


def _assemble(name: str, shape: Sequence[int], dtype: str, files: Sequence[Path],
              ranks: Sequence[list]) -> torch.Tensor:
    """ES tensor ``name`` ([numel], ``dtype``) from the ranks' files; every element must be covered."""
    from safetensors import safe_open

    numel = math.prod(shape)
    full = torch.empty(numel, dtype=ST_DTYPES[dtype])
    done: set[str] = set()
    covered = 0
    for path, slots in zip(files, ranks):
        mine = [s for s in slots if s.hf_name == name and s.key not in done]
        if not mine:
            continue
        with safe_open(str(path), framework="pt") as f:  # opened per tensor: its mapped pages are released after
            for s in mine:
                scatter_region(full, s.region, f.get_tensor(s.key))
                done.add(s.key)
                covered += numel if s.region is None else s.region.local_numel
    if covered != numel:
        raise RuntimeError(f"tensor-parallel export: the ranks hold {covered} of the {numel} elements of {name!r}")
    return full


def merge_rank_exports(directory: str | Path, layouts: Sequence[Mapping[str, Any]]) -> list[str]:
    """Merge ``directory``'s rank files (``layouts``: one ``es_layout`` per rank, rank order) into the
    checkpoint files; returns their names."""
    out = Path(directory)
    tensors = layouts[0]["tensors"]
    ranks = [layout_slots(layout) for layout in layouts]
    files = [out / RANK_FILE.format(rank=r) for r in range(len(layouts))]
    first = {}
    for path, slots in zip(files, ranks):
        for s in slots:
            first.setdefault(s.hf_name, (path, s.key))
    dtype = {n: _dtype(*first[n]) for n in tensors}
    # checkpoint tensors in name order, as safetensors' own writer stores one dtype (the same bytes
    # as HFPolicy.save); an ES tensor is assembled once and dropped after its last checkpoint tensor
    order = sorted((key, n, offset, tuple(kshape)) for n in tensors for key, offset, kshape in tensors[n][1])
    last = {n: i for i, (_, n, _, _) in enumerate(order)}
    writer = SafetensorsStreamWriter(out / WEIGHTS_FILE, [(key, dtype[n], kshape) for key, n, _, kshape in order])
    held: dict[str, torch.Tensor] = {}
    try:
        for i, (key, n, offset, kshape) in enumerate(order):
            if n not in held:
                held[n] = _assemble(n, tensors[n][0], dtype[n], files, ranks)
            writer.write(key, held[n][offset:offset + math.prod(kshape)])
            if last[n] == i:
                del held[n]
    except BaseException:
        writer.abort()
        raise
    writer.close()
    written = [WEIGHTS_FILE]
    masters = [out / RANK_MASTER_FILE.format(rank=r) for r in range(len(layouts))]
    if layouts[0].get("master"):
        (out / MASTER_FILE).parent.mkdir(parents=True, exist_ok=True)
        writer = SafetensorsStreamWriter(out / MASTER_FILE, [(n, "F32", tuple(tensors[n][0])) for n in sorted(tensors)])
        try:
            for n in sorted(tensors):
                writer.write(n, _assemble(n, tensors[n][0], "F32", masters, ranks))
        except BaseException:
            writer.abort()
            raise
        writer.close()
        written.append(MASTER_FILE)
    for path in files + masters:
        path.unlink(missing_ok=True)
    return written
