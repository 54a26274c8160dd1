"""Benchmark: esreason's KV-cache Sampler vs Hugging Face ``generate``, side by side.

Model: the shipped embedded default (src/esreason/assets/demo) when present, else a
freshly initialised model of the same architecture (``build_model(build_tokenizer())``,
~0.87M parameters). Both engines decode greedily the same rendered prompts with the same
batch sizes and exactly ``--max-new-tokens`` tokens per row: the Sampler with
``ignore_eos=True``, ``generate`` with ``min_new_tokens = max_new_tokens`` (EOS
suppressed), so both produce the same number of tokens. At batch size b, ``--calls``
calls of b prompts are timed (at b = 1 several calls, since one is very short); the
median over ``--repeats`` is reported. The two engines alternate within each repeat so
machine noise hits both alike: ratios are what to read, not absolute numbers.

A second section measures the Sampler's own options on a workload where rows stop at
different steps (512 prompts of mixed lengths in chunks of 128, temperature 1 sampling,
newline or EOS ends a row): length sorting and batch compaction on/off, tokens/s each.

Prints ONE JSON object. Key fields:
  tokens_per_s.sampler[b], tokens_per_s.generate[b]   per batch size b
  ratio[b]                                            sampler / generate at b
  sampler_vs_generate                                 ratio at the largest batch size (256)
  options                                             tokens/s per Sampler option setting

Usage: python benchmarks/sampler.py [--batch-sizes 1,32,256] [--max-new-tokens 64]
       [--repeats 3] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

import torch


def _prompts(tok, n: int, seed: int = 0) -> list[str]:
    """Rendered arithmetic prompts of varying length (chat template applied)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        a, b = rng.randrange(10 ** rng.randint(1, 6)), rng.randrange(10 ** rng.randint(1, 6))
        q = f"What is {a} + {b}?" + " Show your work." * rng.randint(0, 3)
        out.append(tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                           add_generation_prompt=True))
    return out


def _load_model():
    from esreason.embedded import build_model, build_tokenizer, demo_model_dir

    if (demo_model_dir() / "config.json").is_file():
        from esreason.backends.hf import load_model

        model, tok = load_model("demo")
        return model, tok, "embedded default"
    tok = build_tokenizer()
    return build_model(tok), tok, "fresh random model, embedded default architecture"


def _time_sampler(sampler, prompts: list[str], bs: int, calls: int, max_new: int) -> tuple[float, int]:
    from esreason.backends.base import SamplingParams

    params = SamplingParams(max_new_tokens=max_new, temperature=0.0)
    t0 = time.perf_counter()
    n = 0
    for c in range(calls):
        n += sampler.generate(prompts[c * bs:(c + 1) * bs], params, ignore_eos=True).num_tokens
    return time.perf_counter() - t0, n


def _time_generate(model, tok, prompts: list[str], bs: int, calls: int, max_new: int) -> tuple[float, int]:
    t0 = time.perf_counter()
    n = 0
    with torch.inference_mode():
        for c in range(calls):
            enc = tok(prompts[c * bs:(c + 1) * bs], add_special_tokens=False, padding=True, return_tensors="pt")
            out = model.generate(**enc, do_sample=False, max_new_tokens=max_new, min_new_tokens=max_new,
                                 pad_token_id=tok.pad_token_id)
            n += (out.shape[1] - enc["input_ids"].shape[1]) * out.shape[0]
    return time.perf_counter() - t0, n


def _options(model, tok, prompts: list[str], bs: int, max_new: int, repeats: int) -> dict:
    """tokens/s of the Sampler option settings on an early-stopping sampling workload."""
    from esreason.backends.base import SamplingParams
    from esreason.backends.sampling import Sampler

    # A random model rarely samples EOS, so for this workload the newline character also ends
    # a row (added to generation_config.eos_token_id for the duration): rows stop at varied steps.
    nl = tok.convert_tokens_to_ids("\n")
    eos_before = model.generation_config.eos_token_id
    model.generation_config.eos_token_id = [nl] + ([eos_before] if isinstance(eos_before, int) else
                                                   list(eos_before or []))
    params = SamplingParams(max_new_tokens=max_new, temperature=1.0, seed=3)
    settings = {"sort+compact": dict(sort_by_length=True, compact=True),
                "sort only": dict(sort_by_length=True, compact=False),
                "compact only": dict(sort_by_length=False, compact=True),
                "neither": dict(sort_by_length=False, compact=False)}
    res: dict[str, list[float]] = {k: [] for k in settings}
    mean_len = 0.0
    try:
        for _ in range(repeats):
            for name, kw in settings.items():
                s = Sampler(model, tok, batch_size=bs, **kw)
                g = s.generate(prompts, params)
                res[name].append(g.num_tokens / s.last_stats.seconds)
                mean_len = g.num_tokens / len(prompts)
    finally:
        model.generation_config.eos_token_id = eos_before
    out = {k: statistics.median(v) for k, v in res.items()}
    out["workload"] = (f"{len(prompts)} prompts, batch {bs}, temperature 1, stop at newline or EOS, "
                       f"max_new_tokens {max_new}, mean response {mean_len:.1f} tokens")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch-sizes", default="1,32,256")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (0 = torch default)")
    ap.add_argument("--skip-options", action="store_true")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    from esreason.backends.sampling import Sampler

    model, tok, model_name = _load_model()
    sizes = [int(s) for s in args.batch_sizes.split(",")]
    calls = {b: max(1, 8 // b) for b in sizes}  # bs 1: 8 calls; larger: one call
    prompts = _prompts(tok, max(b * calls[b] for b in sizes))
    sampler_tps: dict[int, list[float]] = {b: [] for b in sizes}
    generate_tps: dict[int, list[float]] = {b: [] for b in sizes}
    _time_sampler(Sampler(model, tok, batch_size=8), prompts, 8, 1, 4)  # warm-up
    _time_generate(model, tok, prompts, 8, 1, 4)
    for _ in range(args.repeats):
        for b in sizes:
            s = Sampler(model, tok, batch_size=b)
            dt, n = _time_sampler(s, prompts, b, calls[b], args.max_new_tokens)
            sampler_tps[b].append(n / dt)
            dt, n = _time_generate(model, tok, prompts, b, calls[b], args.max_new_tokens)
            generate_tps[b].append(n / dt)
    med_s = {b: statistics.median(v) for b, v in sampler_tps.items()}
    med_g = {b: statistics.median(v) for b, v in generate_tps.items()}
    ratio = {b: med_s[b] / med_g[b] for b in sizes}
    out = {
        "benchmark": "sampler",
        "model": model_name,
        "params": sum(p.numel() for p in model.parameters()),
        "max_new_tokens": args.max_new_tokens,
        "repeats": args.repeats,
        "torch_threads": torch.get_num_threads(),
        "calls_per_batch_size": {str(b): calls[b] for b in sizes},
        "tokens_per_s": {"sampler": {str(b): round(v, 1) for b, v in med_s.items()},
                         "generate": {str(b): round(v, 1) for b, v in med_g.items()}},
        "ratio": {str(b): round(v, 3) for b, v in ratio.items()},
        "sampler_vs_generate": round(ratio[max(sizes)], 3),
    }
    if not args.skip_options:
        # Several chunks, so that sorting by length has padding to save.
        out["options"] = _options(model, tok, _prompts(tok, 512, seed=1), 128, args.max_new_tokens, args.repeats)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
