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

Tensor parallelism: each rank holds a shard of most tensors (:mod:`esreason.backends.vllm_layout`
reads which from its layers) and moves it with exactly the unsharded directions
(:mod:`esreason.es.region`). Checksums are per rank (:mod:`esreason.backends.tp_checksum` combines
them and computes the reference's), export writes one file per rank that the engine merges into an
HF checkpoint (:mod:`esreason.backends.tp_export`), and the sharded update's group is per rank:
rank r of every engine all-reduces with rank r of the others. Mixture-of-experts models: ES moves
transformers' stacked expert tensors, read from the per-expert checkpoint tensors
(:mod:`esreason.backends.ckpt_layout`); vLLM on CPU pre-packs expert weights for its MoE kernel, so
there the extension keeps plain expert tensors and re-packs them after every change.

Only torch, safetensors, esreason's ES core and backend helpers are imported here (never vLLM), so the
mapping logic is tested without vLLM.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Sequence

import torch

from esreason.backends.ckpt_layout import ESTensor, Source, es_tensors, read_region
from esreason.backends.hf import ANCHOR_FILE, MASTER_FILE, master_file
from esreason.backends.tp_checksum import rank_named
from esreason.backends.tp_export import RANK_FILE, RANK_MASTER_FILE
from esreason.backends.engine import tensors_checksum
from esreason.backends.vllm_layout import Slot, fused_shape, module_spec, plan_slots, vllm_name  # noqa: F401
from esreason.es.apply import copy_tensor, perturb_tensor, subtract_tensor, update_tensor
from esreason.es.lowrank import Perturbation
from esreason.es.noise import generator_domain
from esreason.es.sharded import Sharding

log = logging.getLogger(__name__)

WEIGHTS_FILE = "model.safetensors"
def master_enabled(master_weights: str, dtype: torch.dtype) -> bool:
    """Same rule as HFPolicy: fp32 masters for 'fp32', or 'auto' with a low-precision model."""
    return master_weights == "fp32" or (master_weights == "auto" and dtype != torch.float32)


class ESWorkerExtension:
    """ES operations on the worker's model (see the module docstring). Methods return plain data."""

    # ------------------------------------------------------------------ set-up

    def es_setup(self, checkpoint_dir: str, restore: str = "exact", master_weights: str = "auto",
                 anchor_decay: float = 0.0, perturbation: str = "full", rank: int = 1) -> dict[str, Any]:
        """Bind the ES tensors to this rank's parameters and load the checkpoint's weights (this rank's shards).

        anchor_decay: anchored ES's lambda (:mod:`esreason.es.anchor`); > 0 also loads this rank's part of
        theta_0 from the checkpoint's ``ANCHOR_FILE`` into host memory. perturbation, rank: the direction
        family (``es.perturbation``, ``es.rank``: :class:`esreason.es.lowrank.Perturbation`; each slot's
        direction is that of its full HF tensor). Returns where the centre copy
        lives, how many elements ES moves (this rank's own, replicas counted on rank 0) and the rank's
        tensor-parallel position.
        """
        from safetensors import safe_open

        if restore not in ("exact", "subtract"):
            raise ValueError(f"unknown restore mode {restore!r}")
        family = Perturbation(perturbation, int(rank))  # before ``rank`` names this worker's TP rank
        model = self.get_model()
        params = _unique_parameters(model)
        with safe_open(str(Path(checkpoint_dir) / WEIGHTS_FILE), framework="pt") as f:
            tensors = es_tensors({k: tuple(f.get_slice(k).get_shape()) for k in f.keys()})
        rank, size = tp_position(model)
        specs = {es_module_name(name): module_spec(mod, rank, size) for name, mod in model.named_modules()
                 if any(True for _ in mod.parameters(recurse=False))}
        slots = plan_slots({n: t.shape for n, t in tensors.items()}, {n: tuple(p.shape) for n, p in params.items()},
                           specs)
        self._es_slots, self._es_tensors, self._es_tp = slots, tensors, (rank, size)
        self._es_perturbation = family
        # per slot key: r_W of a low-rank matrix (None: dense), and the slots without a direction (lora mode)
        self._es_ranks = {sl.key: family.tensor_rank(sl.shape) for sl in slots}
        self._es_still = {sl.key for sl in slots if not family.moves(sl.hf_name, sl.shape)}
        self._es_restore = restore
        self._es_anchor_decay = float(anchor_decay)
        self._es_active: tuple[int, float] | None = None
        dtype = next(iter(params.values())).dtype
        self._es_master = master_enabled(master_weights, dtype)
        self._es_packed: list[tuple[torch.Tensor, torch.Tensor, str]] = []
        if next(iter(params.values())).device.type == "cpu":
            _unpack_cpu_linears(model, slots)
        self._es_params = _unique_parameters(model)
        if next(iter(params.values())).device.type == "cpu":
            self._es_packed = _plain_cpu_experts(model, self._es_params)
        placement = self._es_load(checkpoint_dir)
        owned = sum(s.region.local_numel if s.region is not None else _numel(s.shape) for s in slots if s.owner)
        return {"centre": placement, "elements": owned, "tensors": len(slots),
                "master": self._es_master, "dtype": str(dtype), "tp_rank": rank, "tp_size": size}

    def _es_moving(self) -> list[Slot]:
        """The slots that have a direction (all of them, except outside the LoRA targets with ``lora``)."""
        still = getattr(self, "_es_still", set())
        return [slot for slot in self._es_slots if slot.key not in still]

    def _es_view(self, slot: Slot) -> torch.Tensor:
        data = self._es_params[slot.vllm_name].data
        if slot.expert is not None:
            data = data[slot.expert]  # one expert of a stacked [experts, rows, cols] parameter
        return data[slot.start:slot.stop]  # [local rows, *local trailing] model dtype

    def _es_sync(self) -> None:
        """Re-pack the plain expert tensors into the CPU MoE kernel's layout (after any change)."""
        for plain, packed, isa in getattr(self, "_es_packed", ()):
            torch.ops._C.prepack_moe_weight(plain, packed, isa)

    def _es_load(self, checkpoint_dir: str) -> str:
        """Copy this rank's weights (and fp32 masters) from ``checkpoint_dir`` into the model; retake the centre.

        Slot by slot, each read for its rows only (:func:`~esreason.backends.ckpt_layout.read_region`):
        the host holds the centre copy and one tensor (or shard) of the file at a time.
        """
        path = Path(checkpoint_dir) / WEIGHTS_FILE
        with torch.no_grad():
            for slot in self._es_slots:
                copy_tensor(self._es_view(slot), read_region(path, self._es_tensors[slot.hf_name], slot.region)
                            .view(self._es_view(slot).shape))
        self._es_sync()
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

        views = {s.key: self._es_view(s) for s in self._es_slots}
        on_gpu = next(iter(views.values())).device.type == "cuda"
        specs = {n: (tuple(v.shape), v.dtype) for n, v in views.items()}
        arena = PinnedArena(specs, register=None if on_gpu else False)
        with torch.no_grad():
            for slot in self._es_slots:  # this rank's part of each tensor, read for its rows only
                target = arena.tensors[slot.key]
                copy_tensor(target, read_region(path, self._es_tensors[slot.hf_name], slot.region).view(target.shape))
        self._es_anchor_arena, self._es_anchor = arena, arena.tensors

    def _es_snapshot(self, master_path: Path | None = None) -> str:
        """Save the centre copy (fp32 masters or model dtype) on the device or in host memory (pinned
        on a GPU), filled tensor by tensor from ``master_path`` (else from the model's weights)."""
        views = {s.key: self._es_view(s) for s in self._es_slots}
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
        with torch.no_grad():
            for slot in self._es_slots:
                if master_path is None:
                    copy_tensor(centre[slot.key], views[slot.key])
                else:  # the masters file holds the ES tensors by their own names
                    shape = self._es_tensors[slot.hf_name].shape
                    whole = ESTensor(slot.hf_name, shape, (Source(slot.hf_name, 0, shape),))
                    copy_tensor(centre[slot.key], read_region(master_path, whole, slot.region).view(views[slot.key].shape))
        self._es_centre = centre if (self._es_restore == "exact" or self._es_master) else None
        log.info("es: centre copy (%.1f MiB) in %s", need / 2**20, where)
        return where

    # ------------------------------------------------------------------ ES operations

    @torch.no_grad()
    def es_perturb(self, seed: int, sigma: float) -> None:
        """theta <- centre + sigma * eps(seed), computed in fp32 on the device and rounded once."""
        if self._es_active is not None:
            raise RuntimeError("es_perturb called twice without es_restore")
        for slot in self._es_moving():
            # without masters the live view is the centre (bit-exact), so it is its own base
            master = self._es_centre[slot.key] if self._es_master else None
            perturb_tensor(self._es_view(slot), slot.hf_name, int(seed), float(sigma), rank=self._es_ranks[slot.key],
                           master=master, region=slot.region)
        self._es_sync()
        self._es_active = (int(seed), float(sigma))

    @torch.no_grad()
    def es_restore(self) -> None:
        """theta <- centre (copy of the saved centre; or subtract the noise in 'subtract' mode)."""
        if self._es_active is None:
            raise RuntimeError("es_restore called without es_perturb")
        seed, sigma = self._es_active
        for slot in self._es_moving():  # (a tensor without a direction was never moved)
            view = self._es_view(slot)
            if self._es_restore == "exact":
                copy_tensor(view, self._es_centre[slot.key])
            else:
                subtract_tensor(view, slot.hf_name, seed, sigma, rank=self._es_ranks[slot.key], region=slot.region)
        self._es_sync()
        self._es_active = None

    @torch.no_grad()
    def es_update(self, seeds: Sequence[int], weights: Sequence[float], alpha: float,
                  sharding: Sharding | None = None) -> float:
        """centre += alpha/N sum_i w_i eps(seeds_i) (fp32 on the device; then pulled toward theta_0 with
        anchored ES); returns ||delta applied||_2 over this rank's own elements (the engine adds the ranks'
        squares)."""
        if self._es_active is not None:
            raise RuntimeError("es_update while a member is applied")
        sq = None  # float64 scalar on the device: one host sync per update, not one per tensor
        for slot in self._es_moving():
            centre = None if self._es_centre is None else self._es_centre[slot.key]
            anchor = None if self._es_anchor is None else self._es_anchor[slot.key]
            part = update_tensor(self._es_view(slot), slot.hf_name, seeds, weights, alpha, rank=self._es_ranks[slot.key],
                                 master=centre if self._es_master else None,
                                 centre=None if self._es_master else centre, sharding=sharding, region=slot.region,
                                 anchor=anchor, anchor_decay=self._es_anchor_decay)
            if slot.owner:
                sq = part if sq is None else sq + part
        self._es_sync()
        return 0.0 if sq is None else float(sq) ** 0.5

    # ------------------------------------------------------------------ members as LoRA adapters

    def _es_lora_targets(self) -> list[tuple[str, tuple[int, ...]]]:
        """(HF name, full shape) of every tensor with a direction, once each (``lora`` mode: LoRA targets only)."""
        seen: dict[str, tuple[int, ...]] = {}
        for slot in self._es_moving():
            seen.setdefault(slot.hf_name, tuple(slot.shape))
        return sorted(seen.items())

    def es_lora_check(self) -> int:
        """ValueError unless vLLM wraps every weight ES moves in a LoRA layer (:mod:`esreason.backends.vllm_lora`);
        returns the count of LoRA-wrapped modules."""
        from esreason.backends.vllm_lora import check_targets
        from esreason.es.lowrank import lora_module

        if self._es_perturbation.kind != "lora":
            raise ValueError(f"members as LoRA adapters need es.perturbation=lora (got {self._es_perturbation.kind!r})")
        return check_targets(self, [lora_module(n, s) for n, s in self._es_lora_targets()])

    def es_lora_add(self, members: Sequence[Sequence[Any]]) -> None:
        """Register one adapter per (lora id, seed, sigma): member seed's low-rank directions times sigma."""
        from esreason.backends.vllm_lora import register_adapters

        if self._es_active is not None:
            raise RuntimeError("es_lora_add while a member is applied in place")
        register_adapters(self, [(int(i), int(s), float(g)) for i, s, g in members], self._es_lora_targets(),
                          self._es_perturbation.rank)

    def es_lora_remove(self, ids: Sequence[int]) -> None:
        """Drop the adapters of :meth:`es_lora_add`."""
        from esreason.backends.vllm_lora import remove_adapters

        remove_adapters(self, ids)

    def es_join_group(self, host: str, port: int, prefix: str, rank: int, world: int, timeout_s: float) -> None:
        """Join the pool's process group for the sharded update (:mod:`esreason.backends.collective`).

        With tensor parallelism each rank joins its own group (``prefix/tp{r}``): rank r of every
        engine holds the same shards, so their pieces match one for one."""
        from esreason.backends.collective import EngineGroup, GroupSpec

        tp_rank, tp_size = getattr(self, "_es_tp", (0, 1))
        if tp_size > 1:
            prefix = f"{prefix}/tp{tp_rank}"

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
        """This rank's digest. With whole tensors (TP = 1) it is ``policy_checksum`` of an HFPolicy holding
        the same centre; shards are hashed under their slot keys (:mod:`esreason.backends.tp_checksum`)."""
        masters = self._es_centre if self._es_master else None
        return tensors_checksum(rank_named(self._es_slots, self._es_view, masters))

    def es_layout(self) -> dict[str, Any]:
        """This rank's slots and the ES tensors, as plain data (the engine's checksum reference and export merge)."""
        slots = [[s.hf_name, None if s.region is None else
                  [s.region.numel, s.region.width, *s.region.rows, *s.region.cols, s.region.offset]]
                 for s in self._es_slots]
        tensors = {n: [list(t.shape), [[src.key, src.offset, list(src.shape)] for src in t.sources]]
                   for n, t in self._es_tensors.items()}
        return {"rank": self._es_tp[0], "size": self._es_tp[1], "slots": slots, "tensors": tensors,
                "master": bool(self._es_master)}

    def es_export(self, directory: str) -> list[str]:
        """Write the centre as HF ``model.safetensors`` (+ the fp32 masters, ``MASTER_FILE``); returns file names.

        A rank holding shards, or a model whose checkpoint stores its ES tensors differently (stacked
        experts), writes its slots to ``RANK_FILE`` (+ ``RANK_MASTER_FILE``) instead, by slot key; the
        engine merges the ranks' files into the checkpoint (:mod:`esreason.backends.tp_export`)."""
        from safetensors.torch import save_file

        if self._es_active is not None:
            raise RuntimeError("es_export while a member is applied")
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        direct = all(s.region is None for s in self._es_slots) and all(t.plain for t in self._es_tensors.values())
        rank = self._es_tp[0]
        weights = WEIGHTS_FILE if direct else RANK_FILE.format(rank=rank)
        masters = MASTER_FILE if direct else RANK_MASTER_FILE.format(rank=rank)
        save_file({(s.hf_name if direct else s.key): self._es_view(s).detach().cpu().contiguous()
                   for s in self._es_slots}, str(out / weights), metadata={"format": "pt"})
        files = [weights]
        if self._es_master:
            (out / masters).parent.mkdir(parents=True, exist_ok=True)
            save_file({n: t.detach().cpu().contiguous() for n, t in self._es_centre.items()},
                      str(out / masters), metadata={"format": "pt"})
            files.append(masters)
        return files

    def es_load(self, checkpoint_dir: str) -> str:
        """Replace the centre by a checkpoint's weights (re-broadcast); returns the centre placement."""
        if self._es_active is not None:
            raise RuntimeError("es_load while a member is applied")
        return self._es_load(checkpoint_dir)


def tp_position(model: torch.nn.Module) -> tuple[int, int]:
    """(rank, size) of this worker in its engine's tensor-parallel group, read from the layers
    (``tp_rank`` / ``tp_size``, set by vLLM's parallel layers); (0, 1) without tensor parallelism."""
    for mod in model.modules():
        size = int(getattr(mod, "tp_size", 1) or 1)
        if size > 1 and hasattr(mod, "tp_rank"):
            return int(mod.tp_rank), size
    return 0, 1


def _plain_cpu_experts(model: torch.nn.Module, params: dict[str, torch.nn.Parameter]) -> list:
    """vLLM's CPU MoE kernel pre-packs ``w13_weight`` / ``w2_weight`` into its grouped-GEMM layout
    (same shape, other element order), so writing plain values into them would scramble the
    experts. For each such layer, ``params`` gets a plain tensor of the same shape under the
    parameter's name (ES moves it) and the returned (plain, packed, isa) triples are re-packed after
    every change (:meth:`ESWorkerExtension._es_sync`). Layers the kernel does not pack are left alone."""
    out = []
    for name, mod in model.named_modules():
        if not hasattr(mod, "w13_weight"):
            continue
        experts = getattr(getattr(getattr(mod, "quant_method", None), "moe_kernel", None), "fused_experts", None)
        isa = getattr(experts, "isa", None)
        if isa is None or getattr(experts, "_use_zentorch", False):
            continue
        for leaf in ("w13_weight", "w2_weight"):
            packed = getattr(mod, leaf)
            plain = torch.zeros_like(packed.data)  # filled from the checkpoint by _es_load
            params[es_module_name(f"{name}.{leaf}")] = torch.nn.Parameter(plain, requires_grad=False)
            out.append((plain, packed.data, str(isa)))
    return out


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def es_module_name(name: str) -> str:
    """A vLLM module or parameter name without the ``base_layer`` level that vLLM's LoRA wrappers insert
    (``...qkv_proj.base_layer.weight`` -> ``...qkv_proj.weight``): the name the layout maps HF tensors to."""
    return name.replace(".base_layer.", ".").removesuffix(".base_layer")


def _unique_parameters(model: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    """Named parameters (LoRA wrappers' ``base_layer`` level removed), each shared tensor once under its
    first name (tied embeddings)."""
    return {es_module_name(n): p for n, p in model.named_parameters()}


def _unpack_cpu_linears(model: torch.nn.Module, slots: Sequence[Slot]) -> int:
    """vLLM-CPU layers compute through ``layer.cpu_linear`` with a packed weight copy (linear layers
    also drop ``layer.weight``). Route them through ``functional.linear`` on the live weight,
    re-allocating dropped weights (filled from the checkpoint afterwards). Returns the count."""
    count = 0
    for name, mod in model.named_modules():
        if not hasattr(mod, "cpu_linear") or "base_layer" in mod._modules:
            continue  # (a LoRA wrapper forwards attribute reads to its base layer, which is rerouted itself)
        weight = getattr(mod, "weight", None)
        if isinstance(weight, torch.nn.Parameter) and weight.numel() == 0:
            shape = fused_shape(slots, f"{es_module_name(name)}.weight")
            mod.weight = torch.nn.Parameter(torch.zeros(shape, dtype=weight.dtype), requires_grad=False)
        bias = getattr(mod, "bias", None)
        if isinstance(bias, torch.nn.Parameter) and weight is not None and bias.dtype != weight.dtype:
            mod.bias = torch.nn.Parameter(bias.detach().to(weight.dtype), requires_grad=False)
        mod.cpu_linear = _plain_linear
        count += 1
    return count


def _plain_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.nn.functional.linear(x, weight, bias)
