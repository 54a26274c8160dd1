"""One-GPU check: an ES step through the vLLM backend vs plain vLLM inference of the same prompts.

For each model (Qwen2.5-0.5B / 1.5B shapes; the hub model when ``--model`` names one that
is reachable, else random weights from the architecture's config with the embedded
character tokenizer), one :class:`esreason.backends.vllm.VLLMEngine` runs, side by side:

- ``inference``: N generate calls of the same B prompts at the centre (what the population
  evaluation costs without ES);
- ``es_step``: N members (perturb on the GPU, generate, restore), then the update from N
  seeds and z-scored weights -- what ``backend.type: vllm`` does per update.

Also timed: one engine's part of the sharded update (``backend.update: sharded``) in a pool of
``--engines`` engines -- its N / E members summed, quantized and applied; the all-reduce needs
several GPUs and is priced by the cost model -- and the per-engine noise share it implies.

Every member generates exactly ``--tokens`` tokens (``ignore_eos``), so both sides decode the
same number of tokens and the difference is the ES work. Also measured: the torch.randn
throughput of this GPU (samples/s, the cost model's ``device_rng_samples_per_s`` in
benchmarks/noise.py) and the worker's peak allocator memory beyond vLLM's own reservation
during the ES step.

Prints ONE JSON object; ``overhead_share`` = (es_step - inference) / es_step.

Usage (a CUDA machine with ``pip install -e '.[vllm]'``):
  python benchmarks/gpu_es_step.py [--models qwen2.5-0.5b qwen2.5-1.5b] [--population 32] [--prompts 64]
                                   [--tokens 512] [--hub]     # --hub: load Qwen/Qwen2.5-*-Instruct weights
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from noise import MODELS  # noqa: E402  (the shapes live in one place: benchmarks/noise.py)

HUB_IDS = {"qwen2.5-0.5b": "Qwen/Qwen2.5-0.5B-Instruct", "qwen2.5-1.5b": "Qwen/Qwen2.5-1.5B-Instruct"}


def hf_config(shapes: dict) -> dict:
    """Qwen2Config fields for one of benchmarks/noise.py's MODELS (the hub configs' shape fields)."""
    return dict(hidden_size=shapes["hidden"], intermediate_size=shapes["inter"], num_hidden_layers=shapes["layers"],
                num_attention_heads=shapes["heads"], num_key_value_heads=shapes["kv_heads"],
                vocab_size=shapes["vocab"], tie_word_embeddings=shapes["tied"])


ARCH = {name: hf_config(MODELS[name]) for name in HUB_IDS}


def random_model_dir(name: str, out: Path) -> Path:
    """A Qwen2 checkpoint with the hub model's shapes and random bf16 weights, plus our char tokenizer."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from esreason.embedded import build_tokenizer

    tok = build_tokenizer()
    cfg = Qwen2Config(**ARCH[name], max_position_embeddings=4096, rope_theta=1e6, torch_dtype="bfloat16",
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def rng_samples_per_s(device: str = "cuda", n: int = 1 << 28, repeats: int = 5) -> float:
    import torch

    gen = torch.Generator(device=device).manual_seed(0)
    x = torch.empty(n, dtype=torch.float32, device=device)
    x.normal_(generator=gen)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(repeats):
        x.normal_(generator=gen)
    torch.cuda.synchronize()
    return n * repeats / (time.perf_counter() - t0)


def measure(name: str, args: argparse.Namespace) -> dict:
    from esreason.backends.collective import GroupSpec
    from esreason.backends.engine import policy_state
    from esreason.backends.hf import HFPolicy, load_model
    from esreason.backends.vllm import VLLMEngine, VLLMEngineOptions
    from esreason.es.population import draw_population
    from esreason.es.shaping import shape

    with tempfile.TemporaryDirectory(prefix="esreason-gpu-step-") as tmp:
        source = HUB_IDS[name] if args.hub else str(random_model_dir(name, Path(tmp) / name))
        model, tok = load_model(source, dtype="bfloat16", device="cpu")
        state = policy_state(HFPolicy(model, tok, direction_cache_mb=0))
        del model
        options = VLLMEngineOptions(dtype="bfloat16", gpu_memory_utilization=args.gpu_memory_utilization,
                                    max_model_len=args.tokens + 256,
                                    llm_kwargs={"max_num_seqs": args.prompts})
        engine = VLLMEngine(options, state)
        try:
            prompts = [f"<s>Q:What is {i} plus {i + 7}?\nA:" for i in range(args.prompts)]
            vllm = engine._vllm
            sampling = vllm.SamplingParams(temperature=0.0, max_tokens=args.tokens, min_tokens=args.tokens,
                                           ignore_eos=True, detokenize=False)
            ids = [{"prompt_token_ids": engine.tokenizer(p, add_special_tokens=False)["input_ids"]} for p in prompts]

            def generate() -> int:
                outs = engine.llm.generate(ids, sampling, use_tqdm=False)
                return sum(len(o.outputs[0].token_ids) for o in outs)

            generate()  # warm-up: CUDA graphs, allocator
            t0 = time.perf_counter()
            tokens_inf = sum(generate() for _ in range(args.population))
            inference_s = time.perf_counter() - t0

            pop = draw_population(0, 0, args.population, "one_point")
            engine._rpc("es_reset_peak_memory")
            before = engine._rpc("es_device_memory")
            phases = {"perturb": 0.0, "generate": 0.0, "restore": 0.0, "update": 0.0}
            t_step = time.perf_counter()
            for seed in pop.seeds:
                t0 = time.perf_counter()
                engine._rpc("es_perturb", int(seed), 1.5e-3)
                t1 = time.perf_counter()
                generate()
                t2 = time.perf_counter()
                engine._rpc("es_restore")
                t3 = time.perf_counter()
                phases["perturb"] += t1 - t0
                phases["generate"] += t2 - t1
                phases["restore"] += t3 - t2
            weights = shape(np.random.default_rng(0).standard_normal(args.population), "zscore")
            t0 = time.perf_counter()
            engine.apply_update(pop.seeds, [float(w) for w in weights], 2.5e-4)
            phases["update"] = time.perf_counter() - t0
            es_step_s = time.perf_counter() - t_step
            after = engine._rpc("es_device_memory")
            # One engine's part of backend.update=sharded in a pool of --engines: its shard of the
            # members, quantized and applied (a group of one: the all-reduce is the cost model's).
            engine.join_group(GroupSpec("127.0.0.1", 0, "gpu-es-step", 0, 1))
            t0 = time.perf_counter()
            engine.apply_update_sharded(pop.seeds, [float(w) for w in weights], 2.5e-4, args.engines, [0])
            sharded_update_s = time.perf_counter() - t0
        finally:
            engine.close()
    share = args.population // args.engines / args.population  # this engine's fraction of the members
    member_noise = (phases["perturb"] + phases["restore"]) * share
    engine_noise = member_noise + sharded_update_s
    return {"source": source if args.hub else f"random weights, {name} shapes", "population": args.population,
            "prompts": args.prompts, "tokens_per_member": args.tokens, "centre": engine.setup.get("centre"),
            "inference_s": inference_s, "inference_tokens": tokens_inf, "es_step_s": es_step_s,
            "es_phases_s": phases, "overhead_share": (es_step_s - inference_s) / es_step_s,
            "noise_share": (phases["perturb"] + phases["restore"] + phases["update"]) / es_step_s,
            "sharded": {"engines": args.engines, "engine_update_s": sharded_update_s,
                        "engine_noise_share_without_allreduce":
                            engine_noise / (engine_noise + phases["generate"] * share)},
            "es_peak_extra_bytes": after["max_allocated"] - before["allocated"], "worker_memory": after}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["qwen2.5-0.5b", "qwen2.5-1.5b"], choices=sorted(ARCH))
    ap.add_argument("--population", type=int, default=32)
    ap.add_argument("--engines", type=int, default=8, help="pool size for the sharded update's per-engine part")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.6)
    ap.add_argument("--hub", action="store_true", help="load the Qwen2.5 Instruct weights from the hub")
    args = ap.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("gpu_es_step.py needs a CUDA GPU and vLLM (pip install -e '.[vllm]'); on CPU use "
              "benchmarks/noise.py (cost model) and benchmarks/es_step.py", file=sys.stderr)
        return 2
    out = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
           "device_rng_samples_per_s": rng_samples_per_s(), "models": {}}
    for name in args.models:
        out["models"][name] = measure(name, args)
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
