"""In-process sections of the GPU acceptance (benchmarks/gpu_acceptance.py): the model directories
the CLI sections train and evaluate, the HF sampler against transformers' ``generate``, and the
plan's GRPO terms for the shapes the acceptance's GRPO run uses.

- :func:`build_shape_model`: a random-weight ``Qwen2ForCausalLM`` with Qwen2.5-1.5B's shapes
  (benchmarks/gpu_memory.py ``SHAPES``; vocabulary padded to 151,936 as benchmarks/gpu_check.py
  does, so weights and logits have their real size), bf16, saved with the embedded character
  tokenizer as a local HF directory -- the "model" every CLI section is given.
- :func:`build_embedded_model`: the embedded default's pretrained weights (0.87M parameters) saved
  the same way, in bf16 so that ES keeps fp32 masters as it does at 1.5B. A random-weight model
  scores 0 on every demo-add problem, so its ES z-scores are all 0 and every update is skipped
  (``esreason.es.shaping.zscore``); the embedded weights score, so their updates move the weights
  and the resume check compares checkpoints that really changed.
- :func:`sampler_vs_generate`: greedy decoding of B prompts x L tokens (eos ignored) by
  ``esreason.backends.sampling.Sampler`` (cache ``auto``, the default) and by transformers'
  ``model.generate`` (dynamic cache) on the same model and prompts, as
  shared/gpu-results/2026-11-28-h100/gen_cmp.py did on the H100: seconds, tokens/s and the share
  of rows whose token ids are identical.
- :func:`grpo_plan_terms`: ``esreason.experiments.plan.build_plan`` (the public planner) of a
  one-method experiment whose GRPO config is the acceptance run's own, on one H100:
  the ``train (grpo)`` stage's ``terms_s`` next to the measured phases.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

import torch

QWEN_VOCAB = 151_936
#: the tiny Qwen2 of the CPU twin's sampler comparison (benchmarks/gpu_check.py TINY)
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2)


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(device: str, fn: Callable[[], Any]) -> tuple[float, Any]:
    """(seconds, result) of ``fn`` with the device synchronised on both sides."""
    sync(device)
    t0 = time.perf_counter()
    out = fn()
    sync(device)
    return time.perf_counter() - t0, out


def shape_model(tiny: bool, device: str, seed: int = 0) -> tuple[Any, Any]:
    """Random-init bf16 Qwen2 with Qwen2.5-1.5B's shapes (or TINY), built on ``device``."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from esreason.embedded import build_tokenizer
    from gpu_memory import SHAPES  # benchmarks/ is on sys.path (the driver's directory)

    tok = build_tokenizer()
    shapes = TINY if tiny else {k: v for k, v in SHAPES["qwen2.5-1.5b-shape"].items() if k != "max_window_layers"}
    config = Qwen2Config(vocab_size=len(tok) if tiny else QWEN_VOCAB, tie_word_embeddings=True,
                         max_position_embeddings=4096, rope_parameters={"rope_type": "default", "rope_theta": 1.0e6},
                         bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                         **shapes)
    torch.manual_seed(seed)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # init straight in bf16: no fp32 copy of 1.5B weights
    try:
        with torch.device(device):
            model = Qwen2ForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)
    return model.eval(), tok


def build_shape_model(directory: Path, tiny: bool, device: str) -> dict[str, Any]:
    """Save the random-weight model (Qwen2.5-1.5B shapes, or TINY) with the embedded tokenizer."""
    model, tok = shape_model(tiny, device)
    model.save_pretrained(directory)
    tok.save_pretrained(directory)
    n = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    del model
    return {"path": str(directory), "weights": "random, bf16", "parameters": n,
            "shapes": "tiny" if tiny else "qwen2.5-1.5b (vocabulary 151,936)"}


def build_embedded_model(directory: Path) -> dict[str, Any]:
    """The embedded default's pretrained weights, cast to bf16, saved as a local HF directory."""
    from esreason.backends.hf import load_model

    model, tok = load_model("demo")
    model = model.to(torch.bfloat16)
    model.save_pretrained(directory)
    tok.save_pretrained(directory)
    n = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    return {"path": str(directory), "weights": "embedded default (pretrained), bf16", "parameters": n}


def prompts_for(tok: Any, n: int) -> list[str]:
    """gen_cmp.py's prompts: all of one length (4 + 4 digits), so ``generate`` needs no padding."""
    return [f"{tok.bos_token}{1000 + 37 * i}+{2000 + 11 * i}=" for i in range(n)]


def sampler_vs_generate(tiny: bool, device: str, shapes: list[tuple[int, int]]) -> dict[str, Any]:
    """Greedy B x L tokens, eos ignored: esreason's Sampler (cache auto) vs ``model.generate``."""
    from esreason.backends.base import SamplingParams
    from esreason.backends.sampling import Sampler

    model, tok = shape_model(tiny, device)
    rows = []
    for b, length in shapes:
        prompts = prompts_for(tok, b)
        sampler = Sampler(model, tok, batch_size=b, cache="auto")
        sampler.generate(prompts[:2], SamplingParams(max_new_tokens=4))  # warm-up (kernels, allocator)
        params = SamplingParams(max_new_tokens=length, temperature=0.0)
        s_sampler, gen = timed(device, lambda: sampler.generate(prompts, params, ignore_eos=True))
        enc = tok(prompts, return_tensors="pt", add_special_tokens=False).to(device)
        enc.pop("token_type_ids", None)
        kw = dict(do_sample=False, pad_token_id=tok.pad_token_id)
        with torch.no_grad():
            model.generate(**enc, max_new_tokens=4, min_new_tokens=4, **kw)  # warm-up
            s_generate, out = timed(device, lambda: model.generate(**enc, max_new_tokens=length,
                                                                   min_new_tokens=length, **kw))
        theirs = out[:, enc["input_ids"].shape[1]:].tolist()
        ours = [list(ids) for ids in gen.token_ids]
        same = sum(a == b_ for a, b_ in zip(ours, theirs))
        rows.append({"B": b, "L": length, "sampler_s": s_sampler, "generate_s": s_generate,
                     "sampler_tok_s": b * length / s_sampler, "generate_tok_s": b * length / s_generate,
                     "sampler_vs_generate": s_generate / s_sampler,
                     "tokens_generated": [sum(len(r) for r in ours), sum(len(r) for r in theirs)],
                     "rows_identical_share": same / b})
    del model
    ok = all(r["tokens_generated"] == [r["B"] * r["L"]] * 2 for r in rows)
    return {"model": "tiny random" if tiny else "qwen2.5-1.5b shapes, random bf16 weights",
            "sampler_cache": "auto", "generate_cache": "dynamic", "greedy": True, "eos_ignored": True,
            "shapes": rows, "ok": ok}


def grpo_plan_terms(model_dir: str, grpo_mapping: dict[str, Any], updates: int, gpu: str = "h100") -> dict[str, Any]:
    """The planner's ``train (grpo)`` stage for this GRPO config on one GPU of type ``gpu``."""
    from esreason.experiments.plan import build_plan
    from esreason.experiments.spec import parse_spec

    spec = parse_spec({"name": "gpu-acceptance", "model": model_dir, "task": grpo_mapping["task"],
                       "updates": updates, "methods": ["grpo"], "configs": {"grpo": grpo_mapping},
                       # the plan also prices an evaluation stage; only the training stage is read
                       "eval": {"in_domain": ["gsm8k"], "held_out": ["gsm8k"], "limit": 1}})
    plan = build_plan(spec, 1, gpu)
    stage = next(s for s in plan["stages"] if "grpo" in s["name"] and "eval" not in s["name"])
    return {"gpu_type": plan["gpu_type"], "stage": stage["name"], "parameters": plan["parameters"],
            "terms_s": stage["terms_s"], "wall_s": sum(stage["terms_s"].values()),
            "responses": stage["responses"], "tokens": stage["tokens"],
            "note": "esreason.experiments.plan.build_plan, 1 GPU, this run's GRPO config"}
