"""Benchmark: one demo-shaped evaluation call under the Sampler's attention and prefill settings.

The call: the first 64 test problems of ``--task`` (default demo-sub) x 32 samples = 2,048 rows,
temperature 0.6, 64 new tokens, entropy on — the demo's evaluation call (``eval.batch_size: 2048``
in configs/experiments/demo.yaml) on the shipped embedded default. Settings, alternating within
each repeat so the machine's noise hits all alike:

- ``sdpa``: transformers' sdpa attention, every row prefilled (the reference the others are compared with);
- ``cpu_attention``: :mod:`esreason.backends.cpu_attention` (eager decode steps, sdpa prefill);
- ``cpu_attention+share_prefix``: and each distinct prompt prefilled once (the harness's default now).

Prints ONE JSON object: per setting the wall and CPU seconds of every repeat and their medians,
``ratio_vs_sdpa`` (median wall / sdpa's), and whether every setting's token ids equal sdpa's.

Usage: python benchmarks/eval_call.py [--repeats 4] [--task demo-sub]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--task", default="demo-sub")
    args = ap.parse_args()

    from esreason.backends import cpu_attention
    from esreason.backends.base import SamplingParams
    from esreason.backends.hf import load_model
    from esreason.backends.sampling import Sampler
    from esreason.tasks import get, render_prompt

    model, tok = load_model("demo")
    prompts = [render_prompt(tok, p.messages) for p in get(args.task).load("test", None, 64) for _ in range(32)]
    params = SamplingParams(max_new_tokens=64, temperature=0.6, seed=1, compute_entropy=True)
    settings = {"sdpa": ("sdpa", False), "cpu_attention": (cpu_attention.register(), False),
                "cpu_attention+share_prefix": (cpu_attention.NAME, True)}
    times: dict[str, list[tuple[float, float]]] = {k: [] for k in settings}
    ids: dict[str, list[list[int]]] = {}
    for _ in range(args.repeats):
        for name, (impl, share) in settings.items():
            model.set_attn_implementation(impl)
            sampler = Sampler(model, tok, batch_size=len(prompts), share_prefix=share)
            cpu, wall = time.process_time(), time.perf_counter()
            ids[name] = sampler.generate(prompts, params).token_ids
            times[name].append((time.perf_counter() - wall, time.process_time() - cpu))
    med = {k: statistics.median(w for w, _ in v) for k, v in times.items()}
    print(json.dumps({
        "task": args.task, "rows": len(prompts), "repeats": args.repeats,
        "wall_s": {k: [round(w, 2) for w, _ in v] for k, v in times.items()},
        "cpu_s": {k: [round(c, 2) for _, c in v] for k, v in times.items()},
        "median_wall_s": {k: round(v, 2) for k, v in med.items()},
        "ratio_vs_sdpa": {k: round(v / med["sdpa"], 3) for k, v in med.items()},
        "same_token_ids_as_sdpa": {k: ids[k] == ids["sdpa"] for k in ids},
    }, indent=1))


if __name__ == "__main__":
    main()
