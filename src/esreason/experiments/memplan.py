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
from esreason.experiments.memtrace import Trace, trace_forward, trace_grpo_microstep

GIB = 2.0 ** 30

#: What torch reports for an H100 80GB HBM3 (``total_memory``, the ``cudaMemGetInfo`` total), GiB:
#: 79.11 in torch's out-of-memory message "GPU 0 has a total capacity of 79.11 GiB" on an H100
#: (vllm-project/vllm#27508; that message prints the cudaMemGetInfo total to 0.01 GiB). nvidia-smi
#: says 81,559 MiB = 79.65 GiB (/work/shared/gpu-results/2026-11-28-h100/smi.txt), the driver's
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
    "fsdp_gather": (2.0, "x one decoder layer's unsharded parameters",
                    "PyTorch FSDP (forward prefetch / backward prefetch): the current and the next unit are "
                    "all-gathered at once"),
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


@lru_cache(maxsize=64)
def _grpo_trace(model: str, micro: int, prompt: int, completion: int, master: str, autocast: str | None,
                beta: float, checkpointing: bool) -> Trace:
    arch = architecture(model)
    args = dict(micro_batch=micro, prompt_len=prompt, completion_len=completion, master_dtype=master,
                autocast=autocast, beta=beta, gradient_checkpointing=checkpointing)
    return _cached("grpo", arch, args, lambda: trace_grpo_microstep(arch, **args))


@lru_cache(maxsize=64)
def _forward_trace(model: str, batch: int, seq: int, dtype: str, kind: str) -> Trace:
    arch = architecture(model)
    args = dict(batch=batch, seq_len=seq, dtype=dtype, kind=kind)
    return _cached("forward", arch, args, lambda: trace_forward(arch, **args))


def grpo_roles(cfg: Any, procs: int, sharding: str, gpu_gib: float) -> list[Role]:
    """The GRPO training process's GPU (every process holds the same)."""
    g = cfg.grpo
    prompt = prompt_tokens(cfg.task)
    autocast = "bfloat16" if g.bf16 else None
    t = _grpo_trace(cfg.model, g.micro_batch_size, prompt, cfg.generation.max_new_tokens, cfg.dtype, autocast,
                    float(g.beta), bool(g.gradient_checkpointing))
    r = Role("training process")
    shard = procs if sharding == "fsdp" else 1
    r.add("parameters", t.parameters / shard / GIB, "dtype / configs/accelerate (FSDP)")
    r.add("gradients", t.gradients / shard / GIB, "configs/accelerate (FSDP)")
    r.add("optimizer", t.optimizer / shard / GIB, "configs/accelerate (FSDP)")
    r.add("activations", t.activations / GIB, "grpo.gradient_checkpointing, grpo.micro_batch_size, "
          "generation.max_new_tokens")
    if sharding == "fsdp":
        arch = architecture(cfg.model)
        layer = (parameter_count({**arch, "num_hidden_layers": 1}) - parameter_count({**arch, "num_hidden_layers": 0}))
        r.add("fsdp_gather", TERMS["fsdp_gather"][0] * layer * _bytes(cfg.dtype) / GIB, "configs/accelerate")
    elif procs > 1:
        r.add("ddp_buckets", TERMS["ddp_buckets"][0] * t.gradients / GIB, "configs/accelerate (FSDP)")
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
                              + r.terms.get("ddp_buckets", 0.0) + r.terms["cuda_context"] + share)
            during_train = r.total + TERMS["vllm_sleep_residual"][0]
            if during_rollout > during_train:
                r.add("vllm", share, "grpo.vllm_gpu_memory_utilization")
                for k in ("activations", "fragmentation", "fsdp_gather"):
                    r.terms.pop(k, None)
            else:
                r.add("vllm_asleep", TERMS["vllm_sleep_residual"][0], "grpo.vllm_sleep")
        else:
            r.add("vllm", share, "grpo.vllm_gpu_memory_utilization, grpo.vllm_sleep")
    return [r]


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
        if not isinstance(k, int):  # ``auto`` depends on the GPU: memplan_engines.resolve(cfg, gpu_gib) first
            raise TypeError(f"backend.engines_per_gpu={k!r}: resolve it for the GPU first (memplan_engines.resolve)")
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


def experiment_roles(spec: Any, gpus: int, gpu_gib: float) -> list[tuple[str, list[Role]]]:
    """``[(stage, roles)]`` for every kind of stage ``spec`` runs on GPUs: its ES and GRPO training
    configs and its evaluation (stages on the CPU have no roles and are left out). ``spec``: an
    :class:`esreason.experiments.spec.ExperimentSpec` (its ``trained_kinds`` and ``eval_settings``)."""
    from esreason.backends.vllm_eval import EvalEngineOptions
    from esreason.backends.scoring import TOKENS_PER_FORWARD

    kinds = spec.trained_kinds()
    out = []
    for kind, cfg in (("es", spec.es), ("grpo", spec.grpo)):
        if kind in kinds and cfg is not None:
            roles = run_config_roles(cfg, gpus, gpu_gib)
            if roles:
                out.append((f"train ({kind})", roles))
    device, dtype = spec.eval_settings()
    if str(device).startswith("cuda"):
        util = EvalEngineOptions.__dataclass_fields__["gpu_memory_utilization"].default
        out.append(("eval", eval_roles(spec, gpu_gib, util, dtype, TOKENS_PER_FORWARD)))
    return out


def check_fits(spec: Any, gpus: int, gpu_name: str, gpu_gib: float) -> None:
    """Raise UserError (one line: the stage, the term, the key) when a stage does not fit."""
    from esreason.errors import UserError

    for stage, roles in experiment_roles(spec, gpus, gpu_gib):
        v = verdict(roles, gpu_gib)
        if not v["fits"]:
            raise UserError(f"stage {stage} does not fit {gpu_name}: {v['role']} needs {v['total_gib']:.1f} GiB of "
                            f"{gpu_gib:.1f} (largest term: {v['term']} {v['term_gib']:.1f} GiB; change "
                            f"{v['key']}); `esreason experiment plan` shows every term; --force runs anyway")
