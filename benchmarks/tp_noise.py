"""What tensor parallelism costs ES per rank: drawing the noise blocks a rank's shards touch.

A rank of a TP engine perturbs its shards with the unsharded directions (es/region.py): it draws
every 2**22-element block its shards touch, whole, and takes its elements. Column-parallel weights
(q/k/v, gate/up) touch about 1/TP of their blocks, row-parallel ones (o_proj, down_proj) all of
them. This measures, side by side in one run, one perturb (draw + add, fp32 masters into bf16
weights, the engines' arithmetic) of one decoder layer at a model's real shapes: the whole layer
(TP = 1) and rank 0's shards at each TP, and prints one JSON object with the seconds, the ratios
to TP = 1 and to the ideal 1/TP, and the exact element counts (held, drawn) of the whole model
from :func:`esreason.experiments.plan_tp.layout`. A CPU generator here (on a GPU the draw is
HBM-bound, so the drawn/held ratio is the expected slowdown against an ideal 1/TP split).

Usage: python benchmarks/tp_noise.py [--model Qwen/Qwen2.5-14B-Instruct] [--tp 2,4] [--repeat 2]
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

from esreason.es.apply import perturb_tensor
from esreason.experiments.plan_tp import _specs, _tensors, layout
from esreason.backends.vllm_layout import plan_slots, vllm_name


def layer_slots(arch: dict, tp: int, rank: int) -> list:
    """Rank ``rank``'s slots of decoder layer 0 (whole tensors at TP = 1)."""
    shapes = {n: s for n, s in _tensors(arch) if n.startswith("model.layers.0.")}
    specs = _specs(arch, tp, rank) if tp > 1 else {}
    return plan_slots(shapes, {vllm_name(n)[0]: (0,) for n in shapes}, specs)


def perturb_seconds(slots: list, repeat: int) -> float:
    """Best of ``repeat``: perturb every slot once (fp32 master -> bf16 weight), seconds."""
    bufs = []
    for s in slots:
        n = s.region.local_numel if s.region is not None else int(torch.tensor(s.shape).prod())
        bufs.append((s, torch.empty(n, dtype=torch.bfloat16), torch.randn(n) * 0.02))
    best = float("inf")
    for r in range(repeat):
        t0 = time.perf_counter()
        for s, weight, master in bufs:
            perturb_tensor(weight, s.hf_name, 1000 + r, 1e-3, master=master, region=s.region)
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    from esreason.io.architectures import architecture

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="Qwen/Qwen2.5-14B-Instruct")
    ap.add_argument("--tp", default="2,4")
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    arch = architecture(args.model)
    tps = [int(t) for t in args.tp.split(",")]
    base = perturb_seconds(layer_slots(arch, 1, 0), args.repeat)
    out = {"model": args.model, "torch_threads": torch.get_num_threads(), "cpu_count": os.cpu_count(),
           "layer_perturb_s": {"tp1": round(base, 4)}, "rank_over_unsharded": {}, "rank_over_ideal": {},
           "model_elements_per_rank": {}}
    for tp in tps:
        secs = perturb_seconds(layer_slots(arch, tp, 0), args.repeat)
        lay = layout(args.model, tp)
        out["layer_perturb_s"][f"tp{tp}"] = round(secs, 4)
        out["rank_over_unsharded"][f"tp{tp}"] = round(secs / base, 3)
        out["rank_over_ideal"][f"tp{tp}"] = round(secs / (base / tp), 3)
        out["model_elements_per_rank"][f"tp{tp}"] = {"held_over_params": round(lay["held"] / lay["params"], 4),
                                                     "drawn_over_params": round(lay["drawn"] / lay["params"], 4),
                                                     "drawn_over_held": round(lay["drawn"] / lay["held"], 3)}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
