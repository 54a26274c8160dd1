"""Benchmark: one ES step vs plain inference of the same sequences, side by side in one run.

On the embedded default (CPU), measures an ES update (N members x B prompts, greedy,
one response per prompt) and plain greedy inference of the same N x B sequences with
the unperturbed model, in two batchings:

- ``inference_same_batching``: N generate calls of B prompts (what the sequential
  population evaluator does, minus perturbation, scoring and the update);
- ``inference_one_batch``: one generate call over all N x B prompts (the throughput a
  population-batched evaluator could reach).

Prints ONE JSON object. Key fields:
  overhead_share                 (perturb + restore + update) / ES step time   target <= 0.03
  throughput_ratio_vs_inference  ES tokens/s / same-batching inference tokens/s
  throughput_ratio_vs_one_batch  ES tokens/s / one-batch inference tokens/s

Usage: python benchmarks/es_step.py [--population 16] [--batch 32] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--population", type=int, default=16)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    from esreason import tasks, verifiers
    from esreason.backends.base import SamplingParams
    from esreason.backends.hf import HFPolicy, load_model
    from esreason.backends.sampling import Sampler
    from esreason.es import shaping
    from esreason.es.evaluate import evaluate_population
    from esreason.es.population import draw_population

    model, tok = load_model("demo")
    policy = HFPolicy(model, tok)
    sampler = Sampler(model, tok, batch_size=max(256, args.batch))
    task = tasks.get("demo-add")
    problems = task.load("train", limit=args.batch)
    prompts = [tasks.render_prompt(tok, p.messages) for p in problems]
    golds = [p.gold for p in problems]
    scorer = verifiers.get(task.verifier)
    params = [SamplingParams(max_new_tokens=args.max_new_tokens, temperature=0.0)] * args.population

    es_times, es_tokens, overhead, phases = [], [], [], []
    inf_same, inf_same_tok, inf_one, inf_one_tok = [], [], [], []
    for rep in range(args.repeats):
        # --- ES step
        pop = draw_population(0, rep, args.population, "one_point")
        t0 = time.perf_counter()
        res = evaluate_population(policy, sampler, pop, 1e-2, prompts, golds, scorer, params)
        z = shaping.zscore(res.member_rewards)
        policy.apply_update(pop.seeds, list(z), 0.0)  # alpha 0: same work, centre unchanged
        dt = time.perf_counter() - t0
        tm = policy.params.pop_timings()
        es_times.append(dt)
        es_tokens.append(res.tokens)
        overhead.append((tm.get("perturb", 0) + tm.get("restore", 0) + tm.get("update", 0)) / dt)
        phases.append({"perturb": tm.get("perturb", 0), "restore": tm.get("restore", 0),
                       "update": tm.get("update", 0), "generate": res.timings["generate"],
                       "reward": res.timings["reward"]})
        # --- plain inference, same batching
        t0 = time.perf_counter()
        n_tok = sum(sampler.generate(prompts, params[0]).num_tokens for _ in range(args.population))
        inf_same.append(time.perf_counter() - t0)
        inf_same_tok.append(n_tok)
        # --- plain inference, one batch of N x B
        big = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=0.0)
        sampler_big = Sampler(model, tok, batch_size=args.population * args.batch)
        t0 = time.perf_counter()
        n_tok = sampler_big.generate(prompts * args.population, big).num_tokens
        inf_one.append(time.perf_counter() - t0)
        inf_one_tok.append(n_tok)

    es_tps = np.median(np.array(es_tokens) / np.array(es_times))
    same_tps = np.median(np.array(inf_same_tok) / np.array(inf_same))
    one_tps = np.median(np.array(inf_one_tok) / np.array(inf_one))
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
        "overhead_share": float(np.median(overhead)),
        "throughput_ratio_vs_inference": float(es_tps / same_tps),
        "throughput_ratio_vs_one_batch": float(es_tps / one_tps),
        "phase_seconds_last_step": phases[-1],
        "targets": {"overhead_share": "<= 0.03"},
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
