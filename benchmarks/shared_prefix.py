"""Benchmark: one evaluation call with and without the Sampler's shared-prefix prefill, side by side.

Workload: the demo's evaluation call on the embedded default (``configs/experiments/demo.yaml``:
``--problems`` demo-add test problems x ``--samples`` samples = one generate call of that many rows,
temperature 0.6, 64 new tokens, entropy on). ``share_prefix=True`` prefills each distinct prompt
once and copies its logits and KV rows to the other samples; ``False`` prefills every row. The two
settings alternate within each repeat so machine noise hits both alike; the median over
``--repeats`` is reported, wall time and process CPU time (CPU time is the steadier figure on a
shared machine). Outputs are compared too: ``identical`` is true when token ids and entropy sums
are bit-identical (expected at these shapes; see ``esreason.backends.sampling``).

Prints ONE JSON object: ``wall_s`` / ``cpu_s`` per setting, ``ratio_wall`` and ``ratio_cpu``
(shared / full; < 1 is faster), ``identical``, ``rows``, ``prompt_tokens``.

Usage: python benchmarks/shared_prefix.py [--problems 16] [--samples 32] [--repeats 3] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--problems", type=int, default=16)
    ap.add_argument("--samples", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from esreason import tasks
    from esreason.backends.base import SamplingParams
    from esreason.backends.hf import load_model
    from esreason.backends.sampling import Sampler

    model, tok = load_model("demo")
    problems = tasks.get("demo-add").load("test", limit=args.problems)
    prompts = [tasks.render_prompt(tok, p.messages) for p in problems]
    rows = [p for p in prompts for _ in range(args.samples)]  # problem-major, as the harness lays them out
    params = SamplingParams(max_new_tokens=64, temperature=0.6, top_p=1.0, seed=1, compute_entropy=True)
    wall: dict[str, list[float]] = {"shared": [], "full": []}
    cpu: dict[str, list[float]] = {"shared": [], "full": []}
    outputs = {}
    for _ in range(args.repeats):
        for name, share in (("full", False), ("shared", True)):
            sampler = Sampler(model, tok, batch_size=len(rows), share_prefix=share)
            c0, t0 = time.process_time(), time.perf_counter()
            outputs[name] = sampler.generate(rows, params)
            wall[name].append(time.perf_counter() - t0)
            cpu[name].append(time.process_time() - c0)
    med = {k: {"wall_s": statistics.median(wall[k]), "cpu_s": statistics.median(cpu[k])} for k in wall}
    a, b = outputs["shared"], outputs["full"]
    print(json.dumps({
        "rows": len(rows), "problems": args.problems, "samples": args.samples, "threads": args.threads,
        "prompt_tokens": sum(len(r) for r in tok(prompts, add_special_tokens=False)["input_ids"]) / len(prompts),
        "wall_s": {k: round(v["wall_s"], 3) for k, v in med.items()},
        "cpu_s": {k: round(v["cpu_s"], 3) for k, v in med.items()},
        "ratio_wall": round(med["shared"]["wall_s"] / med["full"]["wall_s"], 3),
        "ratio_cpu": round(med["shared"]["cpu_s"] / med["full"]["cpu_s"], 3),
        "identical": a.token_ids == b.token_ids and a.entropy_sum == b.entropy_sum,
    }))


if __name__ == "__main__":
    main()
