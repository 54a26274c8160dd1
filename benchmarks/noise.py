"""Benchmark: ES directions drawn on the host (before) vs on the weights' device (now), at the
paper's model shapes, plus a cost model of the paper's Easy setting on a GPU.

Paths, side by side in one run on one machine:

- ``host`` (esreason's earlier design): every direction is a float32 CPU ``torch.randn`` of the
  whole tensor, copied to the weights' device; the update accumulates all N directions in a
  whole-tensor fp32 CPU accumulator, then copies it over.
- ``device`` (now, :mod:`esreason.es.apply`): directions drawn block by block (2**22 elements)
  by the device's own generator on the weights' device; the update accumulates and applies
  one block at a time. This is ``backend.update: replicated``: every engine sums all N.
- ``sharded`` (``backend.update: sharded``, :mod:`esreason.es.sharded`): one engine's part of
  the update, N / 8 members summed, quantized to int64 and applied; the all-reduce between the
  engines needs a second device and is costed by the cost model only.

Both run with bf16 weights and fp32 masters (the GPU configuration, ``es.master_weights:
auto``). Tensors are made one at a time, one per distinct (shape, role) of Qwen2.5-1.5B / 7B,
and timed once each; model totals multiply by how often each shape occurs. Per-update
seconds are extrapolated linearly in N from updates with 1 and 2 members (the update's cost
is a fixed apply pass plus one draw-and-accumulate pass per member).

Peak extra memory is measured in a child process per (path, model) on the model's largest
tensor: VmHWM after the operations minus VmRSS before them (weights and masters allocated).

The cost model (``cost_model``) turns bytes moved and samples drawn into seconds on a stated
GPU for the paper's Easy setting (N = 32 members over 8 engines, 64 prompts per update,
RESPONSE_TOKENS decode steps per member) and prints ``projected_overhead_share`` = ES noise
seconds / (noise + generation seconds) per engine per update. Every constant is a JSON field
with its source; on a GPU, ``benchmarks/gpu_es_step.py`` measures what this projects.

Usage: OMP_NUM_THREADS=1 python benchmarks/noise.py [--models qwen2.5-1.5b qwen2.5-7b] [--no-memory]
       [--quick]   (a 0.5B-shape smoke run)
Prints ONE JSON object.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from esreason.es.apply import copy_tensor, perturb_tensor, update_tensor
from esreason.es.noise import numel_of, tensor_seed
from esreason.es.sharded import Sharding

# Qwen2.5 configurations (config.json of each hub model).
MODELS = {
    "qwen2.5-0.5b": dict(hidden=896, inter=4864, layers=24, heads=14, kv_heads=2, vocab=151936, tied=True),
    "qwen2.5-1.5b": dict(hidden=1536, inter=8960, layers=28, heads=12, kv_heads=2, vocab=151936, tied=True),
    "qwen2.5-7b": dict(hidden=3584, inter=18944, layers=28, heads=28, kv_heads=4, vocab=152064, tied=False),
}
SIGMA, ALPHA = 1.5e-3, 2.5e-4  # the Easy config's values


@dataclass(frozen=True)
class Tensor:
    name: str
    shape: tuple[int, ...]
    count: int

    @property
    def numel(self) -> int:
        return numel_of(self.shape)


def model_tensors(cfg: dict) -> list[Tensor]:
    """One entry per distinct parameter role of a Qwen2 decoder, with its multiplicity."""
    h, i, n_layers = cfg["hidden"], cfg["inter"], cfg["layers"]
    kv = cfg["kv_heads"] * (h // cfg["heads"])
    per_layer = [("q_proj.weight", (h, h)), ("q_proj.bias", (h,)), ("k_proj.weight", (kv, h)), ("k_proj.bias", (kv,)),
                 ("v_proj.weight", (kv, h)), ("v_proj.bias", (kv,)), ("o_proj.weight", (h, h)),
                 ("gate_proj.weight", (i, h)), ("up_proj.weight", (i, h)), ("down_proj.weight", (h, i)),
                 ("input_layernorm.weight", (h,)), ("post_attention_layernorm.weight", (h,))]
    out = [Tensor("model.embed_tokens.weight", (cfg["vocab"], h), 1), Tensor("model.norm.weight", (h,), 1)]
    out += [Tensor(f"model.layers.0.{n}", s, n_layers) for n, s in per_layer]
    if not cfg["tied"]:
        out.append(Tensor("lm_head.weight", (cfg["vocab"], h), 1))
    return out


# ------------------------------------------------------------------ the host path (before)


def host_direction(seed: int, name: str, shape: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """The old esreason.es.noise.direction: whole-tensor fp32 CPU draw, then a copy to the device."""
    gen = torch.Generator(device="cpu").manual_seed(tensor_seed(seed, name))
    eps = torch.randn(shape, generator=gen, dtype=torch.float32)
    return eps if eps.device == device else eps.to(device)


def host_perturb(p, master, name, seed, sigma):
    p.copy_(torch.add(master, host_direction(seed, name, tuple(p.shape), p.device), alpha=sigma))


def host_update(p, master, name, seeds, weights, alpha):
    acc = torch.zeros(tuple(p.shape), dtype=torch.float32)  # whole-tensor host accumulator
    for s, w in zip(seeds, weights):
        acc.add_(host_direction(s, name, tuple(p.shape), torch.device("cpu")), alpha=w)
    delta = acc.mul_(alpha / len(seeds)).to(p.device)
    old = p.to(torch.float32, copy=True)
    master.add_(delta)
    p.copy_(master)
    return float(torch.sum((p.to(torch.float32) - old) ** 2))


def device_perturb(p, master, name, seed, sigma):
    perturb_tensor(p, name, seed, sigma, master=master)


def device_update(p, master, name, seeds, weights, alpha):
    return float(update_tensor(p, name, seeds, weights, alpha, master=master))


def sharded_update(p, master, name, seeds, weights, alpha):
    """One engine's part of the sharded update (its own members, one shard); the all-reduce
    between engines is not run here (no second device) and is costed by the cost model."""
    return float(update_tensor(p, name, seeds, weights, alpha, master=master, sharding=Sharding(1, (0,))))


PATHS = {"host": (host_perturb, host_update), "device": (device_perturb, device_update),
         "sharded": (device_perturb, sharded_update)}


# ------------------------------------------------------------------ timing


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def time_tensor(t: Tensor, path: str, device: torch.device) -> dict[str, float]:
    perturb, update = PATHS[path]
    p = torch.zeros(t.shape, dtype=torch.bfloat16, device=device)
    master = torch.zeros(t.shape, dtype=torch.float32, device=device)
    pr = _timed(lambda: perturb(p, master, t.name, 1, SIGMA)) + _timed(lambda: copy_tensor(p, master))
    u1 = _timed(lambda: update(p, master, t.name, [1], [1.0], ALPHA))
    u2 = _timed(lambda: update(p, master, t.name, [1, 2], [1.0, -0.5], ALPHA))
    return {"perturb_restore_s": pr, "update_member_s": max(0.0, u2 - u1), "update_fixed_s": max(0.0, 2 * u1 - u2)}


def time_model(name: str, path: str, device: torch.device, population: int) -> dict[str, float]:
    tensors = model_tensors(MODELS[name])
    tot = {"perturb_restore_s": 0.0, "update_member_s": 0.0, "update_fixed_s": 0.0}
    for t in tensors:
        row = time_tensor(t, path, device)
        for k in tot:
            tot[k] += row[k] * t.count
    largest = max(tensors, key=lambda t: t.numel)
    draw = (lambda: host_direction(3, largest.name, largest.shape, device)) if path == "host" else \
        (lambda: torch.randn(largest.numel, generator=torch.Generator(device=device).manual_seed(3), device=device))
    draw()  # warm-up (allocator)
    dt = _timed(draw)
    params = sum(t.numel * t.count for t in tensors)
    return {"parameters": params, "samples_per_s": largest.numel / dt,
            "seconds_per_member_perturb_restore": tot["perturb_restore_s"],
            "seconds_per_update": tot["update_fixed_s"] + population * tot["update_member_s"],
            "seconds_per_update_member": tot["update_member_s"], "seconds_per_update_fixed": tot["update_fixed_s"]}


# ------------------------------------------------------------------ peak extra memory (child process)


def _rss_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def child_memory(model: str, path: str) -> None:
    torch.set_num_threads(1)
    largest = max(model_tensors(MODELS[model]), key=lambda t: t.numel)
    p = torch.zeros(largest.shape, dtype=torch.bfloat16)
    master = torch.zeros(largest.shape, dtype=torch.float32)
    p.add_(1.0)
    master.add_(1.0)  # touch every page
    perturb, update = PATHS[path]
    before = _rss_kb("VmRSS")
    # VmHWM cannot be reset from inside; compare it to the RSS right before the operations
    perturb(p, master, largest.name, 1, SIGMA)
    copy_tensor(p, master)
    update(p, master, largest.name, [1, 2], [1.0, -0.5], ALPHA)
    print(json.dumps({"tensor": largest.name, "numel": largest.numel,
                      "peak_extra_mb": (_rss_kb("VmHWM") - before) / 1024}))


def memory(model: str, path: str) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child-memory", model, path], capture_output=True,
                         text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------ cost model


GPU = {
    "name": "NVIDIA H100 SXM5 80GB",
    "hbm_bytes_per_s": 3.35e12,
    "hbm_source": "NVIDIA H100 Tensor Core GPU datasheet: 3.35 TB/s HBM3 (SXM5)",
    "elementwise_efficiency": 0.8,
    "elementwise_source": "assumption: large fp32/bf16 elementwise kernels reach ~80% of HBM bandwidth",
    "device_rng_samples_per_s": 0.8 * 3.35e12 / 4,
    "device_rng_source": ("assumption: torch.randn (Philox4x32-10 + Box-Muller) is bound by writing 4 B per fp32 "
                          "sample; production Philox generators run at ~94% of DRAM bandwidth (cuTile.jl PR #193, "
                          "RTX 5080); we take 80% of HBM / 4 B. To be replaced by the measured value "
                          "(benchmarks/gpu_es_step.py prints it)"),
    "nvlink_bytes_per_s": 4.5e11,
    "nvlink_source": "NVIDIA H100 datasheet: NVLink 900 GB/s total, i.e. 450 GB/s per direction (the sharded update's all-reduce)",
    "pcie_bytes_per_s": 5.0e10,
    "pcie_source": "assumption: PCIe Gen5 x16, 64 GB/s per direction theoretical, ~50 GB/s achieved (host path only)",
    "decode_efficiency": 0.5,
    "decode_source": ("derived: decode is memory-bound at 64 sequences, each step reads the bf16 weights once "
                      "(2 P bytes), so tokens/s = 64 x efficiency x HBM / (2 P); efficiency 0.5 is an assumption "
                      "generous to vLLM (QwenLM/Qwen3#244 reports 1,000-2,300 tokens/s for a 7B model on an A100 "
                      "with 100 x 1,000 tokens, i.e. 0.1-0.2 of that bound); a faster vLLM raises our share"),
}
SETTING = {"population": 32, "engines": 8, "prompts": 64, "response_tokens": 512,
           "response_tokens_source": ("assumption: decode steps per member = the longest response in the 64-prompt "
                                      "batch; GSM8K answers of Qwen2.5-1.5B-Instruct are ~300 tokens on average "
                                      "and the config caps them at 2048")}
# HBM bytes per parameter of each operation (bf16 weights, fp32 masters, fp32 directions):
BYTES = {
    "draw": 4,             # randn writes one fp32 sample
    "perturb": 4 + 4 + 2,  # read eps and master, write bf16 weight
    "restore": 4 + 2,      # read master, write weight
    "accumulate": 4 * 3,   # acc.add_(eps): read acc and eps, write acc (per member)
    "apply": 4 * 12,       # acc scale, fp32 copy of the old weight, master add, weight write, squared change
    # the sharded update (esreason.es.sharded), per engine:
    "zeros": 4,            # the fp32 accumulator's initial zeros
    "quantize": 4 + 8,     # fp32 partial -> int64 (weights pre-scaled by 2**s)
    "dequantize": 8 + 4 + 4 + 4,  # int64 -> fp32, then one multiply
    "allreduce_element": 8,       # int64 per element on the wire (NVLink), ring: 2 (E-1)/E of it
}


def cost_model(params: int, host_samples_per_s: float, gpu: dict = GPU, setting: dict = SETTING) -> dict:
    """Seconds per engine per update on ``gpu`` for the host and device paths; see the module docstring."""
    n, members = setting["population"], setting["population"] // setting["engines"]
    mem = gpu["hbm_bytes_per_s"] * gpu["elementwise_efficiency"]
    tokens_per_s = setting["prompts"] * gpu["decode_efficiency"] * gpu["hbm_bytes_per_s"] / (2 * params)
    generation = members * setting["prompts"] * setting["response_tokens"] / tokens_per_s
    elementwise = params * (members * (BYTES["perturb"] + BYTES["restore"]) + n * BYTES["accumulate"]
                            + BYTES["apply"]) / mem
    draws = members + n  # directions drawn per engine per update: its members, then all N for the update
    device_noise = draws * params / gpu["device_rng_samples_per_s"] + elementwise
    host_noise = (draws * params / host_samples_per_s                           # host RNG
                  + (members + 1) * 4 * params / gpu["pcie_bytes_per_s"]       # directions / delta over PCIe
                  + elementwise)
    # Sharded (backend.update: sharded): each engine draws and accumulates only its own members
    # (again for the update: no direction cache at this size), quantizes once, the engines
    # all-reduce int64 block sums over NVLink (ring: 2 (E-1)/E x 8 P bytes per engine), and every
    # engine dequantizes and applies. The trainer's reference update (all N directions, on its
    # own GPU) runs in a background thread during the next generation: off the critical path.
    e = setting["engines"]
    sharded_draws = 2 * members
    sharded_elementwise = params * (members * (BYTES["perturb"] + BYTES["restore"] + BYTES["accumulate"])
                                    + BYTES["zeros"] + BYTES["quantize"] + BYTES["dequantize"] + BYTES["apply"]) / mem
    allreduce = 2 * (e - 1) / e * BYTES["allreduce_element"] * params / gpu["nvlink_bytes_per_s"]
    sharded = sharded_draws * params / gpu["device_rng_samples_per_s"] + sharded_elementwise + allreduce
    return {"parameters": params, "members_per_engine": members,
            "generation_tokens_per_s": tokens_per_s, "generation_s": generation,
            "device": {"noise_s": device_noise, "projected_overhead_share": device_noise / (device_noise + generation)},
            "host": {"noise_s": host_noise, "host_rng_samples_per_s": host_samples_per_s,
                     "projected_overhead_share": host_noise / (host_noise + generation)},
            "sharded": {"implemented": True, "noise_s": sharded, "allreduce_s": allreduce,
                        "projected_overhead_share": sharded / (sharded + generation)}}


def sensitivity(params: int, host_sps: float) -> list[dict]:
    rows = []
    for eff in (0.25, 0.5, 1.0):
        for tokens in (256, 512, 1024):
            cm = cost_model(params, host_sps, {**GPU, "decode_efficiency": eff}, {**SETTING, "response_tokens": tokens})
            rows.append({"decode_efficiency": eff, "response_tokens": tokens,
                         "projected_overhead_share": round(cm["sharded"]["projected_overhead_share"], 4),
                         "replicated": round(cm["device"]["projected_overhead_share"], 4)})
    return rows


# ------------------------------------------------------------------ main


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["qwen2.5-1.5b", "qwen2.5-7b"], choices=sorted(MODELS))
    ap.add_argument("--population", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--no-memory", action="store_true")
    ap.add_argument("--quick", action="store_true", help="qwen2.5-0.5b shapes only")
    ap.add_argument("--child-memory", nargs=2, metavar=("MODEL", "PATH"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child_memory:
        child_memory(*args.child_memory)
        return
    torch.set_num_threads(args.threads)
    device = torch.device("cpu")
    models = ["qwen2.5-0.5b"] if args.quick else args.models
    result = {"device": str(device), "torch": torch.__version__, "threads": args.threads,
              "population": args.population, "gpu": GPU, "setting": SETTING, "bytes_per_parameter": BYTES, "models": {}}
    for name in models:
        members = max(1, args.population // SETTING["engines"])  # a sharded engine sums only its own members
        row = {path: time_model(name, path, device, members if path == "sharded" else args.population)
               for path in PATHS}
        if not args.no_memory:
            for path in PATHS:
                row[path].update(memory(name, path))
        host, dev = row["host"], row["device"]
        row["ratios"] = {"seconds_per_member_host_over_device": host["seconds_per_member_perturb_restore"]
                         / dev["seconds_per_member_perturb_restore"],
                         "seconds_per_update_host_over_device": host["seconds_per_update"] / dev["seconds_per_update"],
                         "seconds_per_update_device_over_sharded_engine":
                             dev["seconds_per_update"] / row["sharded"]["seconds_per_update"]}
        if not args.no_memory:
            row["ratios"]["peak_extra_memory_host_over_device"] = host["peak_extra_mb"] / max(dev["peak_extra_mb"], 1.0)
        params = dev["parameters"]
        row["cost_model"] = cost_model(params, host["samples_per_s"])
        row["cost_model"]["sensitivity"] = sensitivity(params, host["samples_per_s"])
        row["projected_overhead_share"] = row["cost_model"]["sharded"]["projected_overhead_share"]
        row["projected_overhead_share_replicated"] = row["cost_model"]["device"]["projected_overhead_share"]
        row["target_met"] = row["projected_overhead_share"] <= 0.05
        result["models"][name] = row
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
