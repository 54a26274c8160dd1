"""Checkpoint tensors <-> the tensors ES perturbs, and reading a region of one from a safetensors file.

ES draws a direction per tensor of the model *as transformers holds it in memory*
(``named_parameters()``: :class:`~esreason.backends.hf.HFPolicy`), and a checkpoint may store a
tensor differently. For dense models the two are the same. For mixture-of-experts models,
transformers (>= 5) holds each layer's experts stacked -- ``mlp.experts.gate_up_proj``
[experts, 2 * intermediate, hidden] (gate rows first, then up) and ``mlp.experts.down_proj``
[experts, hidden, intermediate] -- while ``save_pretrained`` writes one tensor per expert and
projection (``mlp.experts.{e}.gate_proj.weight``, ``up_proj``, ``down_proj``), the layout vLLM's
loader reads. :func:`es_tensors` maps the checkpoint's names onto the stacked tensors so an engine
reading a checkpoint perturbs, checksums and exports the tensors the HF policy does; each
checkpoint tensor is one contiguous flat range (a :class:`Source`) of its ES tensor.

Covered: Qwen2-MoE / Qwen3-MoE naming (``experts.{e}.{gate,up,down}_proj.weight``). Other
expert layouts (Mixtral's ``block_sparse_moe.experts.{e}.w1``) keep their checkpoint names, so
an engine refuses them where its names do not match the served model's (vllm_layout.plan_slots).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import torch

from esreason.es.region import Region

_EXPERT = re.compile(r"^(?P<prefix>.+\.experts)\.(?P<e>\d+)\.(?P<proj>gate_proj|up_proj|down_proj)\.weight$")


@dataclass(frozen=True)
class Source:
    """Checkpoint tensor ``key`` (shape ``shape``) = flat elements [offset, offset + numel) of its ES tensor."""

    key: str
    offset: int
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class ESTensor:
    """One tensor ES perturbs: its in-memory shape and the checkpoint tensors it is stored as."""

    name: str
    shape: tuple[int, ...]
    sources: tuple[Source, ...]

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def plain(self) -> bool:
        """Stored as itself (one checkpoint tensor of the same name)."""
        return len(self.sources) == 1 and self.sources[0].key == self.name


def es_tensors(ckpt_shapes: Mapping[str, Sequence[int]]) -> dict[str, ESTensor]:
    """The ES tensors of a checkpoint's tensors (name -> shape), in name order (module docstring)."""
    out: dict[str, ESTensor] = {}
    experts: dict[str, dict[int, dict[str, tuple[str, tuple[int, ...]]]]] = {}
    for key, shape in ckpt_shapes.items():
        m = _EXPERT.match(key)
        if m is None:
            out[key] = ESTensor(key, tuple(int(d) for d in shape), (Source(key, 0, tuple(int(d) for d in shape)),))
            continue
        experts.setdefault(m["prefix"], {}).setdefault(int(m["e"]), {})[m["proj"]] = (key, tuple(int(d) for d in shape))
    for prefix, by_expert in experts.items():
        count = len(by_expert)
        if sorted(by_expert) != list(range(count)) or any(len(p) != 3 for p in by_expert.values()):
            raise ValueError(f"experts of {prefix!r} are incomplete: each of experts 0..{count - 1} needs "
                             "gate_proj, up_proj and down_proj")
        (_, (inter, hidden)), (_, down) = by_expert[0]["gate_proj"], by_expert[0]["down_proj"]
        gate_up, down_sources = [], []
        for e in range(count):
            parts = by_expert[e]
            if parts["gate_proj"][1] != (inter, hidden) or parts["up_proj"][1] != (inter, hidden) or \
                    parts["down_proj"][1] != (hidden, inter):
                raise ValueError(f"expert {e} of {prefix!r} has shapes that differ from expert 0's")
            gate_up += [Source(parts["gate_proj"][0], e * 2 * inter * hidden, (inter, hidden)),
                        Source(parts["up_proj"][0], (e * 2 + 1) * inter * hidden, (inter, hidden))]
            down_sources.append(Source(parts["down_proj"][0], e * hidden * inter, tuple(down)))
        out[f"{prefix}.gate_up_proj"] = ESTensor(f"{prefix}.gate_up_proj", (count, 2 * inter, hidden), tuple(gate_up))
        out[f"{prefix}.down_proj"] = ESTensor(f"{prefix}.down_proj", (count, hidden, inter), tuple(down_sources))
    return dict(sorted(out.items()))


def read_region(path: str | Path, tensor: ESTensor, region: Region | None) -> torch.Tensor:
    """``region`` of ES tensor ``tensor`` (None: all of it) read from safetensors file ``path``.

    Returns the local elements flat ([region.local_numel], the file's dtype). A region lies in one
    source (an expert's band never crosses into another projection); only its rows are read
    (``get_slice``: the rest of the file is not touched). The whole tensor concatenates its sources.
    The file is opened per call: safetensors' tensors are views of its memory map, whose touched
    pages count in the process's resident memory until the file is closed, so one file kept open
    while an engine loads would hold every tensor it served (tests/test_engine_host_memory.py).
    """
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        if region is None or region.is_whole:
            parts = [f.get_tensor(s.key).reshape(-1) for s in tensor.sources]
            return parts[0] if len(parts) == 1 else torch.cat(parts)
        first, last = region.full_index(0), region.full_index(region.local_numel - 1)
        source = next((s for s in tensor.sources if s.offset <= first and last < s.offset + s.numel), None)
        shift = None if source is None else source.offset - region.offset
        if source is None or shift % region.width or (source.numel % region.width):
            raise ValueError(f"region {region} of {tensor.name!r} does not lie in one row-aligned checkpoint tensor")
        r0, r1 = region.rows[0] - shift // region.width, region.rows[1] - shift // region.width
        sl = f.get_slice(source.key)
        if len(source.shape) == 1:  # a bias: width 1
            return sl[r0:r1].reshape(-1)
        rows = source.numel // region.width
        if tuple(source.shape) != (rows, region.width):
            raise ValueError(f"checkpoint tensor {source.key!r} of shape {source.shape} is not a matrix of rows "
                             f"of {region.width}")
        return sl[r0:r1, region.cols[0]:region.cols[1]].reshape(-1)


def scatter_region(full: torch.Tensor, region: Region | None, local: torch.Tensor) -> None:
    """full (flat, the whole ES tensor) <- local elements of ``region`` (the inverse of taking them)."""
    if region is None or region.is_whole:
        full.copy_(local.reshape(-1))
        return
    r1, w = region.rows[1], region.width
    matrix = full[region.offset:region.offset + r1 * w].view(r1, w)  # rows 0..r1 of the region's matrix view
    matrix[region.rows[0]:r1, region.cols[0]:region.cols[1]].copy_(local.view(region.local_rows, region.local_cols))


def take_region(full: torch.Tensor, region: Region | None) -> torch.Tensor:
    """The local elements of ``region`` out of the whole ES tensor ``full``, flat and contiguous."""
    flat = full.reshape(-1)
    if region is None or region.is_whole:
        return flat
    r1, w = region.rows[1], region.width
    matrix = flat[region.offset:region.offset + r1 * w].view(r1, w)
    return matrix[region.rows[0]:r1, region.cols[0]:region.cols[1]].reshape(-1)
