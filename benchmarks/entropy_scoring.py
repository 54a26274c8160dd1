"""Benchmark: the evaluation's teacher-forced entropy pass with and without shared prompts.

The vLLM evaluation path scores every sampled response by a transformers forward
(:class:`esreason.backends.scoring.EntropyScorer`). Rows behind one prompt are now scored as a group:
the prompt forwarded once, the responses against its cache. This compares that with scoring every
row as prompt + response (``share_prompts=False``, the previous behaviour), on the embedded default, at an evaluation's shape: ``--problems`` prompts of
``--prompt-tokens`` tokens, ``--samples`` responses each of ``--response-tokens`` tokens (random
ids; entropy does not depend on their meaning). Alternating repeats; median wall seconds.

Prints ONE JSON object: per setting the seconds of every repeat, their median, the scored
positions, ``ratio`` (shared / per row) and the largest relative difference of the entropy sums.

Usage: python benchmarks/entropy_scoring.py [--problems 8] [--samples 32] [--prompt-tokens 300]
       [--response-tokens 60] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--problems", type=int, default=8)
    ap.add_argument("--samples", type=int, default=32)
    ap.add_argument("--prompt-tokens", type=int, default=300)
    ap.add_argument("--response-tokens", type=int, default=60)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    import torch

    from esreason.backends.hf import load_model
    from esreason.backends.scoring import EntropyScorer

    torch.manual_seed(0)
    model, _ = load_model("demo")
    vocab = model.get_input_embeddings().num_embeddings
    prompts = [torch.randint(3, vocab, (args.prompt_tokens,)).tolist() for _ in range(args.problems)]
    responses = [torch.randint(3, vocab, (args.response_tokens,)).tolist()
                 for _ in range(args.problems * args.samples)]
    rows = [p for p in prompts for _ in range(args.samples)]
    times: dict[str, list[float]] = {"shared": [], "per_row": []}
    sums: dict[str, list[float]] = {}
    for _ in range(args.repeats):
        for name in ("shared", "per_row"):
            scorer = EntropyScorer(model, share_prompts=name == "shared")
            t0 = time.perf_counter()
            sums[name] = scorer.entropy_sums(rows, responses, 0.6)
            times[name].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    positions = {"shared": args.problems * args.prompt_tokens + len(responses) * args.response_tokens,
                 "per_row": len(responses) * (args.prompt_tokens + args.response_tokens)}
    print(json.dumps({
        "shape": vars(args), "threads": torch.get_num_threads(),
        "seconds": {k: [round(x, 3) for x in v] for k, v in times.items()},
        "median_s": {k: round(v, 3) for k, v in med.items()},
        "scored_positions": positions,
        "ratio": round(med["shared"] / med["per_row"], 3),
        "max_relative_difference_of_sums": max(abs(a - b) / max(abs(b), 1e-12)
                                               for a, b in zip(sums["shared"], sums["per_row"])),
    }, indent=2))


if __name__ == "__main__":
    main()
