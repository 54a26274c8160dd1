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

from functools import lru_cache
from typing import Any

from esreason.io.architectures import architecture, parameter_count
from esreason.experiments.memtrace import Trace, trace_forward
# The machinery (memplan_base) and the GRPO process's roles (memplan_grpo) live beside; their names are
# this module's too (__all__).
from esreason.experiments.memplan_base import (DEFAULT_PROMPT_TOKENS, GIB, GPU_MEMORY_GIB, H100_TORCH_GIB,
                                               H200_TORCH_GIB, PROMPT_TOKENS, TERMS, Role, _bytes, _cached,
                                               gpu_type_of, prompt_tokens, roles_json, verdict)
from esreason.experiments.memplan_grpo import (DDP_MARGIN, advice_text, grpo_advice, grpo_roles, grpo_verdict,
                                               nodes_to_fit, pick_sharding, reference_dtype)

@lru_cache(maxsize=64)
def _forward_trace(model: str, batch: int, seq: int, dtype: str, kind: str) -> Trace:
    arch = architecture(model)
    args = dict(batch=batch, seq_len=seq, dtype=dtype, kind=kind)
    return _cached("forward", arch, args, lambda: trace_forward(arch, **args))


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


def memory_verdicts(roles_at: Any, host_at: Any, gpu_type: str) -> dict[str, Any]:
    """A plan stage's roles (``roles_at(gib)``) at ``gpu_type`` and a verdict for every GPU type (and the
    local GPU); ``host_at(gib)``: its host side per node, or None."""
    if roles_at is None:
        return {}
    gpus = dict(GPU_MEMORY_GIB)
    local = local_gpu()
    if local is not None:
        gpus["local"] = local
    plan_gib = GPU_MEMORY_GIB.get(gpu_type, gpus["h100"])[1]
    roles = roles_at(plan_gib)
    if not roles:
        return {"on_gpu": False}
    verdicts = {}
    for key, (label, gib) in gpus.items():
        verdicts[key] = {"gpu": label, **verdict(roles_at(gib), gib)}
    out = {"on_gpu": True, "gpu_type": gpu_type, "roles": roles_json(roles), "verdicts": verdicts}
    if host_at is not None:  # per node: host RAM, pinned memory, disk
        out["host"] = host_at(plan_gib)
    return out


__all__ = ["DDP_MARGIN", "DEFAULT_PROMPT_TOKENS", "GIB", "GPU_MEMORY_GIB", "H100_TORCH_GIB", "H200_TORCH_GIB",
           "PROMPT_TOKENS", "Role", "TERMS", "advice_text", "check_fits", "engine_share_role", "es_masters_gib",
           "es_roles", "eval_roles", "experiment_roles", "gpu_type_of", "grpo_advice", "grpo_roles", "grpo_verdict",
           "load_run_config", "local_gpu", "memory_verdicts", "masters_fit_on_gpu", "nodes_to_fit", "pick_sharding", "prompt_tokens",
           "reference_dtype", "roles_json", "run_config_roles", "training_configs", "verdict"]
