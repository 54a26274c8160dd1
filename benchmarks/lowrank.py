"""Benchmark: perturb / restore / update time of low-rank (EGGROLL) vs full directions.

For each parameter set — the embedded default's weights and a larger synthetic set
(one transformer block's matrices at width ``--width``, plus norm vectors) — runs one
ES update's weight work with :class:`esreason.es.params.CentredParameters`: N
perturb/restore cycles (exact restore) followed by ``apply_update``, for
``perturbation: full`` and ``lowrank`` at each ``--ranks`` value, interleaved over
``--repeats`` rounds (median reported) so machine load hits every mode alike.
The direction cache is on at its default budget (256 MiB), as in a real run; only
the weight operations are timed (no generation).

Prints ONE JSON line:
  {"<set>": {"params": P, "modes": {"full": {"perturb_s", "restore_s", "update_s", "total_s"},
             "lowrank_r4": {..., "speedup_vs_full": full total / this total}, ...}}, ...}
perturb_s and restore_s are summed over the N members; update_s is one apply_update.

Usage: OMP_NUM_THREADS=1 python benchmarks/lowrank.py [--population 16] [--ranks 1 4 16]
       [--width 1024] [--repeats 3] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from esreason.es.params import CentredParameters, unique_named_parameters


def synthetic_block(width: int) -> torch.nn.Module:
    """Matrices of one Llama-style block (q, k, v, o [w, w]; gate, up [2.75w, w]; down [w, 2.75w]) + 2 norms."""
    hidden = int(width * 2.75)
    mod = torch.nn.Module()
    for name, shape in (("q", (width, width)), ("k", (width, width)), ("v", (width, width)),
                        ("o", (width, width)), ("gate", (hidden, width)), ("up", (hidden, width)),
                        ("down", (width, hidden)), ("norm1", (width,)), ("norm2", (width,))):
        mod.register_parameter(name, torch.nn.Parameter(torch.randn(shape) * 0.02))
    return mod


def time_update(module: torch.nn.Module, perturbation: str, rank: int, population: int, step: int) -> dict[str, float]:
    """Seconds of N perturb + N restore + one update on ``module`` (centre restored afterwards)."""
    centre = {k: v.detach().clone() for k, v in module.state_dict().items()}
    cp = CentredParameters(unique_named_parameters(module), perturbation=perturbation, rank=rank,
                           cache_bytes=256 * 2**20)
    seeds = [1000 * step + i for i in range(population)]
    weights = [((i * 7919) % 13 - 6) / 6.0 for i in range(population)]  # fixed, non-zero mix of signs
    for s in seeds:
        cp.perturb(s, 1e-3)
        cp.restore()
    cp.apply_update(seeds, weights, 1e-4)
    t = cp.pop_timings()
    module.load_state_dict(centre)
    return {"perturb_s": t["perturb"], "restore_s": t["restore"], "update_s": t["update"],
            "total_s": t["perturb"] + t["restore"] + t["update"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--population", type=int, default=16)
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from esreason.backends.hf import load_model

    torch.manual_seed(0)
    sets = {"embedded_default": load_model("demo")[0], f"synthetic_block_w{args.width}": synthetic_block(args.width)}
    modes = [("full", "full", 1)] + [(f"lowrank_r{r}", "lowrank", r) for r in args.ranks]
    out: dict[str, dict] = {}
    for set_name, module in sets.items():
        samples: dict[str, list[dict[str, float]]] = {label: [] for label, _, _ in modes}
        for rep in range(args.repeats):
            for label, kind, rank in modes:  # interleaved: load drifts hit every mode
                samples[label].append(time_update(module, kind, rank, args.population, rep))
        res = {label: {k: statistics.median(s[k] for s in runs) for k in runs[0]} for label, runs in samples.items()}
        for label in res:
            res[label]["speedup_vs_full"] = res["full"]["total_s"] / res[label]["total_s"]
            res[label] = {k: round(v, 5) for k, v in res[label].items()}
        out[set_name] = {"params": sum(p.numel() for _, p in unique_named_parameters(module)), "modes": res}
    out["config"] = {"population": args.population, "repeats": args.repeats, "threads": args.threads,
                     "torch": torch.__version__, "time_unix": int(time.time())}
    print(json.dumps(out, sort_keys=True))


if __name__ == "__main__":
    main()
