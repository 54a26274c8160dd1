"""Where each ES tensor lives in a vLLM worker's parameters, tensor parallel or not.

vLLM fuses q/k/v into ``qkv_proj``, gate/up into ``gate_up_proj`` and a MoE layer's experts into
``w13_weight`` [experts, 2 * intermediate, hidden] / ``w2_weight`` [experts, hidden, intermediate];
it pads the vocabulary rows of the embedding / LM head. With tensor parallelism (TP) each worker
(rank) holds a shard of most of them:

==========================  ==================================================  ==================
vLLM layer                  what rank r of TP holds                             Region (es/region)
==========================  ==================================================  ==================
QKVParallelLinear           heads r*h/TP..: rows of q, and of k and v (a k/v     band of rows
                            head is replicated on TP / kv_heads ranks)
MergedColumnParallelLinear  rows r*n/TP.. of gate and of up                     band of rows
ColumnParallelLinear        rows r*n/TP..                                       band of rows
RowParallelLinear           columns r*n/TP.. of the weight (bias replicated)    band of columns
VocabParallelEmbedding /    vocabulary rows [start, end) (padded per rank)      band of rows
ParallelLMHead
experts (w13 / w2)          per expert: rows r*I/TP.. of gate and of up (w13),  per expert band
                            columns r*I/TP.. of down (w2)
anything else (norms,       all of it, on every rank                            whole
router, ReplicatedLinear)
==========================  ==================================================  ==================

:func:`module_spec` reads this from the layer's own attributes (``tp_rank``, ``tp_size``,
``num_heads``, ``shard_indices``, ``intermediate_size_per_partition``: duck typing, vLLM is not
imported here) and :func:`plan_slots` turns it into :class:`Slot` s: an ES tensor's region (None:
all of it) and the rows of the rank's vLLM parameter that hold it. A replicated tensor is
*owned* by rank 0 only (so an update's norm counts it once).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from esreason.es.region import Region

#: HF projection -> (vLLM fused projection, position of its rows in the fused tensor).
_FUSED = {"q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2),
          "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1)}
_FUSED_RE = re.compile(r"\.(q_proj|k_proj|v_proj|gate_proj|up_proj)\.")
#: transformers' stacked experts -> vLLM's fused expert weights.
_EXPERTS = {".experts.gate_up_proj": ".experts.w13_weight", ".experts.down_proj": ".experts.w2_weight"}


def vllm_name(hf_name: str) -> tuple[str, int]:
    """The vLLM parameter holding HF parameter ``hf_name`` and the position of its block."""
    for hf, vl in _EXPERTS.items():
        if hf_name.endswith(hf):
            return hf_name[:-len(hf)] + vl, 0
    m = _FUSED_RE.search(hf_name)
    if m is None:
        return hf_name, 0
    fused, pos = _FUSED[m.group(1)]
    return hf_name[:m.start()] + f".{fused}." + hf_name[m.end():], pos


def _resolve(target: str, vllm_shapes: Mapping[str, Any]) -> str:
    """vLLM 0.32 keeps a MoE layer's expert weights one module deeper (``experts.routed_experts.w13_weight``)."""
    if target in vllm_shapes:
        return target
    for vl in _EXPERTS.values():
        if target.endswith(vl):
            deeper = target[:-len(vl)] + ".experts.routed_experts." + vl.rsplit(".", 1)[1]
            if deeper in vllm_shapes:
                return deeper
    return target


@dataclass(frozen=True)
class ShardSpec:
    """How one vLLM layer is split over the TP ranks, for rank ``rank`` of ``size`` (module docstring).

    kind: replicated, column (qkv / merged / plain: ``bands``), row (``band`` of input columns),
    vocab (``bands[0]``), experts (``band`` of the intermediate dimension).
    bands: per fused position, (first HF row held, rows held). owners: per position, whether this
    rank counts it in norms (k/v heads replicated over ranks are counted once).
    """

    kind: str = "replicated"
    rank: int = 0
    size: int = 1
    bands: tuple[tuple[int, int], ...] = ()
    owners: tuple[bool, ...] = ()
    band: tuple[int, int] = (0, 0)


def module_spec(mod: Any, engine_rank: int, engine_size: int) -> ShardSpec:
    """The :class:`ShardSpec` of a vLLM layer from its attributes (see the module docstring)."""
    names = {c.__name__ for c in type(mod).__mro__}
    rank, size = int(getattr(mod, "tp_rank", engine_rank)), int(getattr(mod, "tp_size", 1))
    if hasattr(mod, "w13_weight"):  # a fused-experts layer
        cfg = getattr(getattr(mod, "moe_config", None), "moe_parallel_config", None)
        rank = int(getattr(cfg, "tp_rank", engine_rank))
        size = int(getattr(cfg, "tp_size", engine_size))
        if bool(getattr(mod, "use_ep", False)):
            raise ValueError("ES engines do not support expert parallelism (experts split over ranks)")
        inter = int(mod.intermediate_size_per_partition)
        return ShardSpec("experts", rank, size, band=(rank * inter, inter))
    if size <= 1:
        return ShardSpec("replicated", engine_rank, engine_size)
    if "QKVParallelLinear" in names:
        q, kv = mod.num_heads * mod.head_size, mod.num_kv_heads * mod.head_size
        v = mod.num_kv_heads * getattr(mod, "v_head_size", mod.head_size)
        reps = int(getattr(mod, "num_kv_head_replicas", 1))
        kr = rank // reps
        return ShardSpec("column", rank, size, ((rank * q, q), (kr * kv, kv), (kr * v, v)),
                         (True, rank % reps == 0, rank % reps == 0))
    if "MergedColumnParallelLinear" in names:
        parts = [int(o) // size for o in mod.output_sizes]
        return ShardSpec("column", rank, size, tuple((rank * n, n) for n in parts), (True,) * len(parts))
    if "ColumnParallelLinear" in names:
        n = int(mod.output_size_per_partition)
        return ShardSpec("column", rank, size, ((rank * n, n),), (True,))
    if "RowParallelLinear" in names:
        n = int(mod.input_size_per_partition)
        return ShardSpec("row", rank, size, band=(rank * n, n))
    if "VocabParallelEmbedding" in names:
        idx = mod.shard_indices
        start, end = int(idx.org_vocab_start_index), int(idx.org_vocab_end_index)
        return ShardSpec("column", rank, size, ((start, end - start),), (True,))
    return ShardSpec("replicated", engine_rank, engine_size)


@dataclass(frozen=True)
class Slot:
    """ES tensor ``hf_name`` (full shape ``shape``), or its ``region`` (None: all of it), held in rows
    [start, stop) of vLLM parameter ``vllm_name`` (of expert ``expert`` when the parameter stacks
    experts). ``owner``: this rank counts the slot in norms (replicas are counted once)."""

    hf_name: str
    vllm_name: str
    start: int
    shape: tuple[int, ...]
    region: Region | None = None
    expert: int | None = None
    owner: bool = True

    @property
    def local_rows(self) -> int:
        return self.shape[0] if self.region is None else self.region.local_rows

    @property
    def stop(self) -> int:
        return self.start + self.local_rows

    @property
    def local_trailing(self) -> tuple[int, ...]:
        """The trailing dims of the vLLM parameter rows that hold the slot."""
        if self.region is None:
            return tuple(self.shape[1:])
        return () if len(self.shape) == 1 else (self.region.local_cols,)

    @property
    def key(self) -> str:
        """A name unique per slot and rank-independent: the ES name, plus the region when partial."""
        if self.region is None:
            return self.hf_name
        r = self.region
        return f"{self.hf_name}[{r.offset}:{r.rows[0]}-{r.rows[1]}:{r.cols[0]}-{r.cols[1]}]"


def _regions(name: str, shape: tuple[int, ...], pos: int, spec: ShardSpec, at: int) -> list[Slot]:
    """The slots of ES tensor ``name`` under ``spec`` (``at``: its row offset in the fused parameter)."""
    numel = math.prod(shape)
    width = math.prod(shape[1:]) if len(shape) > 1 else 1
    if spec.kind == "column":
        first, rows = spec.bands[pos]
        if rows <= 0:  # a rank whose vocabulary shard is all padding holds none of this tensor
            return []
        return [Slot(name, "", at, shape, Region(numel, width, (first, first + rows), (0, width)),
                     owner=spec.owners[pos])]
    if spec.kind == "row":
        if len(shape) == 1:  # the bias of a row-parallel layer is replicated
            return [Slot(name, "", at, shape, None, owner=spec.rank == 0)]
        c0, n = spec.band
        return [Slot(name, "", at, shape, Region(numel, shape[1], (0, shape[0]), (c0, c0 + n)))]
    # experts: [E, 2I, H] (gate rows, then up rows) or [E, H, I]
    experts, first, n = shape[0], spec.band[0], spec.band[1]
    per = numel // experts
    out = []
    for e in range(experts):
        if name.endswith(".gate_up_proj"):
            inter = shape[1] // 2
            out += [Slot(name, "", 0, shape, Region(numel, shape[2], (first, first + n), (0, shape[2]), e * per), e),
                    Slot(name, "", n, shape, Region(numel, shape[2], (inter + first, inter + first + n),
                                                      (0, shape[2]), e * per), e)]
        else:
            out.append(Slot(name, "", 0, shape, Region(numel, shape[2], (0, shape[1]), (first, first + n), e * per), e))
    return out


def plan_slots(hf_shapes: Mapping[str, Sequence[int]], vllm_shapes: Mapping[str, Sequence[int]],
               specs: Mapping[str, ShardSpec] | None = None) -> list[Slot]:
    """Where every ES tensor lives in this rank's vLLM parameters, in ES name order.

    ``specs``: :class:`ShardSpec` per vLLM module name (missing: replicated on one rank, the
    TP = 1 layout). Fused blocks are stacked in q, k, v / gate, up order. Raises ValueError when an
    ES tensor has no vLLM counterpart, when its rows do not fit their vLLM parameter (trailing dims
    equal, rows within bounds: the vocabulary may be padded), or when a vLLM parameter is not
    covered by any ES tensor (its updates would be lost). A vLLM shape with 0 rows (a CPU-packed
    weight) is sized from the slots.
    """
    specs = specs or {}
    groups: dict[str, list[tuple[int, str]]] = {}
    for name in hf_shapes:
        target, pos = vllm_name(name)
        target = _resolve(target, vllm_shapes)
        if target not in vllm_shapes:
            raise ValueError(f"HF parameter {name!r} has no vLLM parameter {target!r} "
                             f"(vLLM has: {', '.join(sorted(vllm_shapes)[:8])}, ...)")
        groups.setdefault(target, []).append((pos, name))
    uncovered = sorted(set(vllm_shapes) - set(groups))
    if uncovered:
        raise ValueError(f"vLLM parameters without an HF counterpart: {uncovered}")
    slots: list[Slot] = []
    for target, members in groups.items():
        spec = specs.get(target.rsplit(".", 1)[0], ShardSpec())
        mine: list[Slot] = []
        for pos, name in sorted(members):
            shape = tuple(int(d) for d in hf_shapes[name])
            if spec.kind == "experts" and spec.band[1] * spec.size != _inter(name, shape):
                raise ValueError(f"HF blocks [{name!r}] do not fit vLLM parameter {target!r} of shape "
                                 f"{tuple(vllm_shapes[target])}: the expert intermediate size {_inter(name, shape)} "
                                 f"is held as intermediate size {spec.band[1]} per rank x {spec.size} ranks "
                                 "(padded by vLLM's MoE kernel; ES cannot move rows without an HF counterpart)")
            at = mine[-1].stop if mine else 0
            if spec.kind == "replicated" or (spec.kind == "experts" and spec.band[1] == _inter(name, shape)):
                mine.append(Slot(name, target, at, shape, None, owner=spec.kind != "replicated" or spec.rank == 0))
            else:
                mine += [Slot(s.hf_name, target, s.start, s.shape, s.region, s.expert, s.owner)
                         for s in _regions(name, shape, pos, spec, at)]
        if mine:
            _check_fit(target, tuple(int(d) for d in vllm_shapes[target]), mine)
        slots += mine
    return sorted(slots, key=lambda s: (s.hf_name, -1 if s.expert is None else s.expert, s.start))


def _inter(name: str, shape: tuple[int, ...]) -> int:
    """The intermediate size of a stacked-experts tensor ([E, 2I, H] or [E, H, I])."""
    return shape[1] // 2 if name.endswith(".gate_up_proj") else shape[-1]


def _check_fit(target: str, vshape: tuple[int, ...], slots: Sequence[Slot]) -> None:
    if not vshape or not vshape[0]:
        return  # a CPU-packed weight: sized from the slots (fused_shape)
    stacked = slots[0].expert is not None
    rows_shape = vshape[1:] if stacked else vshape
    bad = [s for s in slots if s.local_trailing != tuple(rows_shape[1:]) or s.stop > rows_shape[0]
           or (stacked and (s.expert is None or s.expert >= vshape[0]))]
    if bad:
        raise ValueError(f"HF blocks {sorted({s.hf_name for s in slots})} do not fit vLLM parameter "
                         f"{target!r} of shape {vshape}")


def fused_shape(slots: Sequence[Slot], target: str) -> tuple[int, ...]:
    """Shape of this rank's vLLM parameter ``target`` rebuilt from its slots (no padding)."""
    mine = [s for s in slots if s.vllm_name == target]
    return (max(s.stop for s in mine), *mine[0].local_trailing)
