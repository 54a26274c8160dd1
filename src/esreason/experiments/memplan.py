"""Device memory of every stage, per GPU, as named terms, and whether it fits.

Each stage has one or more *roles* (a GRPO training process; an ES engine; GPU 0 where the ES
trainer sits beside its engine; an evaluation engine). A role's memory is a sum of named terms:

- traced at the real shapes with fake tensors (:mod:`esreason.experiments.memtrace`): the step's
  peak ``parameters``, ``gradients``, ``optimizer`` states and ``activations`` (saved activations,
  temporaries, KV cache, logits);
- what a trace cannot see, each with its source in :data:`TERMS`: vLLM's reservation (its
  ``gpu_memory_utilization`` times the GPU), DDP's gradient buckets, FSDP's all-gather buffers, the
  CUDA context, the caching allocator's fragmentation.

A role fits a GPU when the sum is at most the GPU's memory; the *margin* is the share left
(``1 - total / capacity``). The verdict of a stage is its worst role; where it does not fit, it
names the largest term and the config key that changes it. ``esreason experiment run`` refuses a
stage that does not fit the GPU it sees (``--force`` overrides).
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from esreason.io.architectures import architecture, parameter_count
from esreason.experiments.memtrace import Trace, trace_forward, trace_grpo_microstep, trace_grpo_scoring

GIB = 2.0 ** 30

#: What torch reports for an H100 80GB HBM3 (``total_memory``, the ``cudaMemGetInfo`` total), GiB:
#: 79.11 in torch's out-of-memory message "GPU 0 has a total capacity of 79.11 GiB" on an H100
#: (vllm-project/vllm#27508; that message prints the cudaMemGetInfo total to 0.01 GiB). nvidia-smi
#: says 81,559 MiB = 79.65 GiB (docs/gpu-results/2026-11-28-h100/smi.txt), the driver's
#: figure, which torch never sees; the launcher decides with torch's figure (:func:`local_gpu`).
H100_TORCH_GIB = 79.11

#: What torch reports for an H200 (141 GB HBM3e), GiB: 139.80 in torch's out-of-memory messages
#: "GPU 5 has a total capacity of 139.80 GiB" on 8 x H200 (PrimeIntellect-ai/prime-rl,
#: benchmarks/results/BENCHMARKS.md, "Failed Benchmarks", the version of 2026-01-13). The same
#: figure derived from ours: nvidia-smi's 143,771 MiB on the lent H200 (140.40 GiB) less the
#: 0.54 GiB by which torch's figure is below nvidia-smi's on the H100 gives 139.86 GiB. The
#: acceptance run's preflight (scripts/gpu-acceptance.sh) records torch's own figure on the lent H200.
H200_TORCH_GIB = 139.80

#: GPU memory per GPU type, GiB: the H100 and the H200 as torch reports them (:data:`H100_TORCH_GIB`,
#: :data:`H200_TORCH_GIB`), the figure the launcher's sharding choice uses on those GPUs; the A100s
#: as ``nvidia-smi`` reports them (torch's figure unrecorded: lower, by 0.54 GiB on the H100).
GPU_MEMORY_GIB = {
    "h100": ("NVIDIA H100 80GB", H100_TORCH_GIB),
    "a100-40": ("NVIDIA A100 40GB", 40960 / 1024),
    "a100-80": ("NVIDIA A100 80GB", 81920 / 1024),
    "h200": ("NVIDIA H200", H200_TORCH_GIB),
}


def gpu_type_of(name: str) -> str | None:
    """The :data:`GPU_MEMORY_GIB` key of a GPU torch names (``torch.cuda.get_device_name``), or None:
    "NVIDIA H100 80GB HBM3" -> h100, "NVIDIA H200" -> h200, "NVIDIA A100-SXM4-40GB" -> a100-40."""
    n = name.upper().replace("-", " ")
    if "H200" in n:
        return "h200"
    if "H100" in n:
        return "h100"
    if "A100" in n:
        return "a100-40" if "40GB" in n.replace(" ", "") else "a100-80"
    return None

#: The terms a trace cannot see: (value, unit, source).
TERMS = {
    "cuda_context": (0.75, "GiB per process",
                     "assumption (ours): CUDA 12 context, cuBLAS/cuDNN workspaces and kernel images of one torch "
                     "process on an H100 (0.5-1 GiB is typical); scripts/gpu-check.sh prints the measured one"),
    "fragmentation": (0.10, "of the allocator's peak",
                      "assumption (ours): slack of PyTorch's caching allocator between reserved and allocated "
                      "memory for a training step with varying sequence lengths"),
    "ddp_buckets": (1.0, "x the gradients",
                    "PyTorch DDP docs (gradient_as_bucket_view): DDP's gradient buckets are a second copy of the "
                    "gradients unless viewed, which accelerate does not set"),
    "fsdp_gather": (1.0, "x one decoder layer's unsharded parameters",
                    "PyTorch FSDP2 (implicit forward / backward prefetch): the next unit is all-gathered while the "
                    "current one computes; the traced step (FSDP2 on a fake process group, one process, no "
                    "overlap) holds the current one"),
    "vllm_sleep_residual": (1.0, "GiB",
                            "assumption (ours): vLLM at sleep level 1 (weights offloaded, KV cache discarded) keeps "
                            "its CUDA graph pool and allocator slack"),
    "update_blocks": (3 * 16 / 1024, "GiB",
                      "esreason.es.noise: three 16 MiB noise blocks live during perturb / restore / update"),
    "vllm_runtime": (2.0, "GiB per engine",
                     "assumption (ours): inside vLLM's reservation beside weights and KV cache, its profiled "
                     "activation peak (max_num_batched_tokens) and CUDA-graph pool at 1.5B-7B; unmeasured"),
}

#: The longest chat-rendered prompt per task, tokens (assumption (ours) where not measured: the
#: paper's templates around the longest public problem; HotpotQA carries its context paragraphs).
PROMPT_TOKENS = {"hotpotqa": 2048, "gpqa": 512, "mbpp": 512, "gsm8k": 384, "math500": 512, "aime": 512,
                 "csqa": 256, "countdown": 256}
DEFAULT_PROMPT_TOKENS = 512


def prompt_tokens(tasks: Any) -> int:
    """The longest prompt among ``tasks`` (:data:`PROMPT_TOKENS`)."""
    names = [tasks] if isinstance(tasks, str) else list(tasks or [])
    return max([PROMPT_TOKENS.get(str(t).split("-")[0], DEFAULT_PROMPT_TOKENS) for t in names] or
               [DEFAULT_PROMPT_TOKENS])


@dataclass
class Role:
    """One GPU's memory in a stage: named terms (GiB) and the config key each answers to."""

    name: str
    terms: dict[str, float] = field(default_factory=dict)
    keys: dict[str, str] = field(default_factory=dict)
    capacity_gib: float | None = None
    """What the terms must fit in when not the whole GPU (one engine's vLLM reservation)."""
    capacity_key: str = "-"
    """The config key that changes ``capacity_gib``."""

    def add(self, term: str, gib: float, key: str) -> None:
        self.terms[term] = self.terms.get(term, 0.0) + gib
        self.keys[term] = key

    @property
    def total(self) -> float:
        return sum(self.terms.values())


def _bytes(dtype: str) -> int:
    return 2 if dtype in ("bfloat16", "float16") else 4


def _cache_dir() -> Path:
    """Where traces are kept between runs: ``ESREASON_CACHE_DIR`` or ``~/.cache/esreason``, under
    ``memtrace``."""
    root = os.environ.get("ESREASON_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "esreason")
    return Path(root) / "memtrace"


def _cached(kind: str, arch: dict[str, Any], args: dict[str, Any], trace: Any) -> Trace:
    """``trace()``, kept on disk under a key of everything it depends on: the architecture, the
    arguments, the tracer's source and the torch and transformers versions (a change to any traces
    again). A trace takes seconds; a plan makes a dozen."""
    import hashlib
    import inspect

    import torch
    import transformers

    from esreason.experiments import memtrace

    key = json.dumps([kind, arch, args, torch.__version__, transformers.__version__,
                      hashlib.sha256(inspect.getsource(memtrace).encode()).hexdigest()], sort_keys=True, default=str)
    path = _cache_dir() / (hashlib.sha256(key.encode()).hexdigest()[:32] + ".json")
    if path.is_file():
        try:
            return Trace(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            pass  # unreadable: trace again and overwrite
    out = trace()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(dataclasses.asdict(out)))
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only home: the plan still works, it traces every time
    return out


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


@lru_cache(maxsize=64)
def _forward_trace(model: str, batch: int, seq: int, dtype: str, kind: str) -> Trace:
    arch = architecture(model)
    args = dict(batch=batch, seq_len=seq, dtype=dtype, kind=kind)
    return _cached("forward", arch, args, lambda: trace_forward(arch, **args))


def reference_dtype(cfg: Any) -> str:
    """The dtype TRL 1.16 builds the KL reference in: ``grpo.reference_dtype``, 'policy' meaning ``dtype``
    (:func:`esreason.grpo.trainer.reference_init_kwargs`)."""
    return cfg.dtype if cfg.grpo.reference_dtype == "policy" else cfg.grpo.reference_dtype


def _layer_bytes(cfg: Any, width: int) -> float:
    arch = architecture(cfg.model)
    return (parameter_count({**arch, "num_hidden_layers": 1}) - parameter_count({**arch, "num_hidden_layers": 0})) * width


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


def es_masters_gib(cfg: Any) -> float:
    """GiB of the fp32 masters an ES run keeps for a bf16/fp16 model (0 for fp32, or with
    ``es.master_weights: none``)."""
    params = parameter_count(architecture(cfg.model))
    return 4 * params / GIB if _bytes(cfg.dtype) == 2 and cfg.es.master_weights != "none" else 0.0


def masters_fit_on_gpu(masters_gib: float, engine_fraction: float, gpu_gib: float) -> bool:
    """Whether an engine keeps its fp32 masters on the GPU: they fit outside vLLM's reservation
    with a 1 GiB + 20 % margin (the rule of ``vllm_worker._es_snapshot``), else pinned host memory."""
    return masters_gib * 1.2 + 1 <= (1 - engine_fraction) * gpu_gib


def engine_share_role(model: str, dtype: str, seq_tokens: int, share_gib: float, key: str, tp: int = 1) -> Role:
    """One vLLM engine's reservation (``gpu_memory_utilization`` x the GPU, split K ways under
    ``engines_per_gpu``) against what it must hold: the weights, vLLM's runtime and the KV cache of
    at least one sequence of ``seq_tokens`` (prompt + response; vLLM refuses to start below that).
    ``tp`` > 1: per GPU of a tensor-parallel engine (its shard of the weights and of the KV cache)."""
    from esreason.experiments import plan_tp

    arch = architecture(model)
    w = _bytes(dtype)
    r = Role("one engine's vLLM reservation" + (f" (per GPU of {tp})" if tp > 1 else ""), capacity_gib=share_gib,
             capacity_key=key)
    weights = parameter_count(arch) if tp == 1 else plan_tp.layout(model, tp)["held"]
    r.add("weights", w * weights / GIB, "dtype" + (", tensor_parallel_size" if tp > 1 else ""))
    r.add("vllm_runtime", TERMS["vllm_runtime"][0], "-")
    r.add("kv_one_sequence", _kv_bytes(arch, 1, seq_tokens, w) / plan_tp.kv_split(model, tp) / GIB,
          "generation.max_new_tokens")
    return r


def es_roles(cfg: Any, engines: int, gpu_gib: float, engine_fraction: float, trainer_gib: float) -> list[Role]:
    """An ES engine's GPU (its K engines with ``backend.engines_per_gpu``: together the one-engine
    reservation, each its own masters if they fit, noise blocks and CUDA context), one engine's
    reservation against its weights and a sequence's KV cache, and GPU 0 with the trainer beside its
    engines (vLLM backends); or the one GPU of the in-process HF sampler."""
    from esreason.experiments import plan_tp

    params = parameter_count(architecture(cfg.model))
    w = _bytes(cfg.dtype)
    masters = es_masters_gib(cfg)
    if cfg.backend.type in ("ray", "vllm"):
        k = getattr(cfg.backend, "engines_per_gpu", 1)
        tp = plan_tp.tp_of(cfg.backend)  # a rank's masters are its shards' (plan_tp.layout "held")
        masters *= plan_tp.layout(cfg.model, tp)["held"] / params if tp > 1 else 1.0
        key = "backend.engines_per_gpu" if k > 1 else "VLLMEngineOptions.gpu_memory_utilization (code default)"
        r = Role("ES engine" if k == 1 else f"GPU of {k} ES engines")
        r.add("vllm", engine_fraction * gpu_gib, key)
        if masters and masters_fit_on_gpu(k * masters, engine_fraction, gpu_gib):
            r.add("fp32_masters", k * masters, "es.master_weights" + (", backend.engines_per_gpu" if k > 1 else ""))
        r.add("update_blocks", k * TERMS["update_blocks"][0], "-")
        r.add("cuda_context", k * TERMS["cuda_context"][0], "-")
        gpu0 = Role(f"GPU 0: ES engine{'s' if k > 1 else ''} + trainer", dict(r.terms), dict(r.keys))
        gpu0.add("trainer", trainer_gib, "-")
        share = engine_share_role(cfg.model, cfg.dtype, prompt_tokens(cfg.task) + cfg.generation.max_new_tokens,
                                  engine_fraction / k * gpu_gib, key, tp)
        return [r, share, gpu0]
    prompt = prompt_tokens(cfg.task)
    t = _forward_trace(cfg.model, cfg.train.batch_size, prompt, cfg.dtype, "prefill")
    kv = _kv_bytes(architecture(cfg.model), cfg.train.batch_size, prompt + cfg.generation.max_new_tokens, w) / GIB
    r = Role("ES trainer (HF sampler)")
    r.add("parameters", t.parameters / GIB, "dtype")
    if masters:
        r.add("fp32_masters", masters, "es.master_weights")
    elif cfg.es.restore == "exact":
        r.add("centre_copy", w * params / GIB, "es.restore")
    r.add("activations", max(t.activations / GIB, kv), "train.batch_size, generation.max_new_tokens")
    r.add("fragmentation", TERMS["fragmentation"][0] * r.total, "train.batch_size")
    r.add("cuda_context", TERMS["cuda_context"][0], "-")
    return [r]


def _kv_bytes(arch: dict[str, Any], batch: int, seq: int, width: int) -> float:
    head_dim = arch.get("head_dim") or arch["hidden_size"] // arch["num_attention_heads"]
    return 2.0 * arch["num_hidden_layers"] * arch["num_key_value_heads"] * head_dim * batch * seq * width


def eval_roles(spec: Any, gpu_gib: float, utilization: float, dtype: str, tokens_per_forward: int) -> list[Role]:
    """An evaluation engine's GPU: vLLM's reservation + the entropy scorer's weights and forward
    (vLLM backend), or the HF sampler's model and KV cache."""
    p = spec.eval
    prompt = prompt_tokens(list(p.tasks))
    width = prompt + p.max_new_tokens
    model = spec.model
    if p.backend == "vllm":
        k = getattr(p, "engines_per_gpu", 1)  # K engines share the GPU: the reservation split K ways
        tp = int(getattr(p, "tensor_parallel_size", 1))  # the scorer's layers spread over the engine's TP GPUs
        rows = max(1, tokens_per_forward // width)
        t = _forward_trace(model, rows, width, dtype, "scorer")
        key = "eval.engines_per_gpu" if k > 1 else "eval gpu_memory_utilization (EvalEngineOptions)"
        r = Role("evaluation engine" if k == 1 else f"GPU of {k} evaluation engines")
        r.add("vllm", utilization * gpu_gib, key)
        r.add("scorer_weights", k * t.parameters / tp / GIB, "eval dtype, eval.tensor_parallel_size")
        r.add("scorer_activations", k * t.activations / GIB, "scorer tokens_per_forward")
        r.add("fragmentation", k * TERMS["fragmentation"][0] * t.total / GIB, "-")
        r.add("cuda_context", k * TERMS["cuda_context"][0], "-")
        return [r, engine_share_role(model, dtype, width, utilization / k * gpu_gib, key, tp)]
    rows = max(1, p.batch_size)
    t = _forward_trace(model, rows, prompt, dtype, "prefill")
    kv = _kv_bytes(architecture(model), rows, width, _bytes(dtype)) / GIB
    r = Role("evaluation (HF sampler)")
    r.add("parameters", t.parameters / GIB, "eval dtype")
    r.add("activations", max(t.activations / GIB, kv), "eval.batch_size, eval.max_new_tokens")
    r.add("fragmentation", TERMS["fragmentation"][0] * r.total, "eval.batch_size")
    r.add("cuda_context", TERMS["cuda_context"][0], "-")
    return [r]


def verdict(roles: list[Role], gpu_gib: float) -> dict[str, Any]:
    """Fits / does not fit on a GPU of ``gpu_gib``: the worst role, its margin, and where it does
    not fit the largest term and the key that changes it."""
    def cap(r: Role) -> float:
        return r.capacity_gib if r.capacity_gib is not None else gpu_gib

    worst = max(roles, key=lambda r: r.total / cap(r))
    margin = 1.0 - worst.total / cap(worst)
    out: dict[str, Any] = {"fits": worst.total <= cap(worst), "margin": round(margin, 4), "role": worst.name,
                           "total_gib": round(worst.total, 2), "capacity_gib": round(cap(worst), 2)}
    if not out["fits"] and worst.capacity_key != "-":  # the budget is what to change (an engine's share)
        term = max(worst.terms, key=lambda k: worst.terms[k])
        out.update(term=term, term_gib=round(worst.terms[term], 2), key=worst.capacity_key)
    elif not out["fits"]:
        changeable = {k: v for k, v in worst.terms.items() if worst.keys.get(k, "-") != "-"}
        term = max(changeable or worst.terms, key=lambda k: worst.terms[k])
        out.update(term=term, term_gib=round(worst.terms[term], 2), key=worst.keys.get(term, "-"))
    return out


def roles_json(roles: list[Role]) -> list[dict[str, Any]]:
    return [{"role": r.name, "terms_gib": {k: round(v, 2) for k, v in r.terms.items()},
             "total_gib": round(r.total, 2),
             **({"capacity_gib": round(r.capacity_gib, 2)} if r.capacity_gib is not None else {})} for r in roles]


def local_gpu() -> tuple[str, float] | None:
    """(name, GiB) of the GPU torch sees, or None: the capacity the launcher's sharding choice and
    ``experiment run``'s memory check both use (``total_memory``)."""
    import torch

    if not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(0)
    return props.name, props.total_memory / GIB



def load_run_config(path: Any, overrides: tuple[str, ...] = ()) -> Any:
    """An ES or GRPO run config (GRPO when the file has a ``grpo:`` section)."""
    import yaml

    data = yaml.safe_load(open(path)) or {}
    if "grpo" in data:
        from esreason.grpo.config import load_grpo_config

        return load_grpo_config(path, overrides)
    from esreason.config import load_config

    return load_config(path, overrides)


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
    included), else FSDP (which shards parameters, gradients and optimizer states); DDP on one GPU."""
    if procs <= 1:
        return "ddp"
    v = verdict(grpo_roles(cfg, procs, "ddp", gpu_gib), gpu_gib)
    return "ddp" if v["margin"] >= DDP_MARGIN else "fsdp"


def run_config_roles(cfg: Any, gpus: int, gpu_gib: float) -> list[Role]:
    """The GPU roles of one run config on ``gpus`` GPUs of ``gpu_gib`` each (as the runner lays
    it out: GRPO one process per GPU under accelerate, DDP or FSDP as launch.choose_sharding picks;
    ES engines as its backend says)."""
    from esreason.experiments import plan_table as tab

    if not str(cfg.device).startswith("cuda"):
        return []
    if hasattr(cfg, "grpo"):
        return grpo_roles(cfg, gpus, pick_sharding(cfg, gpus, gpu_gib), gpu_gib)
    engines = min(cfg.backend.engines, gpus) if cfg.backend.type == "ray" else 1
    return es_roles(cfg, engines, gpu_gib, tab.CONSTANTS["engine_memory_fraction"].value,
                    tab.CONSTANTS["trainer_gpu_gib"].value)


def training_configs(spec: Any) -> list[tuple[str, str, Any]]:
    """(stage, kind, run config) of every training config ``spec`` runs: ``train (es)``, ``train (grpo)`` for
    configs.grpo and ``train (<method>)`` for a GRPO method with its own config (a variant; GRPO under
    ``match: rollouts | compute``), each distinct config once."""
    kinds = spec.trained_kinds()
    out: list[tuple[str, str, Any]] = []
    if "es" in kinds and spec.es is not None:
        out.append(("train (es)", "es", spec.es))
    seen: list[Any] = []
    for m in spec.methods:
        if m.kind not in ("grpo", "es_grpo", "grpo_es"):
            continue
        cfg = spec.stage_config(m, "grpo")
        if cfg is None or any(cfg == c for c in seen):
            continue
        seen.append(cfg)
        out.append(("train (grpo)" if cfg is spec.grpo else f"train ({m.name})", "grpo", cfg))
    return out


def experiment_roles(spec: Any, gpus: int, gpu_gib: float) -> list[tuple[str, list[Role]]]:
    """``[(stage, roles)]`` for every kind of stage ``spec`` runs on GPUs: its ES and GRPO training
    configs (:func:`training_configs`) and its evaluation (stages on the CPU have no roles and are left out).
    ``spec``: an :class:`esreason.experiments.spec.ExperimentSpec` (its ``trained_kinds`` and ``eval_settings``)."""
    from esreason.backends.vllm_eval import EvalEngineOptions
    from esreason.backends.scoring import TOKENS_PER_FORWARD

    out = []
    for stage, _, cfg in training_configs(spec):
        roles = run_config_roles(cfg, gpus, gpu_gib)
        if roles:
            out.append((stage, roles))
    device, dtype = spec.eval_settings()
    if str(device).startswith("cuda"):
        util = EvalEngineOptions.__dataclass_fields__["gpu_memory_utilization"].default
        out.append(("eval", eval_roles(spec, gpu_gib, util, dtype, TOKENS_PER_FORWARD)))
    return out


def check_fits(spec: Any, gpus: int, gpu_name: str, gpu_gib: float) -> None:
    """Raise UserError (one line: the stage, the term, the key; for GRPO the keys that would change the
    figure, each with its figure, and the nodes that would fit) when a stage does not fit."""
    from esreason.errors import UserError

    configs = {stage: (kind, cfg) for stage, kind, cfg in training_configs(spec)}
    for stage, roles in experiment_roles(spec, gpus, gpu_gib):
        v = verdict(roles, gpu_gib)
        if v["fits"]:
            continue
        kind, cfg = configs.get(stage, (None, None))
        if kind == "grpo":
            advice = grpo_advice(cfg, gpus, pick_sharding(cfg, gpus, gpu_gib), gpu_gib, gpus)
            raise UserError(f"stage {stage} does not fit {gpu_name}: {v['role']} needs {v['total_gib']:.1f} GiB of "
                            f"{gpu_gib:.1f} (largest term: {v['term']} {v['term_gib']:.1f} GiB); would change it: "
                            f"{advice_text(advice)}; `esreason experiment plan` shows every term; --force runs anyway")
        raise UserError(f"stage {stage} does not fit {gpu_name}: {v['role']} needs {v['total_gib']:.1f} GiB of "
                        f"{gpu_gib:.1f} (largest term: {v['term']} {v['term_gib']:.1f} GiB; change "
                        f"{v['key']}); `esreason experiment plan` shows every term; --force runs anyway")
