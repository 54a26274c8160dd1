"""The vLLM worker extension: ES operations inside a vLLM worker, on the model it serves.

Mixed into vLLM's worker with ``LLM(..., worker_extension_cls=
"esreason.backends.vllm_worker.ESWorkerExtension")`` and driven with
``llm.collective_rpc("es_perturb", args=(seed, sigma))`` etc. (:mod:`esreason.backends.vllm`).
All methods start with ``es_`` so they cannot clash with the worker's own.

Hugging Face view of a fused model. vLLM fuses q/k/v into ``qkv_proj`` and gate/up into
``gate_up_proj`` and pads the vocabulary rows of the embedding / LM head. Every ES
operation works on the *Hugging Face* tensors: each HF parameter is a block of rows of
one vLLM parameter (:func:`plan_slots`), its direction is ``eps(seed, hf_name)`` with the
HF shape, so the centre moves exactly as :class:`~esreason.backends.hf.HFPolicy` moves it,
checksums equal :func:`~esreason.backends.engine.policy_checksum` of the same centre,
and export writes an ordinary HF checkpoint (fused tensors split back).

Centre copy: exact restore copies back a saved copy of the centre (fp32 masters when the
model runs in bf16/fp16, as in HFPolicy). On a GPU it stays on the GPU when the free
memory outside vLLM's reservation holds it (plus a margin), else in pinned host memory
(restore is then a host-to-device copy, one noise block at a time). Directions are drawn
on the GPU by its own generator and every operation runs there, block by block
(:mod:`esreason.es.apply`, the same functions HFPolicy uses): no parameter-sized host
tensor and no host-to-device copy of a direction.

Sharded update (``backend.update: sharded``): :meth:`es_join_group` joins the pool's
stateless process group (:mod:`esreason.backends.collective`: NCCL on GPUs, gloo on CPU,
never vLLM's own group) and :meth:`es_update_sharded` sums this engine's shards and
all-reduces each block (:mod:`esreason.es.sharded`).

Anchored ES (``es.anchor_decay`` > 0, :mod:`esreason.es.anchor`): theta_0 comes with the start state
(``es_anchor/anchor.safetensors``, the run's start weights) and is kept in host memory in the model
dtype (page-locked on a GPU: one more copy of the weights on the host, none on the device beyond the
piece being updated); every update pulls the centre toward it.

vLLM on CPU pre-packs linear weights for oneDNN / AMX kernels and drops the plain
tensor; in-place updates would not reach the packed copy. On CPU, :meth:`es_setup`
therefore re-materialises plain weights from the checkpoint and routes those layers
through ``torch.nn.functional.linear``. GPU layers are left as vLLM built them.

Only torch, safetensors, esreason's ES core and backend helpers are imported here (never vLLM), so the
mapping logic is tested without vLLM.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import torch

from esreason.backends.engine import tensors_checksum
from esreason.backends.hf import ANCHOR_FILE, MASTER_FILE, master_file
from esreason.es.apply import copy_tensor, perturb_tensor, subtract_tensor, update_tensor
from esreason.es.noise import generator_domain
from esreason.es.sharded import Sharding

log = logging.getLogger(__name__)

WEIGHTS_FILE = "model.safetensors"

#: HF projection -> (vLLM fused projection, position of its rows in the fused tensor).
_FUSED = {"q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2),
          "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1)}
_FUSED_RE = re.compile(r"\.(q_proj|k_proj|v_proj|gate_proj|up_proj)\.")
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def vllm_name(hf_name: str) -> tuple[str, int]:
    """The vLLM parameter holding HF parameter ``hf_name`` and the position of its block."""
    m = _FUSED_RE.search(hf_name)
    if m is None:
        return hf_name, 0
    fused, pos = _FUSED[m.group(1)]
    return hf_name[:m.start()] + f".{fused}." + hf_name[m.end():], pos


@dataclass(frozen=True)
class Slot:
    """HF parameter ``hf_name`` (shape ``shape``) = rows [start, start + shape[0]) of ``vllm_name``."""

    hf_name: str
    vllm_name: str
    start: int
    shape: tuple[int, ...]

    @property
    def stop(self) -> int:
        return self.start + self.shape[0]


def plan_slots(hf_shapes: Mapping[str, Sequence[int]], vllm_shapes: Mapping[str, Sequence[int]]) -> list[Slot]:
    """Where every HF parameter lives in the vLLM model, in HF name order.

    Fused blocks are stacked in q, k, v / gate, up order. Raises ValueError when an HF
    parameter has no vLLM counterpart, when blocks do not fit their vLLM parameter
    (trailing dims equal, rows within bounds: the vocabulary may be padded), or when a
    vLLM parameter is not covered by any HF parameter (its updates would be lost).
    A vLLM shape with 0 rows (a CPU-packed weight) is sized from the HF blocks.
    """
    groups: dict[str, list[tuple[int, str]]] = {}
    for name in hf_shapes:
        target, pos = vllm_name(name)
        if target not in vllm_shapes:
            raise ValueError(f"HF parameter {name!r} has no vLLM parameter {target!r} "
                             f"(vLLM has: {', '.join(sorted(vllm_shapes)[:8])}, ...)")
        groups.setdefault(target, []).append((pos, name))
    uncovered = sorted(set(vllm_shapes) - set(groups))
    if uncovered:
        raise ValueError(f"vLLM parameters without an HF counterpart: {uncovered}")
    slots = []
    for target, members in groups.items():
        start = 0
        vshape = tuple(vllm_shapes[target])
        for _, name in sorted(members):
            shape = tuple(int(d) for d in hf_shapes[name])
            slots.append(Slot(name, target, start, shape))
            start += shape[0]
        rows = vshape[0] if vshape and vshape[0] else start
        if any(tuple(hf_shapes[n])[1:] != vshape[1:] for _, n in members if vshape and vshape[0]) or start > rows:
            raise ValueError(f"HF blocks {[n for _, n in sorted(members)]} do not fit vLLM parameter "
                             f"{target!r} of shape {vshape}")
    return sorted(slots, key=lambda s: s.hf_name)


def fused_shape(slots: Sequence[Slot], target: str) -> tuple[int, ...]:
    """Shape of vLLM parameter ``target`` rebuilt from its HF blocks (no padding)."""
    mine = [s for s in slots if s.vllm_name == target]
    return (max(s.stop for s in mine), *mine[0].shape[1:])


def master_enabled(master_weights: str, dtype: torch.dtype) -> bool:
    """Same rule as HFPolicy: fp32 masters for 'fp32', or 'auto' with a low-precision model."""
    return master_weights == "fp32" or (master_weights == "auto" and dtype != torch.float32)


class ESWorkerExtension:
    """ES operations on the worker's model (see the module docstring). Methods return plain data."""

    # ------------------------------------------------------------------ set-up

    def es_setup(self, checkpoint_dir: str, restore: str = "exact", master_weights: str = "auto",
                 anchor_decay: float = 0.0) -> dict[str, Any]:
        """Bind HF names to the served model's parameters and load the checkpoint's weights.

        anchor_decay: anchored ES's lambda (:mod:`esreason.es.anchor`); > 0 also loads theta_0 from the
        checkpoint's ``ANCHOR_FILE`` into host memory. Returns where the centre copy lives and how many
        elements ES moves.
        """
        from safetensors import safe_open

        if restore not in ("exact", "subtract"):
            raise ValueError(f"unknown restore mode {restore!r}")
        model = self.get_model()
        params = _unique_parameters(model)
        with safe_open(str(Path(checkpoint_dir) / WEIGHTS_FILE), framework="pt") as f:
            hf_shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
        slots = plan_slots(hf_shapes, {n: tuple(p.shape) for n, p in params.items()})
        self._es_slots = slots
        self._es_restore = restore
        self._es_anchor_decay = float(anchor_decay)
        self._es_active: tuple[int, float] | None = None
        dtype = next(iter(params.values())).dtype
        self._es_master = master_enabled(master_weights, dtype)
        if next(iter(params.values())).device.type == "cpu":
            _unpack_cpu_linears(model, slots)
        self._es_params = _unique_parameters(model)
        placement = self._es_load(checkpoint_dir)
        return {"centre": placement, "elements": sum(_numel(s.shape) for s in slots), "tensors": len(slots),
                "master": self._es_master, "dtype": str(dtype)}

    def _es_view(self, slot: Slot) -> torch.Tensor:
        return self._es_params[slot.vllm_name].data[slot.start:slot.stop]  # [*slot.shape] model dtype

    def _es_load(self, checkpoint_dir: str) -> str:
        """Copy HF weights (and fp32 masters) from ``checkpoint_dir`` into the model; retake the centre.

        Tensor by tensor (issue 35, item 5): ``load_file`` of the masters held the whole file (28.4
        GiB at 7B) beside the centre copy it was copied into; now the host holds the centre copy
        and one tensor of the file at a time (:func:`read_tensors`).
        """
        slots = {s.hf_name: s for s in self._es_slots}
        with torch.no_grad():
            for name, t in read_tensors(Path(checkpoint_dir) / WEIGHTS_FILE, list(slots)):
                copy_tensor(self._es_view(slots[name]), t)
        master_path = master_file(checkpoint_dir) if self._es_master else None
        self._es_load_anchor(checkpoint_dir)
        return self._es_snapshot(master_path)

    def _es_load_anchor(self, checkpoint_dir: str) -> None:
        """theta_0 of anchored ES from ``checkpoint_dir``'s ``ANCHOR_FILE`` (the run's start weights, which
        travel with every start state), tensor by tensor, in host memory in the model dtype: page-locked
        beside a GPU, whose update copies one piece of it at a time to the device. Nothing without it."""
        old = getattr(self, "_es_anchor_arena", None)
        if old is not None:
            old.close()
        self._es_anchor_arena, self._es_anchor = None, None
        if not getattr(self, "_es_anchor_decay", 0.0):
            return
        path = Path(checkpoint_dir) / ANCHOR_FILE
        if not path.is_file():
            raise ValueError(f"{path} is missing: anchored ES (anchor_decay > 0) needs the run's start weights")
        from esreason.backends.pinned import PinnedArena

        views = {s.hf_name: self._es_view(s) for s in self._es_slots}
        on_gpu = next(iter(views.values())).device.type == "cuda"
        specs = {n: (tuple(v.shape), v.dtype) for n, v in views.items()}
        arena = PinnedArena(specs, register=None if on_gpu else False)
        with torch.no_grad():
            for name, t in read_tensors(path, list(views)):
                copy_tensor(arena.tensors[name], t)
        self._es_anchor_arena, self._es_anchor = arena, arena.tensors

    def _es_snapshot(self, master_path: Path | None = None) -> str:
        """Save the centre copy (fp32 masters or model dtype) on the device or in host memory (pinned
        on a GPU), filled tensor by tensor from ``master_path`` (else from the model's weights)."""
        views = {s.hf_name: self._es_view(s) for s in self._es_slots}
        device = next(iter(views.values())).device
        item = 4 if self._es_master else next(iter(views.values())).element_size()
        need = sum(v.numel() for v in views.values()) * item
        where = "device"
        if device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(device)
            if need > 0.8 * free - 2**30:  # keep a 1 GiB + 20% margin for activations and the noise
                where = "pinned host memory"
        elif device.type == "cpu":
            where = "host memory"
        target_dtype = torch.float32 if self._es_master else None
        old_arena = getattr(self, "_es_arena", None)
        if old_arena is not None:  # a new start state: the previous centre's pages are unlocked first
            old_arena.close()
        self._es_arena = None
        self._es_centre = None  # the previous centre is freed before the next is allocated
        specs = {n: (tuple(v.shape), target_dtype or v.dtype) for n, v in views.items()}
        if where == "device":
            centre = {n: torch.empty(shape, dtype=dtype, device=device) for n, (shape, dtype) in specs.items()}
        else:
            # One buffer of exactly the bytes needed, page-locked once on a GPU (backends/pinned.py): tensor
            # by tensor, torch's caching host allocator would round each up to a power of two.
            from esreason.backends.pinned import PinnedArena

            self._es_arena = PinnedArena(specs, register=None if where == "pinned host memory" else False)
            centre = self._es_arena.tensors
        source = read_tensors(master_path, list(views)) if master_path is not None else views.items()
        with torch.no_grad():
            for name, t in source:
                copy_tensor(centre[name], t)
        self._es_centre = centre if (self._es_restore == "exact" or self._es_master) else None
        log.info("es: centre copy (%.1f MiB) in %s", need / 2**20, where)
        return where

    # ------------------------------------------------------------------ ES operations

    @torch.no_grad()
    def es_perturb(self, seed: int, sigma: float) -> None:
        """theta <- centre + sigma * eps(seed), computed in fp32 on the device and rounded once."""
        if self._es_active is not None:
            raise RuntimeError("es_perturb called twice without es_restore")
        for slot in self._es_slots:
            # without masters the live view is the centre (bit-exact), so it is its own base
            master = self._es_centre[slot.hf_name] if self._es_master else None
            perturb_tensor(self._es_view(slot), slot.hf_name, int(seed), float(sigma), master=master)
        self._es_active = (int(seed), float(sigma))

    @torch.no_grad()
    def es_restore(self) -> None:
        """theta <- centre (copy of the saved centre; or subtract the noise in 'subtract' mode)."""
        if self._es_active is None:
            raise RuntimeError("es_restore called without es_perturb")
        seed, sigma = self._es_active
        for slot in self._es_slots:
            view = self._es_view(slot)
            if self._es_restore == "exact":
                copy_tensor(view, self._es_centre[slot.hf_name])
            else:
                subtract_tensor(view, slot.hf_name, seed, sigma)
        self._es_active = None

    @torch.no_grad()
    def es_update(self, seeds: Sequence[int], weights: Sequence[float], alpha: float,
                  sharding: Sharding | None = None) -> float:
        """centre += alpha/N sum_i w_i eps(seeds_i) (fp32 on the device; then pulled toward theta_0 with
        anchored ES); returns ||delta applied||_2."""
        if self._es_active is not None:
            raise RuntimeError("es_update while a member is applied")
        sq = None  # float64 scalar on the device: one host sync per update, not one per tensor
        for slot in self._es_slots:
            centre = None if self._es_centre is None else self._es_centre[slot.hf_name]
            anchor = None if self._es_anchor is None else self._es_anchor[slot.hf_name]
            part = update_tensor(self._es_view(slot), slot.hf_name, seeds, weights, alpha,
                                 master=centre if self._es_master else None,
                                 centre=None if self._es_master else centre, sharding=sharding,
                                 anchor=anchor, anchor_decay=self._es_anchor_decay)
            sq = part if sq is None else sq + part
        return 0.0 if sq is None else float(sq) ** 0.5

    def es_join_group(self, host: str, port: int, prefix: str, rank: int, world: int, timeout_s: float) -> None:
        """Join the pool's process group for the sharded update (:mod:`esreason.backends.collective`)."""
        from esreason.backends.collective import EngineGroup, GroupSpec

        old = getattr(self, "_es_group", None)
        self._es_group = None
        if old is not None:
            old.close()  # abort the previous group's communicators before forming the next
        device = next(iter(self._es_params.values())).device
        self._es_group = EngineGroup(GroupSpec(host, int(port), prefix, int(rank), int(world), float(timeout_s)), device)

    def es_update_sharded(self, seeds: Sequence[int], weights: Sequence[float], alpha: float,
                          num_shards: int, shards: Sequence[int]) -> float:
        """:meth:`es_update` summing only ``shards`` and all-reducing with the pool's group."""
        group = getattr(self, "_es_group", None)
        if group is None:
            raise RuntimeError("es_update_sharded before es_join_group")
        sharding = Sharding(int(num_shards), tuple(int(k) for k in shards), group.all_reduce_)
        return self.es_update(seeds, weights, alpha, sharding)

    def es_noise_domain(self) -> str:
        """Where this worker's seeds mean the same directions (:func:`esreason.es.noise.generator_domain`)."""
        return generator_domain(next(iter(self._es_params.values())).device)

    def es_device_memory(self) -> dict[str, int]:
        """This worker's torch allocator counters in bytes (benchmarks: ES memory beyond vLLM's)."""
        device = next(iter(self._es_params.values())).device
        if device.type != "cuda":
            return {"allocated": 0, "max_allocated": 0, "reserved": 0}
        return {"allocated": torch.cuda.memory_allocated(device), "max_allocated": torch.cuda.max_memory_allocated(device),
                "reserved": torch.cuda.memory_reserved(device)}

    def es_reset_peak_memory(self) -> None:
        device = next(iter(self._es_params.values())).device
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)

    def es_checksum(self) -> str:
        """Same digest as ``policy_checksum`` of an HFPolicy holding the same centre."""
        named = [(s.hf_name, self._es_view(s)) for s in self._es_slots]
        if self._es_master:
            named += [(f"master:{n}", t) for n, t in self._es_centre.items()]
        return tensors_checksum(named)

    def es_export(self, directory: str) -> list[str]:
        """Write the centre as HF ``model.safetensors`` (+ the fp32 masters, ``MASTER_FILE``); returns file names."""
        from safetensors.torch import save_file

        if self._es_active is not None:
            raise RuntimeError("es_export while a member is applied")
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        save_file({s.hf_name: self._es_view(s).detach().cpu().contiguous() for s in self._es_slots},
                  str(out / WEIGHTS_FILE), metadata={"format": "pt"})
        files = [WEIGHTS_FILE]
        if self._es_master:
            (out / MASTER_FILE).parent.mkdir(parents=True, exist_ok=True)
            save_file({n: t.detach().cpu().contiguous() for n, t in self._es_centre.items()},
                      str(out / MASTER_FILE), metadata={"format": "pt"})
            files.append(MASTER_FILE)
        return files

    def es_load(self, checkpoint_dir: str) -> str:
        """Replace the centre by a checkpoint's weights (re-broadcast); returns the centre placement."""
        if self._es_active is not None:
            raise RuntimeError("es_load while a member is applied")
        return self._es_load(checkpoint_dir)


def read_tensors(path: str | Path, names: Sequence[str]) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) of ``names`` from safetensors file ``path``, one at a time, each file opened for
    one tensor. safetensors 0.8's ``get_tensor`` returns a view of the file's memory map: the pages
    it touches count in the process's resident memory until the file is closed, so one open file
    read whole would hold every tensor it served (measured: tests/test_engine_host_memory.py).
    Opening it per tensor re-reads its header (tens of KB) each time."""
    from safetensors import safe_open

    for name in names:
        with safe_open(str(path), framework="pt") as f:
            tensor = f.get_tensor(name)
        yield name, tensor
        del tensor


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def _unique_parameters(model: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    """Named parameters, each shared tensor once under its first name (tied embeddings)."""
    return dict(model.named_parameters())


def _unpack_cpu_linears(model: torch.nn.Module, slots: Sequence[Slot]) -> int:
    """vLLM-CPU layers compute through ``layer.cpu_linear`` with a packed weight copy (linear layers
    also drop ``layer.weight``). Route them through ``functional.linear`` on the live weight,
    re-allocating dropped weights (filled from the checkpoint afterwards). Returns the count."""
    count = 0
    for name, mod in model.named_modules():
        if not hasattr(mod, "cpu_linear"):
            continue
        weight = getattr(mod, "weight", None)
        if isinstance(weight, torch.nn.Parameter) and weight.numel() == 0:
            shape = fused_shape(slots, f"{name}.weight")
            mod.weight = torch.nn.Parameter(torch.zeros(shape, dtype=weight.dtype), requires_grad=False)
        bias = getattr(mod, "bias", None)
        if isinstance(bias, torch.nn.Parameter) and weight is not None and bias.dtype != weight.dtype:
            mod.bias = torch.nn.Parameter(bias.detach().to(weight.dtype), requires_grad=False)
        mod.cpu_linear = _plain_linear
        count += 1
    return count


def _plain_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.nn.functional.linear(x, weight, bias)
