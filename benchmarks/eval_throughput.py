"""Benchmark: where evaluation time goes, and the Sampler against HF ``generate`` on eval prompts.

Model: the shipped embedded default (``esreason eval --model demo``) when present, else a
freshly initialised model of the same architecture (numbers then describe a model that
rarely answers, so verification is even cheaper than in a real run).

1. ``verify_share``: one full ``esreason.eval.evaluate`` run (files, resume bookkeeping,
   bootstrap) over the demo suite (demo-add, demo-sub, demo-countdown), ``--problems``
   problems each, ``--samples`` samples at temperature 0.6 plus a greedy sample, and the
   share of its wall time spent verifying responses (scoring + vote keys). Target <= 0.05.
   ``aggregate_share`` is the share spent turning records into metrics (Maj@K grouping,
   exact expected Maj@K, bootstrap excluded).
2. ``sampler_vs_generate``: tokens/s of :class:`esreason.backends.sampling.Sampler` over
   tokens/s of ``model.generate`` on the same rendered eval prompts, greedy, same batch
   (``--batch-size`` rows), exactly ``--max-new-tokens`` tokens per row on both sides
   (Sampler ``ignore_eos=True``; ``generate`` with ``min_new_tokens``). The two alternate
   over ``--repeats`` repeats; the medians are compared.

Prints ONE JSON object. Usage:
    python benchmarks/eval_throughput.py [--problems 32] [--samples 16] [--max-new-tokens 48]
        [--batch-size 256] [--repeats 3] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time

import torch


def _load_model():
    from esreason.embedded import build_model, build_tokenizer, demo_model_dir

    if (demo_model_dir() / "config.json").is_file():
        from esreason.backends.hf import load_model

        model, tok = load_model("demo")
        return model, tok, "embedded default"
    tok = build_tokenizer()
    return build_model(tok), tok, "fresh random model, embedded default architecture"


def _verify_share(model, tok, args) -> dict:
    from esreason.eval import evaluate

    tasks = ["demo-add", "demo-sub", "demo-countdown"]
    with tempfile.TemporaryDirectory() as out:
        t0 = time.perf_counter()
        summary = evaluate((model, tok), tasks, output_dir=out, samples=args.samples, temperature=0.6,
                           max_new_tokens=args.max_new_tokens, greedy=True, limit=args.problems,
                           batch_size=args.batch_size, progress=False, ci_resamples=1000)
        total = time.perf_counter() - t0
    timings = summary.timings
    verify = timings["total"]["verify_s"]
    generate = timings["total"]["generate_s"]
    aggregate = sum(timings[t]["aggregate_s"] for t in tasks)
    return {
        "tasks": tasks, "problems_per_task": args.problems, "samples": args.samples,
        "responses": timings["total"]["responses"], "tokens": timings["total"]["tokens"],
        "total_s": round(total, 3), "generate_s": round(generate, 3), "verify_s": round(verify, 4),
        "aggregate_s": round(aggregate, 4),
        "verify_share": round(verify / total, 5), "aggregate_share": round(aggregate / total, 5),
        "pass@1": {t: round(summary.value("pass@1", t), 4) for t in tasks},
    }


def _prompts(tok, n: int) -> list[str]:
    from esreason.tasks import get, render_prompt

    problems = get("demo-add").load("test", None, n)
    return [render_prompt(tok, p.messages) for p in problems]


def _sampler_vs_generate(model, tok, args) -> dict:
    from esreason.backends.base import SamplingParams
    from esreason.backends.sampling import Sampler

    prompts = _prompts(tok, args.batch_size)
    sampler = Sampler(model, tok, batch_size=args.batch_size)
    params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=0.0)
    enc = tok(prompts, add_special_tokens=False, padding=True, return_tensors="pt")
    s_times, g_times, s_tokens, g_tokens = [], [], 0, 0
    sampler.generate(prompts[:8], params, ignore_eos=True)  # warm-up
    with torch.inference_mode():
        model.generate(**{k: v[:8] for k, v in enc.items()}, do_sample=False, max_new_tokens=4,
                       pad_token_id=tok.pad_token_id)
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        s_tokens = sampler.generate(prompts, params, ignore_eos=True).num_tokens
        s_times.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(**enc, do_sample=False, max_new_tokens=args.max_new_tokens,
                                 min_new_tokens=args.max_new_tokens, pad_token_id=tok.pad_token_id)
        g_times.append(time.perf_counter() - t0)
        g_tokens = int((out.shape[1] - enc["input_ids"].shape[1]) * out.shape[0])
    s_rate = s_tokens / statistics.median(s_times)
    g_rate = g_tokens / statistics.median(g_times)
    return {"batch_size": args.batch_size, "max_new_tokens": args.max_new_tokens,
            "tokens": {"sampler": s_tokens, "generate": g_tokens},
            "tokens_per_s": {"sampler": round(s_rate, 1), "generate": round(g_rate, 1)},
            "sampler_vs_generate": round(s_rate / g_rate, 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--problems", type=int, default=32)
    ap.add_argument("--samples", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model, tok, which = _load_model()
    model.eval()
    share = _verify_share(model, tok, args)
    speed = _sampler_vs_generate(model, tok, args)
    print(json.dumps({
        "model": which, "threads": args.threads, "device": "cpu",
        "verify_share": share["verify_share"], "sampler_vs_generate": speed["sampler_vs_generate"],
        "evaluation": share, "sampling": speed,
    }, indent=2))


if __name__ == "__main__":
    main()
