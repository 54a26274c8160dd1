"""Host RAM, pinned memory and disk of one node per stage: the host side of
:mod:`esreason.experiments.memplan`, whose GPU roles and verdicts it shares."""

from __future__ import annotations

from typing import Any

from esreason.io.architectures import architecture, parameter_count
from esreason.experiments.memplan import GIB, Role, _bytes, es_masters_gib, masters_fit_on_gpu


#: Host-side terms no trace sees: (value, unit, source).
HOST_TERMS = {
    "process": (3.0, "GiB per torch process",
                "assumption (ours): Python, torch and CUDA host-side allocations of one process (2-4 GiB typical)"),
    "vllm_engine_process": (6.0, "GiB per vLLM engine",
                            "assumption (ours): the engine core process, its worker and tokenizer processes "
                            "(vLLM's V1 engine runs the model in a child process)"),
    "node_ram": (2048.0, "GiB",
                 "NVIDIA DGX H100 system memory (2 TB); an 8-GPU cloud node has 1-2 TiB"),
}


def largest_tensor_elements(arch: dict[str, Any]) -> int:
    """Elements of the largest weight matrix of ``arch``: the embedding (or head), an MLP matrix or
    the attention's q / o projection."""
    h, heads = arch["hidden_size"], arch["num_attention_heads"]
    head_dim = arch.get("head_dim") or h // heads
    return max(arch["vocab_size"] * h, arch["intermediate_size"] * h, heads * head_dim * h)


def engine_start_host_bytes(arch: dict[str, Any], dtype: str, master_weights: str, restore: str,
                            centre_on_host: bool) -> dict[str, int]:
    """Host bytes one ES engine holds at start beyond its process, by term.

    ``centre``: the centre copy when it lives in host memory (pinned beside a GPU that has no room
    for it, or a CPU engine): fp32 masters for a bf16/fp16 model (``es.master_weights``), else the
    model-dtype copy that exact restore needs. ``load_tensor``: the engine reads its start state
    (passed by path, never as bytes) one tensor at a time (``ckpt_layout.read_region``), and the
    largest tensor's file pages are what it holds beside the centre meanwhile. The model's own
    weights are not here: on a GPU engine they live on the device; on a CPU engine (the twin) they
    are part of the model vLLM built before the start state is read.
    """
    params = parameter_count(arch)
    w = _bytes(dtype)
    masters = (w == 2 and master_weights != "none") or master_weights == "fp32"
    item = 4 if masters else w
    centre = params * item if centre_on_host and (masters or restore == "exact") else 0
    return {"centre": centre, "load_tensor": largest_tensor_elements(arch) * item}


def _host_block(ram: Role, pinned: Role, disk: Role) -> dict[str, Any]:
    def terms(r: Role) -> dict[str, float]:
        return {k: round(v, 2) for k, v in r.terms.items()}

    node = HOST_TERMS["node_ram"][0]
    return {"host_ram_gib": terms(ram), "host_ram_total_gib": round(ram.total, 1),
            "pinned_gib": terms(pinned), "pinned_total_gib": round(pinned.total, 1),
            "disk_gib": terms(disk), "disk_total_gib": round(disk.total, 1),
            "node_ram_gib": node, "host_fits": ram.total <= node,
            "keys": {**ram.keys, **pinned.keys, **disk.keys}}


def _checkpoints(cfg: Any, updates: int) -> int:
    """How many checkpoints a run of ``updates`` keeps on disk at most (``checkpoint.every``, ``keep_last``)."""
    every = cfg.checkpoint.every
    n = 1 if not every else max(1, -(-updates // every))
    return min(n, cfg.checkpoint.keep_last) if cfg.checkpoint.keep_last else n


def es_host(cfg: Any, engines: int, gpu_gib: float, engine_fraction: float, updates: int) -> dict[str, Any]:
    """Host RAM, pinned memory and disk of one node for an ES stage: the trainer's state (weights,
    fp32 masters, the exact-restore centre, the direction cache), one process per vLLM engine, the
    masters each engine pins when they do not fit beside vLLM's reservation (exactly their bytes:
    :class:`esreason.backends.pinned.PinnedArena`), the start state written once per node
    (:func:`esreason.backends.engine.shared_state_dir`) and the checkpoints kept. Each engine reads
    the start state from that copy one tensor at a time (:func:`engine_start_host_bytes`); the trainer
    holds the start state's bytes while the engines start (``trainer_start_state``)."""
    params = parameter_count(architecture(cfg.model))
    w = _bytes(cfg.dtype)
    masters = es_masters_gib(cfg)
    ram, pinned, disk = Role("host RAM"), Role("pinned"), Role("disk")
    ram.add("trainer_weights", w * params / GIB, "dtype")
    if masters:
        ram.add("trainer_masters", masters, "es.master_weights")
    elif cfg.es.restore == "exact":
        ram.add("trainer_centre", w * params / GIB, "es.restore")
    ram.add("direction_cache", cfg.es.direction_cache_mb / 1024, "es.direction_cache_mb")
    anchor = w * params / GIB if getattr(cfg.es, "anchor_decay", 0) > 0 else 0.0  # theta_0 (docs/anchored-es.md)
    if anchor:
        ram.add("trainer_anchor", anchor, "es.anchor_decay")
    ram.add("processes", HOST_TERMS["process"][0], "-")
    if cfg.backend.type in ("ray", "vllm"):
        ram.add("engine_processes", engines * HOST_TERMS["vllm_engine_process"][0], "backend.engines")
        from esreason.experiments.memplan_engines import engines_per_gpu

        pinned_masters = bool(masters) and not masters_fit_on_gpu(
            engines_per_gpu(cfg, gpu_gib) * masters, engine_fraction, gpu_gib)
        start = engine_start_host_bytes(architecture(cfg.model), cfg.dtype, cfg.es.master_weights, cfg.es.restore,
                                        centre_on_host=pinned_masters)
        if pinned_masters:
            pinned.add("engine_masters", engines * start["centre"] / GIB, "es.master_weights, backend.engines")
            ram.add("engine_masters_pinned", engines * start["centre"] / GIB, "es.master_weights, backend.engines")
        ram.add("engine_load_tensor", engines * start["load_tensor"] / GIB, "backend.engines")
        # The trainer builds the pool's start state as bytes (backends.engine.policy_state: weights
        # and masters read back from a temporary save) and holds them while the engines start.
        ram.add("trainer_start_state", w * params / GIB + masters + anchor, "- (while the engines start)")
        disk.add("start_state", (w * params / GIB + masters + anchor), "- (once per node)")
        if anchor:  # theta_0 in each engine's host memory, page-locked beside a GPU (vllm_worker)
            key = "es.anchor_decay, backend.engines"
            if cfg.device.startswith("cuda"):
                pinned.add("engine_anchor", engines * anchor, key)
            ram.add("engine_anchor_pinned" if cfg.device.startswith("cuda") else "engine_anchor", engines * anchor, key)
    disk.add("checkpoints", _checkpoints(cfg, updates) * (w * params / GIB + masters),
             "checkpoint.every, checkpoint.keep_last")
    if anchor:
        disk.add("anchor", anchor, "es.anchor_decay (RUN/anchor: theta_0 once per run)")
    return _host_block(ram, pinned, disk)


def grpo_host(cfg: Any, procs: int, sharding: str, updates: int) -> dict[str, Any]:
    """Host RAM and disk of one node for a GRPO stage. At start every process reads the policy on
    the CPU before accelerate places it, except under FSDP with ``fsdp_cpu_ram_efficient_loading``
    (configs/accelerate/fsdp-7b.yaml), where only local rank 0 reads it and the others hold meta
    parameters until the broadcast (``backends.hf.fsdp_broadcast_receiver``). TRL reads its
    reference model on every process (it shards it without a broadcast). A checkpoint gathers the full
    weights on rank 0's host; on disk it is our step_N (the save dtype) plus TRL's own (weights,
    AdamW moments)."""
    params = parameter_count(architecture(cfg.model))
    w = _bytes(cfg.dtype)
    readers = 1 if sharding == "fsdp" else procs
    ram, pinned, disk = Role("host RAM"), Role("pinned"), Role("disk")
    ram.add("load_policy", readers * w * params / GIB, "configs/accelerate (fsdp_cpu_ram_efficient_loading)")
    if float(cfg.grpo.beta) != 0.0:  # TRL builds the reference on every process (no broadcast)
        ram.add("load_reference", procs * w * params / GIB, "grpo.beta")
    ram.add("checkpoint_gather", w * params / GIB, "-")
    ram.add("processes", procs * HOST_TERMS["process"][0], "-")
    if cfg.grpo.use_vllm and cfg.grpo.vllm_mode == "colocate":
        ram.add("vllm_colocated", procs * HOST_TERMS["vllm_engine_process"][0], "grpo.use_vllm")
    save_dtype = str(cfg.checkpoint.save_dtype)
    if save_dtype == "base":  # the base model's own dtype (its config.json)
        arch = architecture(cfg.model)
        save_dtype = str(arch.get("torch_dtype") or arch.get("dtype") or "float32")
    ours = _checkpoints(cfg, updates)
    disk.add("checkpoints", ours * _bytes(save_dtype) * params / GIB, "checkpoint.every, checkpoint.keep_last")
    # TRL's RUN/trl/checkpoint-*: the weights and AdamW's two fp32 moments, the newest keep_trainer_states
    disk.add("trainer_states", min(ours, cfg.checkpoint.keep_trainer_states) * (w + 8) * params / GIB,
             "checkpoint.keep_trainer_states")
    return _host_block(ram, pinned, disk)


def eval_host(spec: Any, engines: int) -> dict[str, Any]:
    """Host RAM of one node for evaluation: one process per vLLM engine (the HF sampler: this one)."""
    ram, pinned, disk = Role("host RAM"), Role("pinned"), Role("disk")
    ram.add("processes", HOST_TERMS["process"][0], "-")
    if spec.eval.backend == "vllm":
        ram.add("engine_processes", engines * HOST_TERMS["vllm_engine_process"][0], "eval.engines")
    return _host_block(ram, pinned, disk)
