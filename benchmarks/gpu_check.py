"""GPU check: the HF-backend ES step at Qwen2.5-1.5B shapes, from source, on one CUDA device.

Made for the bare, offline GPU machine a session may be lent (one H100, torch 2.11,
transformers 5.17, no vLLM/TRL/Ray, no network, at most 64 MiB carried): it needs only torch,
transformers and the package's source tree (``PYTHONPATH=src``; ``scripts/gpu-check.sh`` sets
it), builds a random-weight ``Qwen2ForCausalLM`` from a config (no download; the embedded
character tokenizer; the embedding padded to Qwen2.5's 151,936 rows so weights and logits have
their real size) and prints ONE JSON object:

- ``restore``: the centre is bit-identical after ``--cycles`` perturb/restore cycles
  (``HFPolicy``, ``es.restore: exact``, fp32 masters for the bf16 weights as in the paper
  configs), and each perturbation did change the weights;
- ``determinism``: the same seeds and weights give the same update, twice from the same
  centre (weights and fp32 masters compared bit for bit), and other seeds give another one;
- ``timing``: one member's directions drawn on the device, one perturb, one restore and the
  update from N members, against one member's generation (B prompts x L tokens, greedy,
  ``ignore_eos``) -- the shares that decide whether ES costs more than inference;
- ``memory``: peak allocated GPU memory of plain inference (the model only) against one ES
  step (policy with masters and saved centre: N x (perturb, generate, restore) + update);
- ``host_reference``: the trainer's reference as it runs beside vLLM engines (weights and fp32
  masters in host memory, directions drawn on the GPU) applies the same update as the
  on-device policy, bit for bit;
- ``memory_model``, ``sharded_update``, ``pinned`` (benchmarks/gpu_check_memory.py):
  the fake-tensor trace the plan uses next to ``torch.cuda.max_memory_allocated`` for one GRPO
  micro-step and one ES member pass at the shipped configs' shapes (within ±10 %), the sharded
  update's fixed-point arithmetic on the device bit-checked against the host, and the fp32
  masters pinned in one buffer of exactly their size.

Every section runs even if an earlier one failed; a failed section carries ``error`` and the
process exits 1, as it does when a check is false. ``--tiny --device cpu`` runs the same
code on a small model on the CPU (tests/test_gpu_check.py runs it in the suite).

API guard: only APIs present in torch >= 2.4 and transformers >= 5.0 are used here
(``Qwen2Config`` keyword fields, ``torch.cuda.max_memory_allocated``, ``torch.Generator``);
the package's own code paths are the ones ES training runs.

Usage: scripts/gpu-check.sh [--model qwen2.5-1.5b] [--population 8] [--prompts 16] [--tokens 128]
       python benchmarks/gpu_check.py --tiny --device cpu
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_memory import SHAPES, versions  # noqa: E402  (Qwen2.5 shapes live there)
from gpu_memory_workloads import GIB, memory_report, reset_peak  # noqa: E402

TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2)
QWEN_VOCAB = 151_936
ABSENT_ON_GPU_MACHINE = ("vllm", "trl", "ray", "datasets", "math_verify")
SIGMA, ALPHA = 1.5e-3, 2.5e-4  # configs/easy/es-qwen2.5-1.5b.yaml


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(device: str, fn: Callable[[], Any]) -> tuple[float, Any]:
    """(seconds, result) of ``fn`` with the device synchronised on both sides."""
    _sync(device)
    t0 = time.perf_counter()
    out = fn()
    _sync(device)
    return time.perf_counter() - t0, out


def build_model(args: argparse.Namespace) -> tuple[Any, Any]:
    """Random-init Qwen2 (bf16) with the shapes of ``args.model`` (or TINY), on ``args.device``."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from esreason.embedded import build_tokenizer

    tok = build_tokenizer()
    shapes = TINY if args.tiny else {k: v for k, v in SHAPES[args.model + "-shape"].items() if k != "max_window_layers"}
    vocab = args.vocab_size if args.vocab_size else (len(tok) if args.tiny else QWEN_VOCAB)
    config = Qwen2Config(vocab_size=vocab, tie_word_embeddings=True, max_position_embeddings=4096,
                         bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                         **shapes)
    torch.manual_seed(args.seed)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # init straight in bf16: no fp32 copy of 1.5B weights
    try:
        with torch.device(args.device):
            model = Qwen2ForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)
    model.eval()
    return model, tok


def snapshot(params: Sequence[tuple[str, torch.Tensor]]) -> list[torch.Tensor]:
    return [p.detach().clone() for _, p in params]


def same_bits(params: Sequence[tuple[str, torch.Tensor]], saved: Sequence[torch.Tensor]) -> bool:
    return all(torch.equal(p.detach(), s) for (_, p), s in zip(params, saved))


def changed_fraction(params: Sequence[tuple[str, torch.Tensor]], saved: Sequence[torch.Tensor]) -> float:
    changed = sum(int((p.detach() != s).sum()) for (_, p), s in zip(params, saved))
    return changed / sum(s.numel() for s in saved)


def check_restore(policy: Any, cycles: int) -> dict[str, Any]:
    """``cycles`` perturb/restore cycles from the current centre: bit-exact restore every time."""
    params = policy.params.params
    centre = snapshot(params)
    fractions, exact = [], []
    for c in range(cycles):
        policy.perturb(1000 + c, SIGMA)
        fractions.append(changed_fraction(params, centre))
        policy.restore()
        exact.append(same_bits(params, centre))
    return {"cycles": cycles, "bit_exact_every_cycle": all(exact), "changed_fraction_min": min(fractions),
            "ok": all(exact) and min(fractions) > 0}


def _fresh_update(model: Any, centre: Sequence[torch.Tensor], seeds: Sequence[int],
                  weights: Sequence[float]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Reset the weights to ``centre``, build a new policy (fresh masters), apply one update."""
    from esreason.backends.hf import HFPolicy
    from esreason.es.params import unique_named_parameters

    with torch.no_grad():
        for (_, p), c in zip(unique_named_parameters(model), centre):
            p.copy_(c)
    policy = HFPolicy(model, None)
    policy.apply_update(seeds, weights, ALPHA)
    masters = policy.params.master_state() or {}
    return snapshot(policy.params.params), [t.detach().clone() for _, t in sorted(masters.items())]


def check_determinism(model: Any, population: int) -> dict[str, Any]:
    """Same seeds + weights from the same centre => the same bits; other seeds => other bits."""
    from esreason.es.params import unique_named_parameters
    from esreason.es.shaping import zscore

    centre = snapshot(unique_named_parameters(model))
    seeds = list(range(7, 7 + population))
    weights = [float(z) for z in zscore(torch.linspace(0, 1, population).double().numpy())]
    a_w, a_m = _fresh_update(model, centre, seeds, weights)
    b_w, b_m = _fresh_update(model, centre, seeds, weights)
    c_w, _ = _fresh_update(model, centre, [s + 100 for s in seeds], weights)
    same = all(torch.equal(x, y) for x, y in zip(a_w + a_m, b_w + b_m))
    moved = any(not torch.equal(x, y) for x, y in zip(a_w, centre))
    differs = any(not torch.equal(x, y) for x, y in zip(a_w, c_w))
    del b_w, b_m, c_w
    with torch.no_grad():  # leave the model at the centre it came with
        for (_, p), c in zip(unique_named_parameters(model), centre):
            p.copy_(c)
    return {"same_seed_same_update": same, "update_moved_the_centre": moved, "other_seeds_other_update": differs,
            "masters_compared": len(a_m), "ok": same and moved and differs}


def check_host_reference(model: Any, population: int, device: str) -> dict[str, Any]:
    """The trainer's reference with vLLM engines: weights and masters in host memory, directions
    drawn on the GPU. Its update must equal the on-device policy's bit for bit (fp32 adds and
    the one rounding are exactly rounded everywhere); on the CPU twin both sides are the CPU."""
    import copy

    from esreason.backends.hf import HFPolicy
    from esreason.es.shaping import zscore

    seeds = list(range(11, 11 + population))
    weights = [float(z) for z in zscore(torch.linspace(1, 0, population).double().numpy())]
    host_model = copy.deepcopy(model).to("cpu")
    on_device = HFPolicy(model, None, direction_cache_mb=0)
    host = HFPolicy(host_model, None, direction_cache_mb=0, noise_device=device)
    saved = snapshot(on_device.params.params)
    on_device.apply_update(seeds, weights, ALPHA)
    host.apply_update(seeds, weights, ALPHA)
    same_w = all(torch.equal(a.detach().cpu(), b.detach())
                 for (_, a), (_, b) in zip(on_device.params.params, host.params.params))
    ma, mb = on_device.params.master_state() or {}, host.params.master_state() or {}
    same_m = ma.keys() == mb.keys() and all(torch.equal(ma[k], mb[k]) for k in ma)
    with torch.no_grad():  # leave the model at the centre it came with
        for (_, p), c in zip(on_device.params.params, saved):
            p.copy_(c)
    del host_model, host
    return {"host_weights_equal_device_weights": same_w, "host_masters_equal_device_masters": same_m,
            "masters_compared": len(ma), "ok": same_w and same_m}


def generation_inputs(tok: Any, prompts: int) -> list[str]:
    return [f"{tok.bos_token}{1000 + 37 * i}+{2000 + 11 * i}=" for i in range(prompts)]


def run_es_step(policy: Any, sampler: Any, prompts: list[str], params: Any, population: int,
                device: str) -> dict[str, float]:
    """One ES step (N x perturb/generate/restore, then the update); seconds per phase."""
    from esreason.es.shaping import zscore

    t = {"perturb": 0.0, "generate": 0.0, "restore": 0.0}
    rewards = []
    for i in range(population):
        t["perturb"] += timed(device, lambda: policy.perturb(i, SIGMA))[0]
        dt, gen = timed(device, lambda: sampler.generate(prompts, params, ignore_eos=True))
        t["generate"] += dt
        rewards.append(float(sum(len(ids) for ids in gen.token_ids) % 7))
        t["restore"] += timed(device, policy.restore)[0]
    weights = [float(z) for z in zscore(torch.tensor(rewards, dtype=torch.float64).numpy())]
    t["update"] = timed(device, lambda: policy.apply_update(list(range(population)), weights, ALPHA))[0]
    return t


def draw_directions(model: Any, device: str, seed: int) -> None:
    """One member's directions for every tensor, block by block on the device (what perturb draws)."""
    from esreason.es.noise import block_spans, direction_block
    from esreason.es.params import unique_named_parameters

    for name, p in unique_named_parameters(model):
        for b, start, stop in block_spans(p.numel()):
            direction_block(seed, name, b, stop - start, device=device)


def measure(args: argparse.Namespace, model: Any, tok: Any, result: dict[str, Any]) -> Any:
    """Plain inference, then one ES step: times and peak memory. Returns the policy."""
    from esreason.backends.base import SamplingParams
    from esreason.backends.hf import HFPolicy
    from esreason.backends.sampling import Sampler

    device = args.device
    sampler = Sampler(model, tok, batch_size=args.prompts, cache=args.cache)
    prompts = generation_inputs(tok, args.prompts)
    params = SamplingParams(max_new_tokens=args.tokens, temperature=0.0)
    sampler.generate(prompts[:1], SamplingParams(max_new_tokens=2))  # warm-up (kernels, allocator)
    weights_gb = sum(p.numel() * p.element_size() for p in model.parameters()) / GIB
    reset_peak(device)
    gen_s, _ = timed(device, lambda: sampler.generate(prompts, params, ignore_eos=True))
    inference_mem = memory_report(device, weights_gb)
    reset_peak(device)
    policy = HFPolicy(model, tok)  # fp32 masters (bf16 weights) + the saved centre
    draw_s = timed(device, lambda: draw_directions(model, device, 0))[0]
    step = run_es_step(policy, sampler, prompts, params, args.population, device)
    es_mem = memory_report(device, weights_gb)
    n = args.population
    result["timing"] = {
        "member_generation_s": gen_s, "tokens_per_member": args.prompts * args.tokens,
        "direction_draw_s": draw_s, "perturb_s": step["perturb"] / n, "restore_s": step["restore"] / n,
        "update_s": step["update"], "es_step_s": sum(step.values()),
        "direction_draw_vs_generation": draw_s / gen_s,
        "perturb_restore_vs_generation": (step["perturb"] + step["restore"]) / n / gen_s,
        "update_vs_population_generation": step["update"] / step["generate"],
        "es_overhead_share": 1 - step["generate"] / sum(step.values()),
    }
    ratio = None
    if inference_mem["peak_allocated_gb"]:
        ratio = es_mem["peak_allocated_gb"] / inference_mem["peak_allocated_gb"]
    result["memory"] = {"plain_inference": inference_mem, "es_step": es_mem, "es_vs_inference_peak": ratio,
                        "note": None if device.startswith("cuda") else "peak GPU memory needs CUDA"}
    return policy


def section(result: dict[str, Any], name: str, fn: Callable[[], Any]) -> Any:
    """Run one section; on an exception record it under ``result[name]['error']``."""
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 -- a check reports every section, failed ones included
        result[name] = {**result.get(name, {}), "error": f"{type(exc).__name__}: {exc}", "ok": False}
        return None


def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("gpu_check: --device cuda but torch.cuda.is_available() is False "
                         "(use --tiny --device cpu for the CPU twin)")
    from esreason.es.params import unique_named_parameters

    result: dict[str, Any] = {"versions": versions(), "device": args.device,
                              "device_name": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
                              "model": "tiny" if args.tiny else args.model + " shapes, random bf16 weights",
                              "population": args.population, "prompts": args.prompts, "tokens": args.tokens}
    model, tok = build_model(args)
    result["parameters"] = sum(p.numel() for _, p in unique_named_parameters(model))
    policy = section(result, "timing", lambda: measure(args, model, tok, result))
    if policy is not None:
        result["restore"] = section(result, "restore", lambda: check_restore(policy, args.cycles)) or result.get(
            "restore")
        del policy
    result["determinism"] = section(result, "determinism", lambda: check_determinism(model, args.population)) \
        or result.get("determinism")
    result["host_reference"] = section(result, "host_reference",
                                       lambda: check_host_reference(model, args.population, args.device)) \
        or result.get("host_reference")
    import gpu_check_memory as mem

    result["sharded_update"] = section(result, "sharded_update",
                                       lambda: mem.check_sharded_update(model, args.device, args.population)) \
        or result.get("sharded_update")
    result["pinned"] = section(result, "pinned", lambda: mem.check_pinned(model, args.device)) or result.get("pinned")
    vocab = model.config.vocab_size
    del model  # the memory model's section measures from what is allocated without it
    if args.device.startswith("cuda"):
        torch.cuda.empty_cache()
    result["memory_model"] = section(result, "memory_model",
                                     lambda: mem.check_memory_model(args.device, args.tiny, TINY, vocab)) \
        or result.get("memory_model")
    # The lent machine has none of these: the check (and the ES path it runs) must not import them.
    result["absent_on_gpu_machine_but_imported"] = sorted(m for m in ABSENT_ON_GPU_MACHINE if m in sys.modules)
    checks = ("restore", "determinism", "host_reference", "sharded_update", "pinned", "memory_model")
    result["ok"] = not result["absent_on_gpu_machine_but_imported"] and "error" not in result.get("timing", {}) \
        and all((result.get(k) or {}).get("ok", False) for k in checks)
    return result


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2.5-1.5b", choices=["qwen2.5-0.5b", "qwen2.5-1.5b"])
    ap.add_argument("--tiny", action="store_true", help="a 2-layer model instead (CPU twin, tests)")
    ap.add_argument("--device", default=None, help="cuda (default when available) or cpu")
    ap.add_argument("--population", type=int, default=8, help="N members of the timed ES step")
    ap.add_argument("--prompts", type=int, default=16, help="B prompts per member")
    ap.add_argument("--tokens", type=int, default=128, help="L tokens generated per prompt")
    ap.add_argument("--cycles", type=int, default=5, help="perturb/restore cycles checked")
    ap.add_argument("--vocab-size", type=int, default=0, help="0: Qwen2.5's 151936 (tiny: the char vocab)")
    ap.add_argument("--cache", default="auto", choices=["auto", "dynamic"], help="the sampler's KV cache")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if min(args.population, args.prompts, args.tokens, args.cycles) < 1:
        ap.error("--population, --prompts, --tokens and --cycles must be >= 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    result = run(parse_args(argv))
    print(json.dumps(result, indent=2, default=str))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
