"""The child side of benchmarks/gpu_memory.py: one workload per process, its memory and time.

``gpu_memory.py --child MODE`` calls :func:`child_main`, which loads the model, resets the
peak statistics, runs the workload (plain inference, one ES step sequential or batched,
one GRPO update; see gpu_memory.py's docstring for what each does) and prints one line
``RESULT_PREFIX + json`` that the parent parses. Memory helpers (:func:`allocated_gb`,
:func:`reset_peak`, :func:`memory_report`) are here too.
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from es_step import peak_rss_mb  # benchmarks/ is on sys.path when run as a script

ROOT = Path(__file__).resolve().parents[1]
RESULT_PREFIX = "GPU_MEMORY_RESULT "
GIB = 2**30


# --------------------------------------------------------------------------- memory


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def allocated_gb(device: str, model: Any = None) -> float:
    """Allocated accelerator memory in GiB (CPU: the model's parameter bytes)."""
    if device.startswith("cuda"):
        return torch.cuda.memory_allocated() / GIB
    if model is None:
        return 0.0
    return sum(p.numel() * p.element_size() for p in model.parameters()) / GIB


def reset_peak(device: str) -> None:
    if device.startswith("cuda"):
        _sync(device)
        torch.cuda.reset_peak_memory_stats()


def memory_report(device: str, weights_gb: float) -> dict[str, Any]:
    """Peaks since the last reset_peak (CUDA) and the child's peak RSS."""
    out: dict[str, Any] = {"weights_gb": weights_gb, "peak_allocated_gb": None, "peak_reserved_gb": None,
                           "peak_above_weights_gb": None}
    if device.startswith("cuda"):
        _sync(device)
        peak = torch.cuda.max_memory_allocated() / GIB
        out.update(peak_allocated_gb=peak, peak_reserved_gb=torch.cuda.max_memory_reserved() / GIB,
                   peak_above_weights_gb=peak - weights_gb)
    out["maxrss_mb"] = peak_rss_mb()
    return out


# --------------------------------------------------------------------------- child workloads


class RecordingGenerator:
    """A Generator that forwards to ``inner`` and keeps every Generation it returned."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.generations: list[Any] = []

    def generate(self, prompts: Sequence[str], params: Any, **kwargs: Any) -> Any:
        gen = self.inner.generate(prompts, params, **kwargs)
        self.generations.append(gen)
        return gen


def setup_task(tok: Any, batch: int) -> tuple[list[str], list[Any], Callable]:
    """The first ``batch`` demo-add training prompts (chat template), golds and the scorer."""
    from esreason import tasks, verifiers

    task = tasks.get("demo-add")
    problems = task.load("train", limit=batch)
    prompts = [tasks.render_prompt(tok, p.messages) for p in problems]
    return prompts, [p.gold for p in problems], verifiers.get(task.verifier)


def update_weights(member_rewards: Any) -> tuple[list[float], str]:
    """z-scores of the member rewards; alternating +1/-1 when all are equal (z would be all 0)."""
    from esreason.es import shaping

    z = shaping.zscore(member_rewards)
    if any(float(v) != 0.0 for v in z):
        return [float(v) for v in z], "zscore"
    return [1.0 if i % 2 == 0 else -1.0 for i in range(len(z))], "alternating (all rewards equal)"


def run_inference(mode: str, args: argparse.Namespace, model: Any, tok: Any, prompts: list[str]) -> dict:
    from esreason.backends.base import SamplingParams
    from esreason.backends.sampling import Sampler

    n, b = args.population, args.batch
    params = SamplingParams(max_new_tokens=args.max_new_tokens)
    t0 = time.perf_counter()
    if mode == "inference_one_batch":
        tokens = Sampler(model, tok, batch_size=n * b).generate(prompts * n, params).num_tokens
    else:
        sampler = Sampler(model, tok, batch_size=b)
        tokens = sum(sampler.generate(prompts, params).num_tokens for _ in range(n))
    _sync(args.device)
    return {"seconds": time.perf_counter() - t0, "tokens": tokens}


def _batched_with_recording(policy: Any, sampler: Any, population_batch: int) -> tuple[Any, list[Any]]:
    """A BatchedEvaluator whose generate_population results are also kept in the returned list."""
    from esreason.backends.batched import BatchedEvaluator

    bev = BatchedEvaluator(policy, sampler, population_batch=population_batch)
    gens: list[Any] = []
    inner = bev.generate_population

    def recording(*a: Any, **k: Any) -> Any:
        out = inner(*a, **k)
        gens.extend(out)
        return out

    bev.generate_population = recording  # type: ignore[method-assign]
    return bev, gens


def policy_state_bytes(policy: Any) -> int:
    """Bytes of the tensors an HFPolicy keeps besides the model: saved centre and fp32 masters."""
    total = 0
    for attr in ("_centre", "_master"):
        for t in (getattr(policy.params, attr, None) or {}).values():
            total += t.numel() * t.element_size()
    return total


def run_es(mode: str, args: argparse.Namespace, model: Any, tok: Any, prompts: list[str], golds: list[Any],
           scorer: Callable, weights_gb: float) -> dict:
    """One ES step (evaluation + update); the policy's own state counts towards the peak."""
    from esreason.backends.base import SamplingParams
    from esreason.backends.hf import HFPolicy
    from esreason.backends.sampling import Sampler
    from esreason.es_loop.evaluate import evaluate_population
    from esreason.es.population import draw_population

    n = args.population
    policy = HFPolicy(model, tok, master_weights=args.master_weights, direction_cache_mb=args.direction_cache_mb)
    on_gpu = args.device.startswith("cuda")
    state_gb = allocated_gb(args.device) - weights_gb if on_gpu else policy_state_bytes(policy) / GIB
    sampler = Sampler(model, tok, batch_size=args.batch)
    pop = draw_population(0, 0, n, "one_point")
    params = [SamplingParams(max_new_tokens=args.max_new_tokens)] * n
    t0 = time.perf_counter()
    if mode == "es_step_sequential":
        rec = RecordingGenerator(sampler)
        res = evaluate_population(policy, rec, pop, args.sigma, prompts, golds, scorer, params)
        gens = rec.generations
    else:
        bev, gens = _batched_with_recording(policy, sampler, args.population_batch)
        res = bev.evaluate(pop, args.sigma, prompts, golds, scorer, params)
    cache_mb = getattr(policy.params, "_cache_used", 0) / 2**20
    weights, how = update_weights(res.member_rewards)
    policy.apply_update(pop.seeds, weights, args.alpha)
    _sync(args.device)
    seconds = time.perf_counter() - t0
    if args.dump:
        dump = {"rewards": res.rewards.tolist(), "texts": [g.texts for g in gens],
                "token_ids": [g.token_ids for g in gens]}
        Path(args.dump).write_text(json.dumps(dump))
    return {"seconds": seconds, "tokens": int(res.tokens), "policy_state_gb": state_gb,
            "master_weights": policy.params.master, "restore": policy.params.restore_mode,
            "direction_cache_mb": args.direction_cache_mb, "direction_cache_filled_mb": cache_mb,
            "update_weights": how, "phase_seconds": {**res.timings, **policy.params.pop_timings()}}


def grpo_overrides(args: argparse.Namespace) -> list[str]:
    """--set overrides of configs/demo/grpo.yaml for one GRPO update of N x B sequences."""
    n, b = args.population, args.batch
    micro = args.grpo_micro_batch or math.gcd(64, n * b)
    return [f"model={args.model_path}", f"device={args.device}", f"dtype={args.dtype}",
            "train.max_steps=1", "eval.every=0", "checkpoint.every=0", f"train.batch_size={b}",
            f"grpo.num_generations={n}", f"generation.max_new_tokens={args.max_new_tokens}",
            f"grpo.micro_batch_size={micro}", *args.grpo_set]


def _grpo_run_facts(run_dir: Path) -> dict[str, Any]:
    """Completion stats and update time from metrics.jsonl, the TRL arguments from manifest.json."""
    out: dict[str, Any] = {}
    metrics = run_dir / "metrics.jsonl"
    if metrics.is_file():
        rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
        last = rows[-1] if rows else {}
        out["update_seconds"] = last.get("time/step")
        out["completions"] = {k: v for k, v in last.items() if k.startswith("completions/")}
    manifest = run_dir / "manifest.json"
    if manifest.is_file():
        trl_args = json.loads(manifest.read_text()).get("trainer", {}).get("trl_args", {})
        keys = ("per_device_train_batch_size", "gradient_accumulation_steps", "steps_per_generation",
                "num_generations", "beta", "bf16", "activation_checkpointing", "optim", "use_vllm")
        out["trl_args"] = {k: trl_args.get(k) for k in keys}
    return out


def run_grpo_step(args: argparse.Namespace) -> dict:
    """One GRPO update via run_grpo; peak stats are reset right after the policy is loaded."""
    import esreason.backends.hf as hf
    from esreason.grpo.config import load_grpo_config
    from esreason.grpo.run import run_grpo

    overrides = grpo_overrides(args)
    cfg = load_grpo_config(ROOT / "configs" / "demo" / "grpo.yaml", overrides)
    marks: dict[str, float] = {}
    original = hf.load_model

    def load_and_mark(*a: Any, **k: Any) -> Any:
        model, tok = original(*a, **k)
        if "weights_gb" not in marks:
            marks["weights_gb"] = allocated_gb(args.device, model)
            reset_peak(args.device)
        return model, tok

    hf.load_model = load_and_mark  # run_grpo imports load_model from the module at call time
    try:
        with tempfile.TemporaryDirectory(prefix="gpu_memory_grpo_") as tmp:
            t0 = time.perf_counter()
            run_grpo(cfg, Path(tmp) / "run", progress=False)
            _sync(args.device)
            seconds = time.perf_counter() - t0
            facts = _grpo_run_facts(Path(tmp) / "run")
    finally:
        hf.load_model = original
    out = memory_report(args.device, marks.get("weights_gb", 0.0))
    mean_len = facts.get("completions", {}).get("completions/mean_length")
    tokens = int(round(mean_len * args.population * args.batch)) if mean_len is not None else None
    out.update(seconds=seconds, tokens=tokens, overrides=overrides, **facts)
    return out


def run_child(args: argparse.Namespace) -> dict:
    """Load the model, reset the peak, run one workload, report memory and time."""
    mode = args.child
    if mode == "grpo_step":
        return run_grpo_step(args)
    from esreason.backends.hf import load_model

    model, tok = load_model(args.model_path, args.dtype, args.device)
    _sync(args.device)
    reset_peak(args.device)
    weights_gb = allocated_gb(args.device, model)
    prompts, golds, scorer = setup_task(tok, args.batch)
    if mode.startswith("inference_"):
        result = run_inference(mode, args, model, tok, prompts)
    elif mode.startswith("es_step_"):
        result = run_es(mode, args, model, tok, prompts, golds, scorer, weights_gb)
    else:
        raise SystemExit(f"unknown --child mode {mode!r}")
    out = memory_report(args.device, weights_gb)
    out.update(result)
    out["prompt_tokens_max"] = max(len(x) for x in tok(prompts, add_special_tokens=False)["input_ids"])
    return out


def child_main(args: argparse.Namespace) -> None:
    out = run_child(args)
    if args.device.startswith("cuda"):
        out["device_name"] = torch.cuda.get_device_name()
    print(RESULT_PREFIX + json.dumps(out), flush=True)
