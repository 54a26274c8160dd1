"""The GPU check's memory sections: the memory model against the GPU, the sharded update's
arithmetic against the host, and pinned masters of exactly their size (benchmarks/gpu_check.py).

- ``memory_model``: at the shipped configs' real shapes (Qwen2.5-1.5B, random weights), one GRPO
  micro-step of our reference loss (``esreason.grpo.objective``: fp32 masters, bf16 autocast,
  AdamW in steady state, the KL reference, activation checkpointing as configured, the longest
  sequence the config allows) and one ES member pass (the HF sampler's prefill of B prompts in
  bf16, its KV cache kept) -- each run for real with ``torch.cuda.max_memory_allocated`` beside
  the fake-tensor trace the plan uses (``esreason.experiments.memtrace``), and their ratio.
  Checked: within ±10 % (the plan's stated accuracy). On the CPU twin nothing is measured (the CPU
  validation is tests/test_memtrace.py, with the profiler's allocator totals).
- ``sharded_update``: the sharded update (``esreason.es.sharded``) computed by two simulated
  engines (shards {0} and {1}, the int64 all-reduce done by hand) equals the one-process
  reference bit for bit, and the fixed-point arithmetic (quantize, integer sum, dequantize, apply
  to the fp32 masters and round to bf16) gives the same bits on the device as on the host from the
  same fp32 partial sums.
- ``pinned``: the 1.5B's fp32 masters in one :class:`esreason.backends.pinned.PinnedArena`:
  pinned bytes within 5 % of the payload (exactly it, here), ``Tensor.is_pinned()``, and an
  asynchronous round trip to the device that returns the same bits.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
GIB = 2.0 ** 30
#: The shipped configs whose shapes are checked (the Easy 1.5B pair).
GRPO_CONFIG = ROOT / "configs" / "easy" / "grpo-qwen2.5-1.5b.yaml"
ES_CONFIG = ROOT / "configs" / "easy" / "es-qwen2.5-1.5b.yaml"
TOLERANCE = 0.10


def _yaml(path: Path) -> dict[str, Any]:
    import yaml  # a transformers dependency: present on the bare GPU machine

    return yaml.safe_load(path.read_text())


def config_shapes(tiny: bool) -> dict[str, Any]:
    """The GRPO micro-step's and the ES member pass's shapes, read from the shipped configs (the
    CPU twin keeps their structure at a small size)."""
    from esreason.experiments.memplan import prompt_tokens

    g, e = _yaml(GRPO_CONFIG), _yaml(ES_CONFIG)
    shapes = {"grpo": {"micro_batch": int(g["grpo"]["micro_batch_size"]), "prompt_len": prompt_tokens(g["task"]),
                       "completion_len": int(g["generation"]["max_new_tokens"]), "beta": float(g["grpo"]["beta"]),
                       "gradient_checkpointing": bool(g["grpo"]["gradient_checkpointing"]),
                       "master_dtype": str(g.get("dtype", "float32")),
                       "autocast": "bfloat16" if g["grpo"].get("bf16") else None},
              "es": {"batch": int(e["train"]["batch_size"]), "seq_len": prompt_tokens(e["task"]),
                     "dtype": str(e.get("dtype", "bfloat16"))}}
    if tiny:
        shapes["grpo"].update(micro_batch=2, prompt_len=16, completion_len=48)
        shapes["es"].update(batch=4, seq_len=32)
    return shapes


def architecture_for(tiny: bool, tiny_shapes: dict[str, Any], vocab: int) -> dict[str, Any]:
    from esreason.io.architectures import architecture

    if tiny:
        return {"model_type": "qwen2", "vocab_size": vocab, "max_position_embeddings": 4096, "rms_norm_eps": 1e-6,
                "rope_theta": 10000.0, "hidden_act": "silu", "tie_word_embeddings": True, **tiny_shapes}
    return architecture("Qwen/Qwen2.5-1.5B-Instruct")


def _model(arch: dict[str, Any], dtype: torch.dtype, device: str) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    from esreason.io.architectures import hf_config

    with torch.device(device):
        return AutoModelForCausalLM.from_config(hf_config(arch), dtype=dtype)


def _allocated(device: str) -> int:
    return int(torch.cuda.memory_allocated()) if device.startswith("cuda") else 0


def _measure(device: str, step: Any, base: int) -> int | None:
    """Peak bytes allocated on the device while ``step()`` runs, less ``base`` (what was allocated
    before the section built its models: the check's own model stays resident meanwhile)."""
    if not device.startswith("cuda"):
        step()
        return None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    return int(torch.cuda.max_memory_allocated()) - base


def _row(traced: Any, measured: int | None) -> dict[str, Any]:
    row: dict[str, Any] = {"traced_gib": traced.total / GIB, "traced_terms_gib": traced.as_gib(),
                           "measured_gib": None if measured is None else measured / GIB}
    if measured:
        row["traced_vs_measured"] = traced.total / measured
        row["within_tolerance"] = abs(traced.total / measured - 1) <= TOLERANCE
    return row


def check_memory_model(device: str, tiny: bool, tiny_shapes: dict[str, Any], vocab: int) -> dict[str, Any]:
    from esreason.experiments.memtrace import DTYPES, trace_forward, trace_grpo_microstep, trace_grpo_scoring
    from esreason.grpo.objective import completion_logprobs, grpo_loss

    shapes = config_shapes(tiny)
    arch = architecture_for(tiny, tiny_shapes, vocab)
    out: dict[str, Any] = {"shapes": shapes, "tolerance": TOLERANCE, "configs": [str(GRPO_CONFIG.relative_to(ROOT)),
                                                                                 str(ES_CONFIG.relative_to(ROOT))]}
    g = shapes["grpo"]
    base = _allocated(device)
    # ---- GRPO micro-step (steady state: gradients and AdamW states exist) ----
    model = _model(arch, DTYPES[g["master_dtype"]], device).train()
    if g["gradient_checkpointing"]:
        enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
        kw = "activation_checkpointing_kwargs" if hasattr(model, "activation_checkpointing_enable") else \
            "gradient_checkpointing_kwargs"
        enable(**{kw: {"use_reentrant": False}})
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    ref = _model(arch, DTYPES[g["master_dtype"]], device).eval() if g["beta"] else None
    n, vocab_size = g["micro_batch"], int(arch["vocab_size"])
    prompt = torch.randint(0, vocab_size, (n, g["prompt_len"]), device=device)  # [n, P]
    completion = torch.randint(0, vocab_size, (n, g["completion_len"]), device=device)  # [n, C]
    pmask, cmask = torch.ones_like(prompt), torch.ones_like(completion)
    dev_type = torch.device(device).type
    autocast = DTYPES[g["autocast"]] if g["autocast"] else None

    def grpo_step() -> None:
        # TRL computes the reference log-probs at generation time (trace_grpo_scoring): the micro-step holds
        # the reference's weights and reads its log-probs, as traced
        with torch.autocast(dev_type, dtype=autocast, enabled=autocast is not None):
            logp = completion_logprobs(model, prompt, pmask, completion, cmask)  # [n, C] fp32
        ref_logp = torch.zeros_like(logp) if ref is not None else None
        grpo_loss(logp, logp.detach(), torch.zeros(n, device=device), cmask, beta=g["beta"],
                  ref_logp=ref_logp).loss.backward()

    grpo_step()  # warm-up: kernels, cuBLAS workspaces and lazy state outside the measurement
    model.zero_grad(set_to_none=False)
    measured = _measure(device, grpo_step, base)
    traced = trace_grpo_microstep(arch, **g)
    out["grpo_microstep"] = _row(traced, measured)
    # ---- the generation-time scoring forward: the reference (beta > 0) or the policy, no grad, no gradients ----
    model.zero_grad(set_to_none=True)
    scorer = ref if ref is not None else model

    def scoring() -> None:
        with torch.no_grad(), torch.autocast(dev_type, dtype=autocast, enabled=autocast is not None):
            completion_logprobs(scorer, prompt, pmask, completion, cmask)

    scoring()
    measured = _measure(device, scoring, base)
    kw = {k: v for k, v in g.items() if k != "gradient_checkpointing"}
    out["grpo_scoring"] = _row(trace_grpo_scoring(arch, **kw), measured)
    del model, opt, ref, prompt, completion
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    # ---- ES member pass: the HF sampler's prefill of B prompts, KV cache kept, last logits ----
    e = shapes["es"]
    base = _allocated(device)
    model = _model(arch, DTYPES[e["dtype"]], device).eval()
    ids = torch.randint(0, vocab_size, (e["batch"], e["seq_len"]), device=device)  # [B, L]

    def member_pass() -> None:
        with torch.inference_mode():
            o = model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=True, logits_to_keep=1)
            del o

    member_pass()
    measured = _measure(device, member_pass, base)
    out["es_member_pass"] = _row(trace_forward(arch, batch=e["batch"], seq_len=e["seq_len"], dtype=e["dtype"],
                                               kind="prefill"), measured)
    del model, ids
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
        out["ok"] = all(out[k].get("within_tolerance", False)
                        for k in ("grpo_microstep", "grpo_scoring", "es_member_pass"))
    else:
        out["ok"] = True
        out["note"] = "measured on CUDA only; the CPU validation is tests/test_memtrace.py"
    return out


def check_sharded_update(model: torch.nn.Module, device: str, population: int, seed: int = 0) -> dict[str, Any]:
    """Two simulated engines vs the one-process reference, and device vs host arithmetic."""
    from esreason.es.noise import block_spans
    from esreason.es.params import unique_named_parameters
    from esreason.es.sharded import (Sharding, _shard_weights, assign_shards, dequantize, fixed_point_shift,
                                     quantize, sharded_update_pieces)
    from esreason.es.update import weighted_block_sum

    g = torch.Generator().manual_seed(seed)
    raw = torch.randn(population, generator=g, dtype=torch.float64)
    weights = [float(w) for w in (raw - raw.mean()) / raw.std()]  # z-scored rewards
    seeds = [1000 + i for i in range(population)]
    alpha, shards = 2.5e-4, 2
    params = unique_named_parameters(model)
    # the embedding (the largest tensor: many noise blocks) and two small ones
    chosen = sorted(params, key=lambda kv: -kv[1].numel())[:1] + params[1:3]
    engines_equal_reference = device_equals_host = apply_equal = True
    elements = 0
    for name, p in chosen:
        reference = torch.cat([piece for _, _, piece in
                               sharded_update_pieces(p, name, seeds, weights, alpha, Sharding.local(shards),
                                                     device=device)])  # [numel] fp32
        # two engines: engine 1 first records its int64 totals, engine 0 then adds them (the all-reduce)
        recorded: list[torch.Tensor] = []
        list(sharded_update_pieces(p, name, seeds, weights, alpha,
                                   Sharding(shards, assign_shards(shards, 2, 1), lambda t: recorded.append(t.clone())),
                                   device=device))
        it = iter(recorded)
        engine0 = torch.cat([piece for _, _, piece in sharded_update_pieces(
            p, name, seeds, weights, alpha,
            Sharding(shards, assign_shards(shards, 2, 0), lambda t: t.add_(next(it))), device=device)])
        engines_equal_reference &= torch.equal(engine0, reference)
        # the fixed-point arithmetic on the host from the device's fp32 partial sums
        shift = fixed_point_shift(weights)
        parts = [_shard_weights(seeds, weights, shards, k, shift) for k in range(shards)]
        host_pieces = []
        for b, start, stop in block_spans(p.numel()):
            total = None
            for s, w in parts:
                partial = weighted_block_sum(name, b, stop - start, s, w, device=device).cpu()
                total = quantize(partial) if total is None else total.add_(quantize(partial))
            host_pieces.append(dequantize(total, shift, alpha / len(seeds)))
        host = torch.cat(host_pieces)
        device_equals_host &= torch.equal(reference.cpu(), host)
        # apply to fp32 masters and round to the model dtype: the same bits on the device and the host
        master = p.detach().float().flatten()
        on_device = (master + reference).to(p.dtype)
        on_host = (master.cpu() + host).to(p.dtype)
        apply_equal &= torch.equal(on_device.cpu(), on_host)
        elements += p.numel()
    return {"tensors": [n for n, _ in chosen], "elements": elements, "population": population, "shards": shards,
            "two_engines_equal_reference": engines_equal_reference, "device_arithmetic_equals_host": device_equals_host,
            "apply_equal": apply_equal, "ok": engines_equal_reference and device_equals_host and apply_equal}


def check_pinned(model: torch.nn.Module, device: str) -> dict[str, Any]:
    from esreason.backends.pinned import PinnedArena
    from esreason.es.params import unique_named_parameters

    specs = {n: (tuple(p.shape), torch.float32) for n, p in unique_named_parameters(model)}
    cuda = device.startswith("cuda")
    with PinnedArena(specs, register=cuda) as arena:
        payload = arena.layout.payload
        out: dict[str, Any] = {"payload_gib": payload / GIB, "buffer_gib": arena.layout.total / GIB,
                               "pinned_gib": arena.pinned_bytes / GIB,
                               "buffer_vs_payload": arena.layout.total / payload}
        rounded = sum(1 << (n - 1).bit_length() for n in arena.layout.nbytes.values())
        out["power_of_two_rounding_would_pin_gib"] = rounded / GIB
        ok = arena.layout.total <= 1.05 * payload
        if cuda:
            name, p = next(iter(unique_named_parameters(model)))
            host = arena.tensors[name]
            host.copy_(p.detach().float())
            back = host.to(device, non_blocking=True).to("cpu")
            torch.cuda.synchronize()
            out["is_pinned"] = bool(host.is_pinned())
            out["round_trip_equal"] = bool(torch.equal(back, host))
            ok = ok and out["is_pinned"] and out["round_trip_equal"] and arena.pinned_bytes == arena.layout.total
        else:
            out["note"] = "registration needs CUDA: layout only"
    out["ok"] = bool(ok and math.isfinite(out["buffer_vs_payload"]))
    return out
