"""Benchmark: one ES step vs plain inference of the same sequences, side by side in one run.

On the embedded default (CPU), measures an ES update (N members x B prompts, greedy,
one response per prompt) and plain greedy inference of the same N x B sequences with
the unperturbed model, in two batchings:

- ``inference_same_batching``: N generate calls of B prompts (what the sequential
  population evaluator does, minus perturbation, scoring and the update);
- ``inference_one_batch``: one generate call over all N x B prompts (the throughput a
  population-batched evaluator could reach).

and the same ES update with the population-batched evaluator (``backend.type: batched``,
src/esreason/backends/batched.py), checking that its rewards equal the sequential ones.

Prints ONE JSON object. Key fields (the project's targets after each):
  overhead_share                 (perturb + restore + update) / sequential ES step time    <= 0.03
  throughput_ratio_vs_inference  sequential ES tokens/s / same-batching inference tokens/s >= 0.90
  throughput_ratio_vs_one_batch  sequential ES tokens/s / one-batch inference tokens/s
  batched.batched_speedup        {N: sequential / batched population evaluation time}, B fixed  >= 5 at N=32
  batched.throughput_ratio_vs_inference  batched ES tokens/s / one-batch inference tokens/s  >= 0.90
  batched.overhead_share         (member-weight stacking + update) / batched ES step time  <= 0.03
  batched.mfu                    model FLOP/s of batched generation / measured fp32 GEMM peak  >= 0.30
  rss.rss_ratio_es_vs_inference  peak RSS of a batched ES step / one-batch inference, N x B  <= 1.2
  rss.rss_ratio_grpo_vs_inference  peak RSS of one GRPO update (N responses x B prompts) / same
  rss.*_nocache                  the same ES ratios with es.direction_cache_mb = 0
  ray.speedup_2_vs_1             population evaluation time with 1 HF engine / with 2 (Ray on CPU, one
                                 torch thread per engine), rewards checked equal to the sequential reference
The ``inference_one_batch_over_same_batching`` field is the ceiling of any population
batching on this machine: batching same-weight rows is the best case, per-member weights
can only be slower.

Peak RSS is measured in child processes (one workload each: ``--child MODE``), so peaks
are separable; ``rss.*_mb`` are VmHWM (see ``peak_rss_mb``), ``rss.baseline_mb`` a child
that only loads.

Usage: python benchmarks/es_step.py [--population 16] [--batch 32] [--repeats 3] [--quick]
       [--sizes 8,16,32,64] [--no-rss] [--no-ray]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch


def _setup(batch: int, sampler_batch: int):
    from esreason import tasks, verifiers
    from esreason.backends.hf import HFPolicy, load_model
    from esreason.backends.sampling import Sampler

    model, tok = load_model("demo")
    policy = HFPolicy(model, tok)
    sampler = Sampler(model, tok, batch_size=sampler_batch)
    task = tasks.get("demo-add")
    problems = task.load("train", limit=batch)
    prompts = [tasks.render_prompt(tok, p.messages) for p in problems]
    golds = [p.gold for p in problems]
    scorer = verifiers.get(task.verifier)
    return model, tok, policy, sampler, prompts, golds, scorer


# --------------------------------------------------------------------------- FLOPs / peak


def matmul_flops_per_token(model) -> int:
    """2 x (weights used in matrix products): every Linear in the layers plus the LM head."""
    total = 0
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            total += module.weight.numel()
    return 2 * total


def generation_flops(model, prompt_lens: list[int], response_lens: list[int]) -> float:
    """Model FLOPs of prefill + decode: per token 2 x matmul weights + 4 x layers x heads x head_dim x context."""
    cfg = model.config
    per_tok = matmul_flops_per_token(model)
    attn = 4 * cfg.num_hidden_layers * cfg.num_attention_heads * model.model.layers[0].self_attn.head_dim
    flops = 0.0
    for p, r in zip(prompt_lens, response_lens):
        n = p + r
        flops += n * per_tok + attn * n * (n + 1) / 2  # context c = 1..n over the processed tokens
    return flops


def gemm_peak_flops(size: int = 1024, repeats: int = 7) -> float:
    """fp32 GEMM FLOP/s of this process (median of ``repeats`` size^3 products)."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    torch.mm(a, b)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        torch.mm(a, b)
        times.append(time.perf_counter() - t0)
    return 2 * size ** 3 / float(np.median(times))


# --------------------------------------------------------------------------- children (peak RSS)


def run_child(mode: str, args: argparse.Namespace) -> None:
    """One workload, then print {"maxrss_mb": ...}: the peak of this process alone."""
    from esreason.backends.base import SamplingParams
    from esreason.backends.batched import BatchedEvaluator
    from esreason.backends.sampling import Sampler
    from esreason.es import shaping
    from esreason.es_loop.evaluate import evaluate_population
    from esreason.es.population import draw_population

    n, b = args.population, args.batch
    if mode == "grpo":
        from esreason.grpo.config import load_grpo_config
        from esreason.grpo.run import run_grpo

        root = Path(__file__).resolve().parents[1]
        cfg = load_grpo_config(root / "configs" / "demo" / "grpo.yaml", [
            "train.max_steps=1", "eval.every=0", "checkpoint.every=0", f"train.batch_size={b}",
            f"grpo.num_generations={n}", f"generation.max_new_tokens={args.max_new_tokens}",
            f"grpo.micro_batch_size={min(64, n * b)}"])
        with tempfile.TemporaryDirectory() as tmp:
            run_grpo(cfg, Path(tmp) / "run", progress=False)
    else:
        model, tok, policy, sampler, prompts, golds, scorer = _setup(b, max(256, b))
        if mode.endswith("_nocache"):  # directions regenerated from their seeds in the update
            from esreason.backends.hf import HFPolicy

            policy = HFPolicy(model, tok, direction_cache_mb=0)
            mode = mode[: -len("_nocache")]
        params = [SamplingParams(max_new_tokens=args.max_new_tokens)] * n
        pop = draw_population(0, 0, n, "one_point")
        if mode in ("es_batched", "es_sequential"):
            if mode == "es_batched":
                res = BatchedEvaluator(policy, sampler).evaluate(pop, 1e-2, prompts, golds, scorer, params)
            else:
                res = evaluate_population(policy, sampler, pop, 1e-2, prompts, golds, scorer, params)
            policy.apply_update(pop.seeds, list(shaping.zscore(res.member_rewards)), 0.0)
        elif mode == "inference_one_batch":
            Sampler(model, tok, batch_size=n * b).generate(prompts * n, params[0])
        elif mode == "inference_same_batching":
            for _ in range(n):
                sampler.generate(prompts, params[0])
        elif mode != "baseline":
            raise SystemExit(f"unknown --child mode {mode!r}")
    print(json.dumps({"maxrss_mb": peak_rss_mb()}))


def peak_rss_mb() -> float:
    """Peak resident set of this process image in MB: VmHWM of /proc/self/status.

    Not ``ru_maxrss``: Linux carries the pre-exec high-water mark into ru_maxrss across
    execve, so a child started from a large parent would report the parent's peak.
    VmHWM belongs to the address space, which exec replaces. Falls back to ru_maxrss
    where /proc is missing.
    """
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure_rss(args: argparse.Namespace) -> dict:
    """Peak RSS per workload, each in its own child process."""
    out: dict = {}
    env = dict(os.environ)
    for mode in ("baseline", "inference_one_batch", "es_batched", "es_batched_nocache", "inference_same_batching",
                 "es_sequential", "es_sequential_nocache", "grpo"):
        cmd = [sys.executable, __file__, "--child", mode, "--population", str(args.population),
               "--batch", str(args.batch), "--max-new-tokens", str(args.max_new_tokens)]
        if args.threads:
            cmd += ["--threads", str(args.threads)]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            out[f"{mode}_error"] = proc.stderr.strip().splitlines()[-1:] or ["failed"]
            continue
        out[f"{mode}_mb"] = json.loads(proc.stdout.strip().splitlines()[-1])["maxrss_mb"]
    one, base = out.get("inference_one_batch_mb"), out.get("baseline_mb")
    if one:
        for key, mode in (("rss_ratio_es_vs_inference", "es_batched"), ("rss_ratio_grpo_vs_inference", "grpo")):
            if f"{mode}_mb" in out:
                out[key] = out[f"{mode}_mb"] / one
                if base is not None and one > base:
                    out[key.replace("rss_ratio", "rss_increment_ratio")] = (out[f"{mode}_mb"] - base) / (one - base)
        if "es_batched_nocache_mb" in out:
            out["rss_ratio_es_vs_inference_nocache"] = out["es_batched_nocache_mb"] / one
    same = out.get("inference_same_batching_mb")
    if same and "es_sequential_mb" in out:
        out["rss_ratio_sequential_es_vs_same_batching"] = out["es_sequential_mb"] / same
    if same and "es_sequential_nocache_mb" in out:
        out["rss_ratio_sequential_es_vs_same_batching_nocache"] = out["es_sequential_nocache_mb"] / same
    return out


# --------------------------------------------------------------------------- Ray row


def measure_ray(args: argparse.Namespace, policy, prompts, golds, scorer, params) -> dict:
    """Population evaluation with 1 vs 2 HF engine actors (one torch thread each), side by side.

    Each pool is started once (start-up reported apart), then evaluates the same populations
    ``repeats`` times; rewards are compared with the in-process sequential reference.
    """
    import ray

    from esreason.backends.engine import HFEngineOptions, policy_state
    from esreason.backends.ray_pool import RayEnginePool
    from esreason.es_loop.evaluate import evaluate_population
    from esreason.es.population import draw_population

    n = args.population
    pops = [draw_population(2, rep, n, "one_point") for rep in range(args.repeats)]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the engines' setting: the reference rewards are then bit-comparable
    try:
        ref = [evaluate_population(policy, _sampler_of(policy), p, 1e-2, prompts, golds, scorer, params).rewards
               for p in pops]
    finally:
        torch.set_num_threads(threads)
    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="ERROR")
    out: dict = {}
    try:
        state = policy_state(policy)
        for engines in (1, 2):
            t0 = time.perf_counter()
            pool = RayEnginePool("hf", HFEngineOptions(threads=1), state, engines, reference=policy, cpus=1)
            start = time.perf_counter() - t0
            try:
                times, same = [], []
                for p, r in zip(pops, ref):
                    t0 = time.perf_counter()
                    res = pool.evaluate(p, 1e-2, prompts, golds, scorer, params)
                    times.append(time.perf_counter() - t0)
                    same.append(bool((res.rewards == r).all()))
            finally:
                pool.close()
            out[f"engines_{engines}"] = {"start_s": start, "evaluate_s_median": float(np.median(times)),
                                         "rewards_identical_to_sequential": all(same)}
    finally:
        ray.shutdown()
    out["speedup_2_vs_1"] = out["engines_1"]["evaluate_s_median"] / out["engines_2"]["evaluate_s_median"]
    return out


def _sampler_of(policy):
    from esreason.backends.sampling import Sampler

    return Sampler(policy.model, policy.tokenizer, batch_size=256)


# --------------------------------------------------------------------------- main


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--population", type=int, default=16)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch default)")
    ap.add_argument("--quick", action="store_true", help="batched_speedup at N in 8, 32 only (default 8,16,32,64)")
    ap.add_argument("--sizes", default="", help="comma-separated N for batched_speedup (overrides --quick)")
    ap.add_argument("--no-rss", action="store_true", help="skip the peak-RSS child processes")
    ap.add_argument("--no-ray", action="store_true", help="skip the Ray row (1 vs 2 HF engines)")
    ap.add_argument("--rss-only", action="store_true", help="only the peak-RSS rows (child processes)")
    ap.add_argument("--child", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.child:
        run_child(args.child, args)
        return
    if args.rss_only:
        print(json.dumps({"benchmark": "es_step", "population": args.population, "batch": args.batch,
                          "max_new_tokens": args.max_new_tokens, "rss": measure_rss(args)}, indent=2))
        return

    from esreason.backends.base import SamplingParams
    from esreason.backends.batched import BatchedEvaluator
    from esreason.backends.sampling import Sampler
    from esreason.es import shaping
    from esreason.es_loop.evaluate import evaluate_population
    from esreason.es.population import draw_population

    model, tok, policy, sampler, prompts, golds, scorer = _setup(args.batch, max(256, args.batch))
    bev = BatchedEvaluator(policy, sampler)
    params = [SamplingParams(max_new_tokens=args.max_new_tokens, temperature=0.0)] * args.population

    es_times, es_tokens, overhead, phases = [], [], [], []
    inf_same, inf_same_tok, inf_one, inf_one_tok = [], [], [], []
    b_times, b_tokens, b_overhead, b_gen, b_phases, same_rewards = [], [], [], [], [], []
    seq_gen = []
    for rep in range(args.repeats):
        # --- ES step (sequential reference)
        pop = draw_population(0, rep, args.population, "one_point")
        t0 = time.perf_counter()
        res = evaluate_population(policy, sampler, pop, 1e-2, prompts, golds, scorer, params)
        z = shaping.zscore(res.member_rewards)
        policy.apply_update(pop.seeds, list(z), 0.0)  # alpha 0: same work, centre unchanged
        dt = time.perf_counter() - t0
        tm = policy.params.pop_timings()
        es_times.append(dt)
        es_tokens.append(res.tokens)
        seq_gen.append(res.timings["generate"])
        overhead.append((tm.get("perturb", 0) + tm.get("restore", 0) + tm.get("update", 0)) / dt)
        phases.append({"perturb": tm.get("perturb", 0), "restore": tm.get("restore", 0),
                       "update": tm.get("update", 0), "generate": res.timings["generate"],
                       "reward": res.timings["reward"]})
        # --- the same ES step, population-batched
        t0 = time.perf_counter()
        resb = bev.evaluate(pop, 1e-2, prompts, golds, scorer, params)
        zb = shaping.zscore(resb.member_rewards)
        policy.apply_update(pop.seeds, list(zb), 0.0)
        dtb = time.perf_counter() - t0
        tmb = policy.params.pop_timings()
        b_times.append(dtb)
        b_tokens.append(resb.tokens)
        b_gen.append(resb.timings["generate"] + resb.timings["stack"])
        b_overhead.append((resb.timings["stack"] + tmb.get("update", 0)) / dtb)
        b_phases.append({"stack_members": resb.timings["stack"], "update": tmb.get("update", 0),
                         "generate": resb.timings["generate"], "reward": resb.timings["reward"]})
        same_rewards.append(bool((resb.rewards == res.rewards).all()) and resb.tokens == res.tokens)
        # --- plain inference, same batching
        t0 = time.perf_counter()
        n_tok = sum(sampler.generate(prompts, params[0]).num_tokens for _ in range(args.population))
        inf_same.append(time.perf_counter() - t0)
        inf_same_tok.append(n_tok)
        # --- plain inference, one batch of N x B
        big = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=0.0)
        sampler_big = Sampler(model, tok, batch_size=args.population * args.batch)
        t0 = time.perf_counter()
        gen_one = sampler_big.generate(prompts * args.population, big)
        inf_one.append(time.perf_counter() - t0)
        inf_one_tok.append(gen_one.num_tokens)

    es_tps = np.median(np.array(es_tokens) / np.array(es_times))
    same_tps = np.median(np.array(inf_same_tok) / np.array(inf_same))
    one_tps = np.median(np.array(inf_one_tok) / np.array(inf_one))
    b_tps = np.median(np.array(b_tokens) / np.array(b_times))

    # --- batched_speedup over population sizes (population evaluation only, B fixed)
    sizes = ([int(s) for s in args.sizes.split(",") if s] if args.sizes
             else ([8, 32] if args.quick else [8, 16, 32, 64]))
    speedup: dict[str, float] = {}
    identical: dict[str, bool] = {}
    for n in sizes:
        if n == args.population:
            ratios = [s / b for s, b in zip(seq_gen, b_gen)]
            identical[str(n)] = all(same_rewards)
        else:
            ratios, same = [], []
            pn = [SamplingParams(max_new_tokens=args.max_new_tokens)] * n
            for rep in range(args.repeats):
                pop = draw_population(1, rep, n, "one_point")
                t0 = time.perf_counter()
                r_seq = evaluate_population(policy, sampler, pop, 1e-2, prompts, golds, scorer, pn)
                t_seq = time.perf_counter() - t0
                t0 = time.perf_counter()
                r_b = bev.evaluate(pop, 1e-2, prompts, golds, scorer, pn)
                t_b = time.perf_counter() - t0
                policy.params.pop_timings()
                ratios.append(t_seq / t_b)
                same.append(bool((r_b.rewards == r_seq.rewards).all()))
            identical[str(n)] = all(same)
        speedup[str(n)] = float(np.median(ratios))

    # --- MFU of batched generation (same process, measured GEMM peak)
    plens = [len(x) for x in tok(prompts, add_special_tokens=False)["input_ids"]]
    resp = [len(t) for g in bev.generate_population(
        list(draw_population(0, 0, args.population, "one_point").seeds), [1e-2] * args.population, prompts,
        params) for t in g.token_ids]
    flops = generation_flops(model, plens * args.population, resp)
    peak = gemm_peak_flops()
    b_gen_med = float(np.median(b_gen))
    mfu = flops / b_gen_med / peak

    out = {
        "benchmark": "es_step",
        "model": "embedded default",
        "params": int(policy.params.num_parameters),
        "population": args.population,
        "batch": args.batch,
        "max_new_tokens": args.max_new_tokens,
        "repeats": args.repeats,
        "torch_threads": torch.get_num_threads(),
        "es_step_s_median": float(np.median(es_times)),
        "es_tokens_per_step": int(np.median(es_tokens)),
        "es_tokens_per_s": float(es_tps),
        "inference_same_batching_tokens_per_s": float(same_tps),
        "inference_one_batch_tokens_per_s": float(one_tps),
        "inference_one_batch_over_same_batching": float(one_tps / same_tps),
        "overhead_share": float(np.median(overhead)),
        "throughput_ratio_vs_inference": float(es_tps / same_tps),
        "throughput_ratio_vs_one_batch": float(es_tps / one_tps),
        "phase_seconds_last_step": phases[-1],
        "batched": {
            "es_step_s_median": float(np.median(b_times)),
            "es_tokens_per_s": float(b_tps),
            "rewards_identical_to_sequential": all(same_rewards),
            "throughput_ratio_vs_inference": float(b_tps / one_tps),
            "throughput_ratio_vs_same_batching": float(b_tps / same_tps),
            "overhead_share": float(np.median(b_overhead)),
            "batched_speedup": speedup,
            "batched_speedup_rewards_identical": identical,
            "generation_flops": flops,
            "generation_s_median": b_gen_med,
            "gemm_peak_gflops": peak / 1e9,
            "mfu": float(mfu),
            "phase_seconds_last_step": b_phases[-1],
        },
        "targets": {"overhead_share": "<= 0.03", "throughput_ratio_vs_inference": ">= 0.90",
                    "batched_speedup[32]": ">= 5", "mfu": ">= 0.30", "rss_ratio_es_vs_inference": "<= 1.2"},
    }
    if not args.no_ray:
        out["ray"] = measure_ray(args, policy, prompts, golds, scorer, params)
    if not args.no_rss:
        out["rss"] = measure_rss(args)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
