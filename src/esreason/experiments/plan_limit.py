"""The limit beside the method: an ES update against plain inference of the same sequences.

Every ES stage of ``esreason experiment plan`` carries a ``limit`` block (per update, seconds):

- ``inference_s``: **plain batched inference** of the update's N x B sequences on the stage's GPUs,
  one engine per GPU (or per tensor-parallel group), each engine's share in **one call** that waits
  once for the longest of all N x B responses (one tail per engine; the engines finish together),
  at most ``MAX_NUM_SEQS`` rows decoding at once.
  Same step model as the ES terms (:func:`esreason.experiments.plan_terms.call_s`), so the ratio
  compares the method with the physical limit of this workload under one set of assumptions.
- ``update_s`` and ``ratio``: the planned ES update (generation, perturb / restore / update, TP
  all-reduces) and ``update_s / inference_s``.
- ``lowrank_batch_s`` and ``lowrank_ratio``: the **low-rank members in one vLLM batch** mode priced
  on the same GPUs: each member a rank-r LoRA adapter of the engine's base weights, so an engine
  runs all its members' requests in one call (one tail per engine, as plain inference), at
  ``1 + lora_token_overhead`` times the time per token (a cited figure: plan_table), plus loading
  each member's adapter (``lora_adapter_load_s``) and applying the update sum_i z_i A_i B_i^T to the
  base weights and fp32 masters once (the ``apply`` bytes of benchmarks/noise.py's cost model; no
  per-member perturb or restore). ``None`` for the in-process HF backends, which have no LoRA path.

The HF backends (``hf``, ``batched``) have a throughput figure but no step model: their plain
inference is the same tokens at the same rate, so their ratio is (decode + update) / decode.
"""

from __future__ import annotations

import math
from typing import Any

from esreason.experiments import plan_table as tab
from esreason.experiments import plan_terms, plan_tp

#: Bytes per parameter of applying one update (the ``apply`` of plan.BYTES_PER_PARAM: benchmarks/noise.py).
APPLY_BYTES_PER_PARAM = 48
#: Rows a vLLM engine decodes at once (its default ``max_num_seqs``; plan.STREAM_WAVE): an engine's
#: share beyond it waits for free slots, which continuous batching refills as rows end.
MAX_NUM_SEQS = 256


def inference_s(ctx: Any, cfg: Any, engines: int, tp: int) -> tuple[float, int]:
    """(seconds, rows per engine) of plain inference of one update's N x B sequences on ``engines``
    engines of ``tp`` GPUs: one call per engine, waiting for the longest of all N x B responses. An
    engine's share beyond MAX_NUM_SEQS rows decodes MAX_NUM_SEQS at a time, slots refilled as rows end
    (the extra rows add decode steps, not tails)."""
    n, b = cfg.es.population_size, cfg.train.batch_size
    rows = math.ceil(n * b / engines)
    wave, cap = min(rows, MAX_NUM_SEQS), cfg.generation.max_new_tokens
    decode, tail = plan_terms.call_s(ctx, wave, ctx.note(tab.prompt_tokens(cfg.task)), cap, n * b,
                                     cfg.generation.temperature > 0, tp)
    steps = ctx.longest(n * b, cap) + (rows / wave - 1) * ctx.length(cap)
    return decode * rows / wave + tail + steps * plan_tp.allreduce_s(ctx, cfg.model, wave, tp), rows


def lowrank_update_s(ctx: Any, cfg: Any, engines: int, tp: int) -> float:
    """Seconds per update outside the batched call in the low-rank mode: every engine loads its
    members' adapters and applies the update once (its TP shard of the weights)."""
    members = math.ceil(cfg.es.population_size / engines)
    held = plan_tp.layout(cfg.model, tp)["held"] / ctx.params if tp > 1 else 1.0
    return members * ctx.const("lora_adapter_load_s") + ctx.hbm_seconds(APPLY_BYTES_PER_PARAM) * held


def es_limit(ctx: Any, cfg: Any, engines: int, tp: int, update_s: float, engines_per_gpu: int) -> dict[str, Any]:
    """The ``limit`` block of an ES stage on vLLM engines: ``engines`` engines at one per GPU (TP
    group), ``update_s`` the planned seconds per update, ``engines_per_gpu`` the plan's K."""
    plain, rows = inference_s(ctx, cfg, engines, tp)
    lowrank = plain * (1.0 + ctx.const("lora_token_overhead")) + lowrank_update_s(ctx, cfg, engines, tp)
    return {"inference_s": round(plain, 3), "inference_engines": engines, "inference_rows_per_engine": rows,
            "update_s": round(update_s, 3), "ratio": round(update_s / plain, 3), "engines_per_gpu": engines_per_gpu,
            "lowrank_batch_s": round(lowrank, 3), "lowrank_ratio": round(lowrank / plain, 3)}


def hf_limit(decode_s: float, update_s: float) -> dict[str, Any]:
    """The ``limit`` block of an ES stage on the HF sampler (per update): no step model, so plain
    inference is the decode term itself."""
    ratio = (decode_s + update_s) / decode_s if decode_s > 0 else None
    return {"inference_s": round(decode_s, 3), "update_s": round(decode_s + update_s, 3),
            "ratio": None if ratio is None else round(ratio, 3), "engines_per_gpu": 1,
            "lowrank_batch_s": None, "lowrank_ratio": None}


__all__ = ["APPLY_BYTES_PER_PARAM", "MAX_NUM_SEQS", "es_limit", "hf_limit", "inference_s", "lowrank_update_s"]
