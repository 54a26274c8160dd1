"""Engine checksum: one thread over one byte copy (the earlier design) vs per-tensor digests on threads.

Prints one JSON object: seconds of each way over the same tensors (default: a 0.5B-parameter
model's worth of bf16 weights plus fp32 masters, about 3 GB, in the shapes of a Qwen2 layer
stack), measured side by side, best of ``--repeat``, and their ratio. The "before" way is
restated here as it was (``hashlib.blake2b`` over ``tensor.numpy().tobytes()`` of every tensor,
one thread). Digests differ by construction (the new one hashes per-tensor digests); each way is
checked against itself.

Usage: python benchmarks/checksum.py [--gb 3] [--repeat 3] [--threads 8]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import time

import torch

from esreason.backends.engine import tensors_checksum


def before(named: list[tuple[str, torch.Tensor]]) -> str:
    h = hashlib.blake2b(digest_size=16)
    for name, t in sorted(named, key=lambda item: item[0]):
        data = t.detach().to("cpu").contiguous()
        h.update(f"{name}|{data.dtype}|{tuple(data.shape)}".encode())
        h.update(data.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def tensors(gb: float) -> list[tuple[str, torch.Tensor]]:
    """bf16 weights and fp32 masters of Qwen2-like layers (hidden 1536, MLP 8960) until ``gb`` GB."""
    shapes = [(1536, 1536), (256, 1536), (256, 1536), (1536, 1536), (8960, 1536), (8960, 1536), (1536, 8960)]
    out, total, layer = [], 0, 0
    while total < gb * 1e9:
        for j, shape in enumerate(shapes):
            w = torch.empty(shape, dtype=torch.bfloat16).normal_()
            out += [(f"l{layer}.{j}", w), (f"master:l{layer}.{j}", w.float())]
            total += w.numel() * 6
        layer += 1
    return out


def best(fn, repeat: int) -> tuple[float, str]:
    times, digest = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        d = fn()
        times.append(time.perf_counter() - t0)
        assert digest is None or d == digest, "a checksum changed between repeats"
        digest = d
    return min(times), digest


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gb", type=float, default=3.0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=8)
    args = ap.parse_args()
    named = tensors(args.gb)
    nbytes = sum(t.numel() * t.element_size() for _, t in named)
    t_before, _ = best(lambda: before(named), args.repeat)
    t_after, _ = best(lambda: tensors_checksum(named, threads=args.threads), args.repeat)
    print(json.dumps({"bytes": nbytes, "tensors": len(named), "cpus": os.cpu_count(), "threads": args.threads,
                      "before_s": round(t_before, 3), "after_s": round(t_after, 3),
                      "before_gb_per_s": round(nbytes / t_before / 1e9, 2),
                      "after_gb_per_s": round(nbytes / t_after / 1e9, 2),
                      "speedup": round(t_before / t_after, 2)}, indent=2))


if __name__ == "__main__":
    main()
