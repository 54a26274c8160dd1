"""Benchmark: peak accelerator memory of ES vs plain inference vs GRPO on the same model.

The paper's memory claim: ES post-training needs only *inference* memory (the weights, a
KV cache and the generation batch; no gradients, no activations kept for a backward
pass, no optimiser state), while GRPO needs *training* memory (policy + reference model,
gradients, AdamW moments, activations of the training forward). This benchmark measures
that claim side by side, each workload in its own child process (``--child MODE``) so the
CUDA caching allocator cannot carry memory from one workload to the next (the child side,
workloads and memory helpers, is benchmarks/gpu_memory_workloads.py; this file is the
parent: models, children, ratios, the JSON):

- ``inference_one_batch``: greedy generation of N x B sequences (the B prompts repeated N
  times) in ONE batch with the unperturbed model (``Sampler(batch_size=N*B)``);
- ``inference_same_batching``: N generate calls of the B prompts (``Sampler(batch_size=B)``),
  the batching of the sequential ES evaluator;
- ``es_step_sequential``: one ES step with the reference evaluator: ``HFPolicy`` (a saved
  centre for exact restore; fp32 master weights when the model is bf16/fp16; a direction
  cache), ``evaluate_population`` over ``draw_population(0, 0, N, "one_point")`` with
  sigma, then ``policy.apply_update(seeds, zscore(member rewards), alpha)``;
- ``es_step_batched``: the same step with ``BatchedEvaluator(population_batch=P)`` (float32
  only; skipped otherwise); its rewards and responses are compared with the sequential
  step's (on CUDA bit-identity is not guaranteed: see src/esreason/backends/batched.py);
- ``grpo_step``: one GRPO update through ``esreason.grpo.run.run_grpo`` (TRL GRPOTrainer),
  configs/demo/grpo.yaml with train.batch_size=B, grpo.num_generations=N,
  generation.max_new_tokens=L, max_steps 1, no held-out evaluation, and model, device and
  dtype of this run. ``esreason.backends.hf.load_model`` is wrapped so the peak statistics
  are reset right after the policy is loaded; TRL's reference model (beta > 0), gradients,
  optimizer state and the end-of-run checkpoint all happen after that point.

In every child: load the model, ``torch.cuda.reset_peak_memory_stats()``, ``weights_gb =
memory_allocated``, run the workload, then ``max_memory_allocated`` / ``max_memory_reserved``.

Models (``--model``): ``demo`` (the embedded default, float32) or ``qwen2.5-0.5b-shape`` /
``qwen2.5-1.5b-shape``: a RANDOM-INIT ``Qwen2ForCausalLM`` with the architecture of
Qwen2.5-0.5B / 1.5B (hidden, intermediate, layers, heads, kv heads, tied embeddings, rope
theta 1e6, 32768 positions) but the embedded tokenizer's vocabulary (100 ids; no hub on
the GPU machine; ``--vocab-size 151936`` pads the embedding to Qwen2.5's size, so weights
and logits have their real size). The parent builds it once (torch seed ``--seed``,
default dtype bfloat16) and saves it with the demo tokenizer to a temporary directory
that every child loads with ``esreason.backends.hf.load_model(path)``. Random weights
(almost) never emit the stop token under greedy decoding, so every response runs to
max_new_tokens and the inference and ES workloads decode sequences of equal length
(``responses_run_to_max_new_tokens`` says whether that held). GRPO samples at temperature
1.0, where a random model stops at EOS about once per vocabulary-size tokens: see
``grpo_step.completions``. Prompts: the first B problems of ``demo-add`` (train),
rendered with the chat template; rewards from its verifier (all 0 for a random model).
When every member reward is equal, the z-scores are all 0 and ``apply_update`` would skip
every direction; the ES steps then use alternating +1/-1 weights instead so the update
does its full work (``update_weights`` says which was used).

Usage (GPU; one model per run keeps each call well under 10 minutes)::

    PYTHONPATH=src python benchmarks/gpu_memory.py --model qwen2.5-0.5b-shape
    PYTHONPATH=src python benchmarks/gpu_memory.py --model qwen2.5-1.5b-shape
    PYTHONPATH=src python benchmarks/gpu_memory.py --model qwen2.5-0.5b-shape --dtype float32 --population-batch 8
    # a subset (each call of the device tool is limited to 10 minutes):
    PYTHONPATH=src python benchmarks/gpu_memory.py --model qwen2.5-1.5b-shape --modes inference_one_batch,grpo_step
    PYTHONPATH=src python benchmarks/gpu_memory.py --model demo --population 32 --batch 16
    # CPU smoke test (peaks are then the host RSS high-water mark, VmHWM):
    OMP_NUM_THREADS=1 python benchmarks/gpu_memory.py --device cpu --model demo \\
        --population 2 --batch 2 --max-new-tokens 8

Prints ONE JSON object (indent 2). Fields:
  benchmark, device, device_name, versions{torch, cuda, transformers, trl}
  model{name, dtype, model_type, hidden_size, intermediate_size, num_hidden_layers,
        num_attention_heads, num_key_value_heads, vocab_size, tie_word_embeddings,
        num_parameters (unique), weight_gb (num_parameters x dtype bytes), random_init, seed}
  population N, batch B, max_new_tokens L, population_batch P, sigma, alpha,
  sequences_per_workload (N x B), expected_tokens (N x B x L)
  responses_run_to_max_new_tokens  every inference/ES workload generated exactly N x B x L tokens
  workloads.<mode>:
    weights_gb          memory_allocated right after loading the model (the weights)
    peak_allocated_gb   max_memory_allocated over the workload (null on CPU)
    peak_reserved_gb    max_memory_reserved over the workload (allocator cache included; null on CPU)
    peak_above_weights_gb  peak_allocated_gb - weights_gb: the working memory
    maxrss_mb           peak host RSS of the child (VmHWM; see peak_rss_mb)
    seconds             wall seconds of the workload (ES: evaluation + update; GRPO: run_grpo)
    tokens              generated tokens (GRPO: mean completion length x N x B)
    ES only: policy_state_gb (memory the HFPolicy adds: centre copy, fp32 masters; CUDA: measured
      as allocated after HFPolicy() minus weights_gb; CPU: the bytes of those tensors),
      master_weights, restore, direction_cache_mb (budget), direction_cache_filled_mb,
      update_weights ('zscore' | 'alternating (all rewards equal)'), phase_seconds
    GRPO only: update_seconds (metrics time/step), completions (TRL completion stats),
      trl_args (batching, beta, precision, activation checkpointing), overrides
    error               last line of the child's stderr when it failed; skipped: why it did not run
  es_batched_vs_sequential: rewards_identical (bool((a.rewards == b.rewards).all())),
    member_rewards_equal_share, responses_equal_share (token ids), texts_equal_share
  peak_ratio_es_vs_inference            es_step_sequential / inference_one_batch (peak allocated)
  peak_ratio_es_vs_same_batching        es_step_sequential / inference_same_batching
  peak_ratio_batched_es_vs_inference    es_step_batched / inference_one_batch
  peak_ratio_grpo_vs_inference          grpo_step / inference_one_batch
  *_above_weights                       the same ratios of peak - weights (null on CPU)
  ratio_basis                           'peak_allocated_gb' (CUDA) or 'maxrss_mb' (CPU smoke test)
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Sequence

import torch

from gpu_memory_workloads import GIB, RESULT_PREFIX, ROOT, child_main  # benchmarks/ is on sys.path as a script

MODES = ("inference_one_batch", "inference_same_batching", "es_step_sequential", "es_step_batched", "grpo_step")

# Qwen2.5-0.5B / 1.5B config.json (hub), vocabulary replaced by the embedded tokenizer's.
SHAPES: dict[str, dict[str, Any]] = {
    "qwen2.5-0.5b-shape": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                               num_attention_heads=14, num_key_value_heads=2, max_window_layers=21),
    "qwen2.5-1.5b-shape": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                               num_attention_heads=12, num_key_value_heads=2, max_window_layers=21),
}
SHAPE_COMMON: dict[str, Any] = dict(tie_word_embeddings=True, max_position_embeddings=32768, rms_norm_eps=1e-6,
                                    hidden_act="silu", use_sliding_window=False, attention_dropout=0.0,
                                    initializer_range=0.02,
                                    rope_parameters={"rope_type": "default", "rope_theta": 1.0e6})


# --------------------------------------------------------------------------- models (parent)


def default_dtype(model: str) -> str:
    return "float32" if model == "demo" else "bfloat16"


def build_shape_model(name: str, dtype: str, vocab_size: int, seed: int, directory: Path) -> None:
    """Random-init Qwen2ForCausalLM of shape ``name`` (CPU), saved with the demo tokenizer."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from esreason.backends.hf import DTYPES, load_model

    _, tok = load_model("demo")
    config = Qwen2Config(vocab_size=vocab_size or len(tok), bos_token_id=tok.bos_token_id,
                         eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                         **SHAPES[name], **SHAPE_COMMON)
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).to(DTYPES[dtype])
    model.save_pretrained(directory)
    tok.save_pretrained(directory)


def model_summary(path: str, name: str, dtype: str, seed: int) -> dict[str, Any]:
    """Shape and unique parameter count of the model at ``path`` (built on the meta device)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from esreason.backends.hf import DTYPES, resolve_model_path
    from esreason.es.params import unique_named_parameters

    cfg = AutoConfig.from_pretrained(resolve_model_path(path))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    n = sum(p.numel() for _, p in unique_named_parameters(model))
    keys = ("model_type", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "vocab_size", "tie_word_embeddings", "max_position_embeddings")
    out: dict[str, Any] = {"name": name, "dtype": dtype, **{k: getattr(cfg, k, None) for k in keys}}
    out.update(num_parameters=n, weight_gb=n * DTYPES[dtype].itemsize / GIB, random_init=name != "demo",
               seed=seed if name != "demo" else None)
    return out


# --------------------------------------------------------------------------- parent


def child_command(mode: str, args: argparse.Namespace, model_path: str, dump: Path | None) -> list[str]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", mode, "--model-path", model_path,
           "--device", args.device, "--dtype", args.dtype, "--population", str(args.population),
           "--batch", str(args.batch), "--max-new-tokens", str(args.max_new_tokens),
           "--population-batch", str(args.population_batch), "--sigma", repr(args.sigma),
           "--alpha", repr(args.alpha), "--master-weights", args.master_weights,
           "--direction-cache-mb", str(args.direction_cache_mb), "--grpo-micro-batch", str(args.grpo_micro_batch)]
    for item in args.grpo_set:
        cmd += ["--grpo-set", item]
    if dump is not None:
        cmd += ["--dump", str(dump)]
    return cmd


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    src = str(ROOT / "src")
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def run_mode(mode: str, args: argparse.Namespace, model_path: str, dump: Path | None) -> dict:
    """Run one child; its result, or {"error": last line of stderr} when it fails."""
    cmd = child_command(mode, args, model_path, dump)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=child_env(), timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {args.timeout} s"}
    for line in reversed(proc.stdout.splitlines()):
        if proc.returncode == 0 and line.startswith(RESULT_PREFIX):
            return json.loads(line[len(RESULT_PREFIX):])
    lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
    return {"error": lines[-1] if lines else f"child exited with code {proc.returncode} and no stderr"}


def compare_dumps(seq: Path, bat: Path) -> dict[str, Any]:
    """Batched vs sequential ES step: rewards, member rewards, responses (token ids), texts."""
    import numpy as np

    if not (seq.is_file() and bat.is_file()):
        return {"error": "sequential or batched ES step has no results to compare"}
    a, b = json.loads(seq.read_text()), json.loads(bat.read_text())
    ra, rb = np.asarray(a["rewards"]), np.asarray(b["rewards"])
    pairs_ids = [(x, y) for ma, mb in zip(a["token_ids"], b["token_ids"]) for x, y in zip(ma, mb)]
    pairs_txt = [(x, y) for ma, mb in zip(a["texts"], b["texts"]) for x, y in zip(ma, mb)]
    return {"rewards_identical": bool(ra.shape == rb.shape and (ra == rb).all()),
            "member_rewards_equal_share": float(np.mean(ra.mean(axis=1) == rb.mean(axis=1))),
            "responses_equal_share": float(np.mean([x == y for x, y in pairs_ids])) if pairs_ids else None,
            "texts_equal_share": float(np.mean([x == y for x, y in pairs_txt])) if pairs_txt else None,
            "responses_compared": len(pairs_ids)}


def _ratio(num: float | None, den: float | None) -> float | None:
    if num is None or den is None or den <= 0:
        return None
    return num / den


def peak_ratios(work: dict[str, dict], device: str) -> dict[str, Any]:
    """peak_ratio_* (and *_above_weights) of ES/GRPO workloads over the inference workloads."""
    basis = "peak_allocated_gb" if device.startswith("cuda") else "maxrss_mb"
    pairs = {"peak_ratio_es_vs_inference": ("es_step_sequential", "inference_one_batch"),
             "peak_ratio_es_vs_same_batching": ("es_step_sequential", "inference_same_batching"),
             "peak_ratio_batched_es_vs_inference": ("es_step_batched", "inference_one_batch"),
             "peak_ratio_grpo_vs_inference": ("grpo_step", "inference_one_batch")}
    out: dict[str, Any] = {}
    for key, (num, den) in pairs.items():
        a, b = work.get(num, {}), work.get(den, {})
        out[key] = _ratio(a.get(basis), b.get(basis))
        out[f"{key}_above_weights"] = _ratio(a.get("peak_above_weights_gb"), b.get("peak_above_weights_gb"))
    out["ratio_basis"] = basis
    return out


def versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"torch": torch.__version__, "cuda": torch.version.cuda}
    for pkg in ("transformers", "trl"):
        try:
            out[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            out[pkg] = None
    return out


def run_all(args: argparse.Namespace, model_path: str, tmp: Path) -> dict:
    """Every requested workload in its own child; ES dumps compared when both ES steps ran."""
    work: dict[str, dict] = {}
    dumps = {"es_step_sequential": tmp / "es_sequential.json", "es_step_batched": tmp / "es_batched.json"}
    for mode in args.modes:
        if mode == "es_step_batched" and args.dtype != "float32":
            work[mode] = {"skipped": f"BatchedEvaluator needs float32 weights; dtype is {args.dtype}"}
            continue
        print(f"[gpu_memory] {mode} ...", file=sys.stderr, flush=True)
        work[mode] = run_mode(mode, args, model_path, dumps.get(mode))
    out: dict[str, Any] = {"workloads": work}
    if all("seconds" in work.get(m, {}) for m in dumps):  # both ES steps ran
        out["es_batched_vs_sequential"] = compare_dumps(dumps["es_step_sequential"], dumps["es_step_batched"])
    return out


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="cpu: smoke test only")
    ap.add_argument("--model", default="demo", choices=("demo", *SHAPES))
    ap.add_argument("--dtype", default=None, choices=("float32", "bfloat16", "float16"),
                    help="default: float32 for demo, bfloat16 for the *-shape models")
    ap.add_argument("--population", type=int, default=32, help="N: ES members / GRPO responses per prompt")
    ap.add_argument("--batch", type=int, default=16, help="B: prompts")
    ap.add_argument("--max-new-tokens", type=int, default=256, help="L")
    ap.add_argument("--population-batch", type=int, default=0, help="P of es_step_batched (0 = all N)")
    ap.add_argument("--modes", default=",".join(MODES), help="comma list of workloads (default: all)")
    ap.add_argument("--sigma", type=float, default=1e-3)
    ap.add_argument("--alpha", type=float, default=5e-4, help="ES learning rate of the update")
    ap.add_argument("--master-weights", default="auto", choices=("auto", "fp32", "none"),
                    help="HFPolicy master_weights (auto: fp32 masters for bf16/fp16 models)")
    ap.add_argument("--direction-cache-mb", type=int, default=256, help="HFPolicy direction_cache_mb")
    ap.add_argument("--grpo-micro-batch", type=int, default=0,
                    help="grpo.micro_batch_size (0 = gcd(64, N x B): at most 64 sequences per forward/backward)")
    ap.add_argument("--grpo-set", action="append", default=[], metavar="KEY=VALUE",
                    help="extra GRPO config override, e.g. grpo.gradient_checkpointing=true (repeatable)")
    ap.add_argument("--vocab-size", type=int, default=0,
                    help="*-shape models: embedding rows (0 = the embedded tokenizer's; 151936 = Qwen2.5's)")
    ap.add_argument("--seed", type=int, default=0, help="torch seed of the random-init *-shape models")
    ap.add_argument("--timeout", type=int, default=3600, help="seconds per child process")
    ap.add_argument("--child", default="", help=argparse.SUPPRESS)
    ap.add_argument("--model-path", default="", help=argparse.SUPPRESS)
    ap.add_argument("--dump", default="", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.dtype = args.dtype or default_dtype(args.model)
    if not args.child:
        args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
        unknown = sorted(set(args.modes) - set(MODES))
        if unknown:
            ap.error(f"unknown --modes {', '.join(unknown)}; allowed: {', '.join(MODES)}")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if args.child:
        child_main(args)
        return
    with tempfile.TemporaryDirectory(prefix="gpu_memory_") as tmp_name:
        tmp = Path(tmp_name)
        model_path = "demo"
        if args.model in SHAPES:
            model_path = str(tmp / args.model)
            build_shape_model(args.model, args.dtype, args.vocab_size, args.seed, Path(model_path))
        summary = model_summary(model_path, args.model, args.dtype, args.seed)
        results = run_all(args, model_path, tmp)
    work = results["workloads"]
    n, b, L = args.population, args.batch, args.max_new_tokens
    gen_modes = [m for m in ("inference_one_batch", "inference_same_batching", "es_step_sequential",
                             "es_step_batched") if "tokens" in work.get(m, {})]
    out: dict[str, Any] = {
        "benchmark": "gpu_memory",
        "claim": "ES post-training needs only inference memory (no gradients, activations or optimiser "
                 "state); GRPO needs training memory",
        "device": args.device,
        "device_name": next((w["device_name"] for w in work.values() if "device_name" in w), None),
        "versions": versions(),
        "model": summary,
        "population": n, "batch": b, "max_new_tokens": L, "population_batch": args.population_batch,
        "sigma": args.sigma, "alpha": args.alpha,
        "sequences_per_workload": n * b, "expected_tokens": n * b * L,
        "responses_run_to_max_new_tokens": (all(work[m]["tokens"] == n * b * L for m in gen_modes)
                                            if gen_modes else None),
        **results,
        **peak_ratios(work, args.device),
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
