"""A GRPO training process's GPU memory, traced under the sharding it runs with, and what would make it fit.

:func:`grpo_roles`: the training micro-step and the generation-time scoring forward (the KL reference, the
old log-probabilities), each traced by :mod:`esreason.experiments.memtrace` under DDP or FSDP2 (the reference
as TRL 1.16 holds it: in its dtype, sharded as TRL shards it, none at beta 0). :func:`grpo_advice`: the keys
that change the figure, each with its figure, and the nodes that would fit (docs/planning.md).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from esreason.experiments.memplan_base import GIB, TERMS, Role, _bytes, _cached, prompt_tokens, verdict
from esreason.experiments.memtrace import Trace, trace_grpo_microstep, trace_grpo_scoring
from esreason.io.architectures import architecture, parameter_count


@lru_cache(maxsize=128)
def _grpo_trace(model: str, micro: int, prompt: int, completion: int, master: str, autocast: str | None,
                beta: float, checkpointing: bool, reference_dtype: str, sharding: str, processes: int) -> Trace:
    arch = architecture(model)
    args = dict(micro_batch=micro, prompt_len=prompt, completion_len=completion, master_dtype=master,
                autocast=autocast, beta=beta, gradient_checkpointing=checkpointing, reference_dtype=reference_dtype,
                sharding=sharding, processes=processes)
    return _cached("grpo", arch, args, lambda: trace_grpo_microstep(arch, **args))


@lru_cache(maxsize=128)
def _scoring_trace(model: str, micro: int, prompt: int, completion: int, master: str, autocast: str | None,
                   beta: float, reference_dtype: str, sharding: str, processes: int) -> Trace:
    arch = architecture(model)
    args = dict(micro_batch=micro, prompt_len=prompt, completion_len=completion, master_dtype=master,
                autocast=autocast, beta=beta, reference_dtype=reference_dtype, sharding=sharding,
                processes=processes)
    return _cached("grpo-scoring", arch, args, lambda: trace_grpo_scoring(arch, **args))


def reference_dtype(cfg: Any) -> str:
    """The dtype TRL 1.16 builds the KL reference in: ``grpo.reference_dtype``, 'policy' meaning ``dtype``
    (:func:`esreason.grpo.trainer.reference_init_kwargs`)."""
    return cfg.dtype if cfg.grpo.reference_dtype == "policy" else cfg.grpo.reference_dtype


def _layer_bytes(cfg: Any, width: int) -> float:
    arch = architecture(cfg.model)
    one, none = parameter_count({**arch, "num_hidden_layers": 1}), parameter_count({**arch, "num_hidden_layers": 0})
    return (one - none) * width


def _process_terms(r: Role, cfg: Any, procs: int, sharding: str, gradients: float) -> None:
    """The terms beside a GRPO process's trace: FSDP's prefetched unit or DDP's buckets."""
    if sharding == "fsdp":  # the unsharded dtype: bf16 under bf16 autocast (FSDP2's param_dtype), else the master's
        width = 2 if cfg.grpo.bf16 else _bytes(cfg.dtype)
        r.add("fsdp_gather", TERMS["fsdp_gather"][0] * _layer_bytes(cfg, width) / GIB, "configs/accelerate")
    elif procs > 1:
        r.add("ddp_buckets", TERMS["ddp_buckets"][0] * gradients, "configs/accelerate (FSDP)")


def grpo_roles(cfg: Any, procs: int, sharding: str, gpu_gib: float) -> list[Role]:
    """A GRPO training process's GPU (every process holds the same), in two phases, each traced under
    ``sharding`` ('ddp' or 'fsdp' over ``procs`` processes; :mod:`esreason.experiments.memtrace`):

    - the **training micro-step**: the policy's weights, gradients, AdamW states and activations, and the KL
      reference's weights where TRL keeps one (beta != 0; in :func:`reference_dtype`, sharded under FSDP);
    - the **scoring forward** TRL runs once per rollout batch, when beta != 0 (the reference) or when an
      update makes several optimizer steps (the old log-probabilities): no gradients, and under FSDP the
      reference all-gathered whole (TRL's prepare_fsdp wraps it as one unit).

    The worse of the two decides (:func:`verdict`)."""
    from esreason.grpo.plan import trl_forwards

    g = cfg.grpo
    prompt = prompt_tokens(cfg.task)
    autocast = "bfloat16" if g.bf16 else None
    micro, completion, ref = g.micro_batch_size, cfg.generation.max_new_tokens, reference_dtype(cfg)
    t = _grpo_trace(cfg.model, micro, prompt, completion, cfg.dtype, autocast, float(g.beta),
                    bool(g.gradient_checkpointing), ref, sharding, procs)
    r = Role("training process")
    r.add("parameters", t.parameters / GIB, "dtype, configs/accelerate (FSDP)")
    r.add("gradients", t.gradients / GIB, "configs/accelerate (FSDP)")
    r.add("optimizer", t.optimizer / GIB, "configs/accelerate (FSDP)")
    if t.reference:
        r.add("reference", t.reference / GIB, "grpo.beta, grpo.reference_dtype")
    if t.gathered:
        r.add("fsdp_unsharded", t.gathered / GIB, "-")
    r.add("activations", t.activations / GIB, "grpo.gradient_checkpointing, grpo.micro_batch_size, "
          "generation.max_new_tokens")
    _process_terms(r, cfg, procs, sharding, t.gradients / GIB)
    allocated = sum(r.terms.values())
    r.add("fragmentation", TERMS["fragmentation"][0] * allocated, "grpo.micro_batch_size")
    r.add("cuda_context", TERMS["cuda_context"][0], "-")
    colocate = g.use_vllm and g.vllm_mode == "colocate"
    if colocate:
        share = g.vllm_gpu_memory_utilization * gpu_gib
        if g.vllm_sleep:
            # Training runs with vLLM asleep; rollouts run with the training state resident (the
            # activations and DDP buckets' transient use freed). The role is the larger of the two.
            during_rollout = (r.terms["parameters"] + r.terms["gradients"] + r.terms["optimizer"]
                              + r.terms.get("reference", 0.0) + r.terms.get("ddp_buckets", 0.0)
                              + r.terms["cuda_context"] + share)
            during_train = r.total + TERMS["vllm_sleep_residual"][0]
            if during_rollout > during_train:
                r.add("vllm", share, "grpo.vllm_gpu_memory_utilization")
                for k in ("activations", "fragmentation", "fsdp_gather", "fsdp_unsharded"):
                    r.terms.pop(k, None)
            else:
                r.add("vllm_asleep", TERMS["vllm_sleep_residual"][0], "grpo.vllm_sleep")
        else:
            r.add("vllm", share, "grpo.vllm_gpu_memory_utilization, grpo.vllm_sleep")
    roles = [r]
    f = trl_forwards(cfg, 1)
    if f["reference"] or f["old_logps"]:
        sc = _scoring_trace(cfg.model, micro, prompt, completion, cfg.dtype, autocast, float(g.beta), ref,
                            sharding, procs)
        s = Role("training process, scoring forward")
        s.add("parameters", sc.parameters / GIB, "dtype, configs/accelerate (FSDP)")
        s.add("optimizer", sc.optimizer / GIB, "configs/accelerate (FSDP)")
        if sc.reference:
            s.add("reference", sc.reference / GIB, "grpo.beta, grpo.reference_dtype")
        if sc.gathered:  # FSDP: TRL's reference is one unit, all-gathered whole for its forward
            s.add("reference_gathered" if sc.reference else "fsdp_unsharded", sc.gathered / GIB,
                  "grpo.beta" if sc.reference else "-")
        s.add("scoring_forward", sc.activations / GIB, "grpo.beta, grpo.micro_batch_size")
        if sharding != "fsdp" and procs > 1:
            s.add("ddp_buckets", TERMS["ddp_buckets"][0] * t.gradients / GIB, "configs/accelerate (FSDP)")
        s.add("fragmentation", TERMS["fragmentation"][0] * s.total, "grpo.micro_batch_size")
        s.add("cuda_context", TERMS["cuda_context"][0], "-")
        if colocate:  # TRL puts vLLM to sleep right after generating, before it scores
            if g.vllm_sleep:
                s.add("vllm_asleep", TERMS["vllm_sleep_residual"][0], "grpo.vllm_sleep")
            else:
                s.add("vllm", g.vllm_gpu_memory_utilization * gpu_gib, "grpo.vllm_gpu_memory_utilization")
        roles.append(s)
    return roles


#: The most nodes :func:`grpo_advice` considers before it says that no number of nodes fits.
MAX_NODES = 64
#: The terms of a GRPO process that FSDP divides by the process count (the rest it holds whole).
SHARDED_TERMS = ("parameters", "gradients", "optimizer", "reference")


def _grpo_alternatives(cfg: Any) -> list[tuple[str, Any]]:
    """(the key's setting, the config with it) for each GRPO key that changes a training process's memory and
    is not already at its smallest: beta 0, the reference in bf16, micro-batch 1, activation checkpointing,
    vLLM asleep during training."""
    from dataclasses import replace

    g = cfg.grpo
    out = []

    def with_(**kw: Any) -> Any:
        return replace(cfg, grpo=replace(g, **kw))

    if g.beta != 0:
        out.append(("grpo.beta=0", with_(beta=0.0)))
        if _bytes(reference_dtype(cfg)) > 2:
            out.append(("grpo.reference_dtype=bfloat16", with_(reference_dtype="bfloat16")))
    if g.micro_batch_size > 1:
        out.append(("grpo.micro_batch_size=1", with_(micro_batch_size=1)))
    if not g.gradient_checkpointing:
        out.append(("grpo.gradient_checkpointing=true", with_(gradient_checkpointing=True)))
    if g.use_vllm and g.vllm_mode == "colocate" and not g.vllm_sleep:
        out.append(("grpo.vllm_sleep=true", with_(vllm_sleep=True)))
    return out


def _splits(cfg: Any, procs: int) -> bool:
    from esreason.errors import UserError
    from esreason.grpo.plan import check_divisible

    try:
        check_divisible(cfg, procs)
    except UserError:
        return False
    return True


def _scaled(roles: list[Role], p0: int, p: int) -> list[Role]:
    """``roles`` traced under FSDP on ``p0`` processes, moved to ``p``: the :data:`SHARDED_TERMS` scale by
    p0 / p, fragmentation with the allocated terms it is a share of, the rest stays (an estimate that
    :func:`nodes_to_fit` confirms by tracing at the answer)."""
    out = []
    for r in roles:
        x = Role(r.name, dict(r.terms), dict(r.keys), r.capacity_gib, r.capacity_key)
        before = sum(v for k, v in r.terms.items() if k not in ("fragmentation", "cuda_context", "vllm", "vllm_asleep"))
        for k in SHARDED_TERMS:
            if k in x.terms:
                x.terms[k] *= p0 / p
        after = sum(v for k, v in x.terms.items() if k not in ("fragmentation", "cuda_context", "vllm", "vllm_asleep"))
        if "fragmentation" in x.terms and before:
            x.terms["fragmentation"] *= after / before
        out.append(x)
    return out


def nodes_to_fit(cfg: Any, gpus_per_node: int, gpu_gib: float, max_nodes: int = MAX_NODES
                 ) -> tuple[int | None, list[Role]]:
    """The fewest nodes of ``gpus_per_node`` GPUs on which a GRPO process of ``cfg`` fits under FSDP (the batch
    must split over the processes: :func:`esreason.grpo.plan.check_divisible`), or None up to ``max_nodes``;
    and the roles at the answer (traced) or at ``max_nodes`` (estimated). The node count comes from the roles
    traced on one node with the sharded terms scaled (:func:`_scaled`), and is confirmed by a trace on it."""
    p0 = max(gpus_per_node, 2)  # traced under FSDP, as more than one node would run
    base = grpo_roles(cfg, p0, "fsdp", gpu_gib)
    for nodes in range(1, max_nodes + 1):
        procs = nodes * gpus_per_node
        if procs < 2 or not _splits(cfg, procs):
            continue
        if not verdict(_scaled(base, p0, procs), gpu_gib)["fits"]:
            continue
        for n in range(nodes, min(nodes + 3, max_nodes + 1)):  # confirm by a trace at the estimate
            if _splits(cfg, n * gpus_per_node):
                roles = grpo_roles(cfg, n * gpus_per_node, "fsdp", gpu_gib)
                if verdict(roles, gpu_gib)["fits"]:
                    return n, roles
        break
    return None, _scaled(base, p0, max_nodes * gpus_per_node)


def grpo_advice(cfg: Any, procs: int, sharding: str, gpu_gib: float, gpus_per_node: int) -> dict[str, Any]:
    """What would make a GRPO process of ``cfg`` fit, with the figure each gives: every key of
    :func:`_grpo_alternatives` that changes the total (by 0.05 GiB or more), on the same processes; and the
    fewest nodes of ``gpus_per_node`` GPUs that fit under FSDP as configured (None: none up to
    :data:`MAX_NODES`, with the terms every process holds whole whatever their number, and the nodes that
    would fit with beta 0)."""
    base = verdict(grpo_roles(cfg, procs, sharding, gpu_gib), gpu_gib)
    alternatives = []
    for key, alt in _grpo_alternatives(cfg):
        v = verdict(grpo_roles(alt, procs, sharding, gpu_gib), gpu_gib)
        if abs(v["total_gib"] - base["total_gib"]) >= 0.05:
            alternatives.append({"set": key, "total_gib": v["total_gib"], "fits": v["fits"]})
    nodes, roles = nodes_to_fit(cfg, gpus_per_node, gpu_gib)
    out: dict[str, Any] = {"alternatives": alternatives, "nodes_to_fit": nodes, "gpus_per_node": gpus_per_node}
    if nodes is None:  # what more GPUs do not shrink: the terms a process holds whole whatever P
        worst = max(roles, key=lambda r: r.total)
        fixed = {k: round(v, 1) for k, v in worst.terms.items() if k not in SHARDED_TERMS and v >= 0.05}
        out["at_max_nodes"] = {"nodes": MAX_NODES, "role": worst.name, "total_gib": round(worst.total, 1),
                               "unsharded_terms_gib": fixed}
        if cfg.grpo.beta != 0:
            from dataclasses import replace

            out["nodes_to_fit_beta0"] = nodes_to_fit(replace(cfg, grpo=replace(cfg.grpo, beta=0.0)),
                                                     gpus_per_node, gpu_gib)[0]
    return out


def advice_text(advice: dict[str, Any]) -> str:
    """One line: each key with its figure, then the nodes that would fit (or that none would, and why)."""
    parts = [f"{a['set']} -> {a['total_gib']:.1f} GiB ({'fits' if a['fits'] else 'does not fit'})"
             for a in advice["alternatives"]]
    n, per = advice["nodes_to_fit"], advice["gpus_per_node"]
    if n is not None:
        parts.append(f"`--nodes {n}` ({n * per} GPUs, FSDP) -> fits" if n > 1 else "fits on one node under FSDP")
    else:
        far = advice["at_max_nodes"]
        held = ", ".join(f"{k} {v:.1f}" for k, v in far["unsharded_terms_gib"].items())
        parts.append(f"no number of nodes up to {far['nodes']} fits: at {far['nodes']} nodes the {far['role']} still "
                     f"needs about {far['total_gib']:.1f} GiB that every process holds whole ({held} GiB)")
        if "nodes_to_fit_beta0" in advice:
            n0 = advice["nodes_to_fit_beta0"]
            parts.append("with grpo.beta=0: " + (f"`--nodes {n0}` ({n0 * per} GPUs) fits" if n0 is not None else
                                                "no number of nodes fits either"))
    return "; ".join(parts)


#: DDP is chosen only where its traced memory leaves at least this share of the GPU free.
DDP_MARGIN = 0.10


def grpo_verdict(cfg: Any, procs: int, sharding: str, gpu_gib: float, gpus_per_node: int | None = None
                 ) -> dict[str, Any]:
    """:func:`verdict` of a GRPO process, with :func:`grpo_advice` (``advice``) when it does not fit."""
    v = verdict(grpo_roles(cfg, procs, sharding, gpu_gib), gpu_gib)
    if not v["fits"]:
        v["advice"] = grpo_advice(cfg, procs, sharding, gpu_gib, gpus_per_node or procs)
    return v


def pick_sharding(cfg: Any, procs: int, gpu_gib: float) -> str:
    """DDP when one replica per GPU fits with :data:`DDP_MARGIN` to spare (traced, activations
    included), else FSDP (which shards parameters, gradients and optimizer states); DDP on one GPU.
    A replica whose weights, gradients and AdamW states alone exceed the GPU is FSDP without a trace."""
    if procs <= 1:
        return "ddp"
    params = parameter_count(architecture(cfg.model))
    if params * (2 * _bytes(cfg.dtype) + 8) > gpu_gib * GIB:  # weights + gradients + two fp32 moments
        return "fsdp"
    v = verdict(grpo_roles(cfg, procs, "ddp", gpu_gib), gpu_gib)
    return "ddp" if v["margin"] >= DDP_MARGIN else "fsdp"


__all__ = ["DDP_MARGIN", "MAX_NODES", "SHARDED_TERMS", "advice_text", "grpo_advice", "grpo_roles", "grpo_verdict",
           "nodes_to_fit", "pick_sharding", "reference_dtype"]
