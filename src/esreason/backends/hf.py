"""The transformers backend (CPU/GPU): model loading and the perturbable policy.

This is the reference backend. Sampling lives in :mod:`esreason.backends.sampling`
(a KV-cache decode loop over any HF causal LM); the ES weight operations live in
:mod:`esreason.es.params`; this module glues them to a Hugging Face model and
writes checkpoints that load with plain ``AutoModelForCausalLM.from_pretrained``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Sequence

import torch

from esreason.backends import cpu_attention, host_malloc
from esreason.errors import UserError
from esreason.es.params import CentredParameters, unique_named_parameters

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

#: fp32 master weights of a checkpoint, in a subdirectory: vLLM's loader globs ``*.safetensors``
#: in the model directory (not below it) and would otherwise read the masters as weights, and
#: a tensor-name hash of the directory would see every name twice.
MASTER_FILE = "es_master/master.safetensors"
LEGACY_MASTER_FILE = "es_master.safetensors"  # where earlier versions wrote the masters; read only
#: theta_0 of anchored ES (``es.anchor_decay``) beside an engine's start state and in the run directory
#: (esreason.es_loop.anchor); a subdirectory for the reason given at MASTER_FILE. Never in a checkpoint.
ANCHOR_FILE = "es_anchor/anchor.safetensors"


def master_file(directory: str | Path) -> Path | None:
    """The masters file of checkpoint ``directory`` (current or legacy place), or None."""
    for name in (MASTER_FILE, LEGACY_MASTER_FILE):
        path = Path(directory) / name
        if path.is_file():
            return path
    return None


def resolve_model_path(spec: str) -> str:
    """'demo' -> the embedded default's directory; a local dir as is; anything else is a hub id."""
    if spec == "demo":
        from esreason.embedded import demo_model_dir

        path = demo_model_dir()
        if not (path / "config.json").is_file():
            raise UserError(f"the embedded default is missing at {path}; run `esreason pretrain-demo`")
        return str(path)
    p = Path(spec).expanduser()
    if p.exists():
        if not (p / "config.json").is_file():
            raise UserError(f"model directory {p} has no config.json (not a Hugging Face model directory)")
        return str(p)
    looks_like_hub_id = spec.count("/") == 1 and not spec.startswith((".", "/", "~"))
    if not looks_like_hub_id:
        raise UserError(f"model path not found: {spec}")
    return spec


def _verify_if_checkpoint(spec: str, path: str) -> None:
    """An esreason checkpoint (a ``COMPLETE`` checksum manifest beside the weights) must verify before it
    is loaded: UserError naming the damaged file (docs/faults.md)."""
    from esreason.io.atomic import COMPLETE_MARKER
    from esreason.io.verify import DamagedFile, verify_checkpoint

    if not (Path(path) / COMPLETE_MARKER).is_file():
        return
    try:
        verify_checkpoint(path)
    except DamagedFile as exc:
        raise UserError(f"cannot load model {spec!r}: {exc}") from None


def model_dtype(spec: str) -> str:
    """The dtype ``spec``'s weights are published in (its config.json ``dtype`` / ``torch_dtype``:
    bfloat16 for the paper's models), one of :data:`DTYPES`; float32 when it names none or another.
    Reads a local directory's config.json, the package's architecture table for a known hub id
    (no hub access), else transformers' AutoConfig (the hub)."""
    from esreason.io.architectures import known

    if spec in known():
        raw = known()[spec].get("torch_dtype")
    else:
        path = Path(resolve_model_path(spec)) / "config.json"
        if path.is_file():
            data = json.loads(path.read_text())
            raw = data.get("dtype") or data.get("torch_dtype")
        else:
            from transformers import AutoConfig

            cfg = AutoConfig.from_pretrained(spec)
            raw = getattr(cfg, "dtype", None) or getattr(cfg, "torch_dtype", None)
    name = str(raw).replace("torch.", "") if raw is not None else "float32"
    return name if name in DTYPES else "float32"


def resolve_dtype(spec: str, dtype: str) -> str:
    """``dtype``, or :func:`model_dtype` of ``spec`` when it is ``"auto"``."""
    return model_dtype(spec) if dtype == "auto" else dtype


def load_model(spec: str, dtype: str = "float32", device: str = "cpu",
               run_device: str | None = None) -> tuple[Any, Any]:
    """Load (model, tokenizer) from 'demo', a local HF directory or a hub id; model in eval mode.

    device: a torch device, or ``auto``: the layers spread over every visible GPU (accelerate's
        ``device_map="auto"``; the scorer beside a tensor-parallel vLLM engine).
    run_device: where the model will run when that is not ``device`` (a GRPO process loads on the
        CPU and accelerate moves the model to its GPU); it picks the attention implementation: a
        model that runs on the CPU uses :mod:`esreason.backends.cpu_attention` (eager-style decode
        steps, ``sdpa`` otherwise), one on a GPU keeps transformers' ``sdpa``.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # our own progress bars are enough
    if dtype not in DTYPES:
        raise UserError(f"unknown dtype {dtype!r}; allowed: {', '.join(DTYPES)}")
    path = resolve_model_path(spec)
    _verify_if_checkpoint(spec, path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        if fsdp_broadcast_receiver():
            model = _empty_model(path, DTYPES[dtype])
        else:
            model = AutoModelForCausalLM.from_pretrained(path, dtype=DTYPES[dtype],
                                                         **({"device_map": "auto"} if device == "auto" else {}))
    except OSError as exc:
        raise UserError(f"cannot load model {spec!r}: {str(exc).splitlines()[0]}") from None
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"  # placed by from_pretrained
    elif not _loaded_on_meta(model):
        model.to(device)
    model.eval()
    cpu_attention.use_on(model, run_device or device)
    if torch.device(run_device or device).type == "cpu":
        host_malloc.tune()  # freed decode buffers stay in the heap (page faults were a third of a call)
    return model, tokenizer


def fsdp_broadcast_receiver() -> bool:
    """True on a process that gets its weights from rank 0 instead of reading them: FSDP with
    ``fsdp_cpu_ram_efficient_loading`` (the environment ``accelerate launch`` exports from
    configs/accelerate/fsdp-7b.yaml), a process group up, and a local rank other than 0.

    accelerate's FSDP2 preparation then moves the model to the meta device, shards it, and
    broadcasts rank 0's full state dict into the shards (``fsdp2_load_full_state_dict``), so the
    other processes' copies are never read. transformers 5 no longer skips the read on those
    processes itself (4.x did), so each would hold a full fp32 copy at start (7B: 30 GB each).
    """
    import torch.distributed as dist

    def flag(name: str) -> bool:
        return os.environ.get(name, "false").strip().lower() in ("1", "true", "yes")

    return (flag("ACCELERATE_USE_FSDP") and flag("FSDP_CPU_RAM_EFFICIENT_LOADING") and dist.is_available()
            and dist.is_initialized() and int(os.environ.get("LOCAL_RANK", "0")) != 0)


def _empty_model(path: Any, dtype: Any) -> Any:
    """The architecture of ``path`` with its parameters on the meta device (nothing read, nothing
    allocated) and its buffers real (the rotary tables: accelerate re-registers non-persistent
    buffers on the device after sharding, and those are not broadcast)."""
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(path)
    with init_empty_weights(include_buffers=False):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.tie_weights()  # accelerate's empty-weight hooks leave tied embeddings untied; from_pretrained ties them
    return model


def _loaded_on_meta(model: Any) -> bool:
    """True when the parameters are on the meta device (:func:`fsdp_broadcast_receiver`): moving
    them would fail (meta tensors have no data); accelerate places them when it shards."""
    return any(p.device.type == "meta" for p in model.parameters())


class HFPolicy:
    """A Hugging Face causal LM whose weights ES perturbs in place (PerturbablePolicy).

    restore: 'exact' | 'subtract' (see :mod:`esreason.es.params`).
    master_weights: 'auto' (fp32 masters for bf16/fp16 models), 'fp32', 'none'.
    direction_cache_mb: memory for re-using an update's directions (0 = regenerate).
    perturbation, rank: 'full' dense directions, or 'lowrank' A B^T / sqrt(rank) (es/lowrank.py).
    noise_device: draw update directions there instead of on the weights' device (a host-resident
        reference for GPU engines; update only, see :class:`esreason.es.params.CentredParameters`).
    anchor_decay: lambda of anchored ES (:mod:`esreason.es.anchor`); > 0 keeps the weights given as
        theta_0 (:meth:`load_anchor` replaces them by a saved theta_0).
    """

    def __init__(self, model: Any, tokenizer: Any, *, restore: str = "exact",
                 master_weights: str = "auto", direction_cache_mb: int = 256,
                 perturbation: str = "full", rank: int = 1, noise_device: Any = None,
                 anchor_decay: float = 0.0) -> None:
        self.model = model
        self.tokenizer = tokenizer
        dtype = next(model.parameters()).dtype
        master = master_weights == "fp32" or (master_weights == "auto" and dtype != torch.float32)
        self.params = CentredParameters(unique_named_parameters(model), restore=restore, master=master,
                                        cache_bytes=direction_cache_mb * 2**20,
                                        perturbation=perturbation, rank=rank, noise_device=noise_device,
                                        anchor_decay=anchor_decay)

    # PerturbablePolicy ------------------------------------------------------------
    def perturb(self, seed: int, sigma: float) -> None:
        self.params.perturb(seed, sigma)

    def restore(self) -> None:
        self.params.restore()

    def apply_update(self, seeds: Sequence[int], weights: Sequence[float], alpha: float,
                     sharding: Any = None) -> float:
        """centre += alpha/N sum_i w_i eps_i (replicated, or :class:`esreason.es.sharded.Sharding`)."""
        return self.params.apply_update(seeds, weights, alpha, sharding)

    def save(self, directory: str | Path) -> None:
        """HF checkpoint of the centre (model + tokenizer), plus fp32 masters (:data:`MASTER_FILE`) when kept."""
        directory = Path(directory)
        self.model.save_pretrained(directory)
        self.tokenizer.save_pretrained(directory)
        masters = self.params.master_state()
        if masters is not None:
            from safetensors.torch import save_file

            (directory / MASTER_FILE).parent.mkdir(parents=True, exist_ok=True)
            save_file({n: t.contiguous() for n, t in masters.items()}, str(directory / MASTER_FILE))

    def load_masters(self, directory: str | Path) -> bool:
        """Load the fp32 masters (:data:`MASTER_FILE`) from a checkpoint if present; returns whether it did."""
        path = master_file(directory)
        if self.params.master_state() is None or path is None:
            return False
        from safetensors.torch import load_file

        self.params.load_master_state(load_file(str(path)))
        return True

    def save_anchor(self, directory: str | Path) -> bool:
        """Write theta_0 (:data:`ANCHOR_FILE`, model dtype) into ``directory``; False without anchored ES."""
        anchor = self.params.anchor_state()
        if anchor is None:
            return False
        from safetensors.torch import save_file

        (Path(directory) / ANCHOR_FILE).parent.mkdir(parents=True, exist_ok=True)
        save_file({n: t.detach().cpu().contiguous() for n, t in anchor.items()}, str(Path(directory) / ANCHOR_FILE))
        return True

    def load_anchor(self, directory: str | Path) -> bool:
        """Replace theta_0 by ``directory``'s :data:`ANCHOR_FILE`, one tensor at a time; returns whether
        it did (False without anchored ES). UserError when anchored ES is on and the file is missing."""
        if self.params.anchor_state() is None:
            return False
        path = Path(directory) / ANCHOR_FILE
        if not path.is_file():
            raise UserError(f"{path} is missing: anchored ES (es.anchor_decay > 0) needs the run's start weights")
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as f:
            names = set(f.keys())
        anchor = self.params.anchor_state()
        missing = sorted(set(anchor) - names)
        if missing:
            raise UserError(f"{path}: no start weights for {missing[:3]}")
        for name, target in anchor.items():  # one tensor of the file at a time
            with safe_open(str(path), framework="pt") as f:
                t = f.get_tensor(name)
            if tuple(t.shape) != tuple(target.shape):
                raise UserError(f"{path}: {name!r} has shape {tuple(t.shape)}, the model's {tuple(target.shape)}")
            target.copy_(t)
        return True
