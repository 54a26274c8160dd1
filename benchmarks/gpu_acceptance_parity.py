"""The HF sampler against transformers' ``generate`` (benchmarks/gpu_acceptance.py, section
``sampler_vs_generate``): the same greedy token ids, and tokens per second side by side.

Greedy decoding of left-padded prompts of several lengths by ``esreason.backends.sampling.Sampler``
and by ``model.generate`` on the same model, with EOS handled the same way by both:

- ``eos=True``: both stop a row at the model's EOS ids (the sampler's ``eos_ids``, given to
  ``generate`` as its ``eos_token_id``); the sampler returns the ids before EOS, ``generate``'s row is
  cut at its first EOS (it pads finished rows);
- ``eos=False``: neither stops nor suppresses EOS -- the sampler with ``ignore_eos=True`` and
  ``generate`` with ``eos_token_id=[]`` (None would be filled in from the model's generation config).
  (``min_new_tokens`` is not used: it masks EOS out of
  ``generate``'s logits, which the sampler never does, so the two would differ wherever EOS is the
  argmax.)

Agreement counts, per row, the tokens up to the first position where the two differ, over the
longer row's length (a divergence costs the rest of the row). ``decode_loop`` names the loop that
ran (``Sampler.loop``: ``cpu`` or ``cuda``) and the cache it used (the ``cuda`` loop always uses the
model's own cache, whatever ``cache`` says). On the CPU both loops are compared and must agree
exactly; on a GPU the ``cuda`` loop runs, and agreement must reach :data:`GPU_AGREEMENT`.
Tokens per second: ``repeats`` alternating runs of the sampler and ``generate`` (EOS ignored, so
both make B x L tokens), each time reported.
"""

from __future__ import annotations

import copy
import time
from typing import Any, Callable, Sequence

import torch

#: Token agreement the GPU run must reach (bf16 kernels of the two code paths may break a near-tie
#: differently; each such flip costs the rest of its row).
GPU_AGREEMENT = 0.99


def sync(device: str) -> None:
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def timed(device: str, fn: Callable[[], Any]) -> tuple[float, Any]:
    """(seconds, result) of ``fn`` with the device synchronised on both sides."""
    sync(device)
    t0 = time.perf_counter()
    out = fn()
    sync(device)
    return time.perf_counter() - t0, out


def agreement(ours: Sequence[Sequence[int]], theirs: Sequence[Sequence[int]]) -> dict[str, Any]:
    """Tokens equal up to each row's first difference, over the longer row's length, summed."""
    same = total = identical = 0
    first: list[int | None] = []
    for a, b in zip(ours, theirs):
        n = 0
        while n < min(len(a), len(b)) and a[n] == b[n]:
            n += 1
        length = max(len(a), len(b))
        same, total = same + n, total + length
        identical += int(list(a) == list(b))
        first.append(None if list(a) == list(b) else n)
    return {"token_agreement": same / total if total else 1.0, "tokens_compared": total,
            "rows_identical_share": identical / max(len(first), 1), "first_difference_at": first}


def generation_config(model: Any, max_new_tokens: int, pad_id: int, eos_ids: list[int] | None) -> Any:
    """Greedy ``generate`` settings: ``eos_ids`` stop a row (None: nothing stops it, nothing is suppressed)."""
    gc = copy.deepcopy(model.generation_config)
    gc.do_sample, gc.num_beams, gc.max_new_tokens, gc.min_new_tokens = False, 1, max_new_tokens, None
    gc.min_length, gc.max_length = 0, None
    gc.temperature = gc.top_p = gc.top_k = None
    # [] and not None: generate fills an unset (None) eos_token_id from the model's own generation config
    gc.pad_token_id, gc.eos_token_id = pad_id, (list(eos_ids) if eos_ids else [])
    return gc


def generate_ids(model: Any, tok: Any, prompts: Sequence[str], max_new_tokens: int, eos_ids: list[int] | None,
                 pad_id: int) -> list[list[int]]:
    """``model.generate`` on the left-padded prompts; per row the new ids, cut before the first EOS."""
    enc = tok(list(prompts), return_tensors="pt", padding=True, add_special_tokens=False)
    enc.pop("token_type_ids", None)
    enc = enc.to(next(model.parameters()).device)
    with torch.inference_mode():
        out = model.generate(**enc, generation_config=generation_config(model, max_new_tokens, pad_id, eos_ids))
    rows = out[:, enc["input_ids"].shape[1]:].tolist()
    if eos_ids:
        rows = [r[:min([r.index(e) for e in eos_ids if e in r] or [len(r)])] for r in rows]
    return rows


def decode_loop(sampler: Any) -> dict[str, str]:
    """What decoded: the sampler's loop and the cache it used (the ``cuda`` loop ignores ``cache``)."""
    cache = "the model's own (the cuda loop ignores cache)" if sampler.loop == "cuda" else sampler.cache
    return {"loop": sampler.loop, "cache": cache}


def compare(model: Any, tok: Any, prompts: Sequence[str], max_new_tokens: int, *, eos: bool, loop: str) -> dict:
    """Greedy ids of the sampler (``loop``) and of ``generate`` on the same padded prompts."""
    from esreason.backends.base import SamplingParams
    from esreason.backends.sampling import Sampler

    sampler = Sampler(model, tok, batch_size=len(prompts), loop=loop)
    ours = sampler.generate(list(prompts), SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0),
                            ignore_eos=not eos).token_ids
    theirs = generate_ids(model, tok, prompts, max_new_tokens, sampler.eos_ids if eos else None, sampler.pad_id)
    lengths = [len(r) for r in tok(list(prompts), add_special_tokens=False)["input_ids"]]
    return {"decode_loop": decode_loop(sampler), "eos": "stops both" if eos else "ignored by both",
            "prompts": len(prompts), "prompt_tokens": sorted(set(lengths)), "max_new_tokens": max_new_tokens,
            "tokens": [sum(len(r) for r in ours), sum(len(r) for r in theirs)],
            "rows_ending_at_eos": sum(1 for r in theirs if len(r) < max_new_tokens) if eos else None,
            **agreement(ours, theirs)}


def throughput(model: Any, tok: Any, prompts: Sequence[str], length: int, device: str, repeats: int) -> dict:
    """Tokens/s of the sampler (its default loop for ``device``) and of ``generate``, EOS ignored by both,
    ``repeats`` alternating runs after one warm-up each; the ids of the first run compared."""
    from esreason.backends.base import SamplingParams
    from esreason.backends.sampling import Sampler

    b = len(prompts)
    sampler = Sampler(model, tok, batch_size=b)
    params = SamplingParams(max_new_tokens=length, temperature=0.0)
    sampler.generate(list(prompts[:2]), SamplingParams(max_new_tokens=4))  # warm-up (kernels, allocator)
    generate_ids(model, tok, prompts[:2], 4, None, sampler.pad_id)
    runs: list[dict[str, float]] = []
    ours = theirs = None
    for _ in range(repeats):
        s_ours, gen = timed(device, lambda: sampler.generate(list(prompts), params, ignore_eos=True))
        s_theirs, ids = timed(device, lambda: generate_ids(model, tok, prompts, length, None, sampler.pad_id))
        if ours is None:
            ours, theirs = gen.token_ids, ids
        runs.append({"sampler_s": s_ours, "generate_s": s_theirs, "sampler_tok_s": b * length / s_ours,
                     "generate_tok_s": b * length / s_theirs, "sampler_vs_generate": s_theirs / s_ours})
    tokens = [sum(len(r) for r in ours), sum(len(r) for r in theirs)]
    return {"B": b, "L": length, "decode_loop": decode_loop(sampler), "eos": "ignored by both", "repeats": runs,
            "tokens_generated": tokens, "tokens_expected": b * length, **agreement(ours, theirs)}


def padded_prompts(tok: Any, n: int) -> list[str]:
    """``n`` prompts of several token lengths (operands of 1 to 7 digits), so ``generate`` pads them."""
    return [f"{tok.bos_token}{(37 * i + 5) % 10 ** (1 + i % 7)}+{(11 * i + 3) % 10 ** (1 + (i // 2) % 5)}="
            for i in range(n)]


def chat_prompts(tok: Any, n: int) -> list[str]:
    """The first ``n`` demo-add training prompts, chat-rendered as training renders them (lengths differ)."""
    from esreason import tasks
    from esreason.tasks.base import render_prompt

    return [render_prompt(tok, p.messages) for p in tasks.get("demo-add").load("train", None, n)]
