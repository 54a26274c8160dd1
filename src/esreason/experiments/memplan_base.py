"""The machinery of the memory plan (:mod:`esreason.experiments.memplan`): GPU sizes, the named terms a trace
cannot see (:data:`TERMS`), prompt lengths, a role's terms (:class:`Role`) and its verdict, and the on-disk
cache of traces."""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from esreason.experiments.memtrace import Trace

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


__all__ = ["DEFAULT_PROMPT_TOKENS", "GIB", "GPU_MEMORY_GIB", "H100_TORCH_GIB", "H200_TORCH_GIB", "PROMPT_TOKENS",
           "Role", "TERMS", "gpu_type_of", "prompt_tokens", "roles_json", "verdict"]
