"""The decode steps of the sampler's ``"cuda"`` loop: as few ATen calls per step as the contract allows.

Why. On an accelerator every ATen call the decode loop makes is a dispatch and (unless it only makes
a view) a kernel launch, and a 1.5B model's one-token step is launch-bound (the ``"cpu"`` loop on CUDA
decoded at 0.58x transformers' ``generate`` on an H100; benchmarks/decode_ops.py). The sampler's ``"cpu"`` loop
(:meth:`esreason.backends.sampling.Sampler._decode_chunk`) is tuned for PyTorch's CPU kernels
instead, and its outputs are pinned (tests/test_decode_pinned.py), so this loop is a separate one
with the same contract: same prefill (the caller's), budgets, stop rules, compaction rule and
uniforms; it returns the same (tokens, entropy sums, stop ids) per row.

What it leaves out, per step, against the ``"cpu"`` loop (counted by benchmarks/decode_ops.py):

- the window KV buffers (:mod:`esreason.backends.kvcache`): they make the attention read masked
  positions past the written ones, so transformers must build a 4-D mask every step
  (``masking_utils.sdpa_mask``, ~30 calls and a host read in ``_ignore_causal_mask_sdpa``'s
  ``fast_all``), and on CUDA ``sdpa`` gets a mask instead of its mask-free flash kernel with GQA.
  The model's default ``DynamicCache`` is used, as ``generate`` does.
- the 2-D attention mask: a chunk without padding passes ``attention_mask=None`` (transformers then
  skips the mask, no host read); a padded chunk of a plain full-attention model under ``sdpa`` or
  ``eager`` passes a view of a preallocated additive 4-D mask [B, 1, 1, W] (0 / -inf), which
  transformers passes through as is (``_preprocess_mask_arguments``). Float rather than bool: PyTorch's
  ``sdpa`` turns a bool mask into a new float tensor in every layer (``convert_boolean_attn_mask``),
  and ``W`` is a multiple of 16 so every stride but the last is one of 8, as the memory-efficient CUDA
  kernel wants (``preprocess_mask`` in aten/src/ATen/native/transformers/attention.cpp pads, i.e.
  copies, any other mask in every layer). Other models get the 2-D mask slice as in the ``"cpu"`` loop.
- the per-step bookkeeping: tokens (and entropies) stay on the device, one [B, 1] tensor per step,
  and lengths, stop ids and entropy sums are computed once per chunk on the host from them (the
  first stop id within a row's budget ends it, exactly the ``"cpu"`` loop's rule). The argmax of the
  [B, 1, V] logits is already the next step's [B, 1] input; position ids are one [B, 1] tensor
  advanced in place; the uniforms of the chunk are drawn at once (``torch.rand(steps, B)``: the same
  numbers as ``steps`` draws of ``B``, tests/test_decode_ops.py) and moved to the device once.
- host reads: with stop ids, one per step (``int(done.sum())``, the number of finished rows, which
  the early end and the compaction rule need; ``generate`` reads ``unfinished_sequences.max() == 0``
  every step too); without (``ignore_eos``), none: budgets are known on the host. A compaction
  reads the kept rows once (``nonzero``).

Entropy sums are the ``"cpu"`` loop's float64 sums in the same order (``np.cumsum`` adds left to
right), so equal logits give equal bits. Logits themselves are equal to the ``"cpu"`` loop with
``cache="dynamic"`` on the CPU (same kernels; tests/test_decode_ops.py); against the window buffers
they differ by float rounding (docs in :mod:`esreason.backends.kvcache`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from esreason.backends import topp
from esreason.backends.base import SamplingParams
from esreason.backends.kvcache import plain_full_attention

MASK_ALIGN = 16
"""The additive mask's last dimension is rounded up to a multiple of this (see the module docstring)."""

# Attention implementations that take an additive float 4-D mask as transformers' sdpa/eager do.
_BIAS_ATTENTION = ("sdpa", "eager", "esreason_cpu")


def padding_bias(rows: list[list[int]], length: int, dtype: torch.dtype, device: Any) -> torch.Tensor:
    """Additive mask [B, 1, 1, W] for left-padded ``rows``: -inf on each row's padding, 0 elsewhere.

    length: prompt width + response steps; W is it rounded up to :data:`MASK_ALIGN` (the columns past
    ``length`` are never read). A step with ``kv`` cached positions passes ``bias[..., :kv]``.
    """
    plen = max(len(r) for r in rows)
    width = -(-length // MASK_ALIGN) * MASK_ALIGN
    bias = torch.zeros((len(rows), 1, 1, width), dtype=dtype)
    for j, r in enumerate(rows):
        bias[j, :, :, :plen - len(r)] = float("-inf")
    return bias.to(device)


def _step_mask(model: Any, rows: list[list[int]], mask: torch.Tensor) -> tuple[torch.Tensor | None, bool]:
    """The attention mask the steps pass, sliced per step: (None, _) without padding, (4-D additive
    mask, True) where the model takes one, else (the 2-D mask, False)."""
    plen = max(len(r) for r in rows)
    if all(len(r) == plen for r in rows):
        return None, False
    config = model.config
    if getattr(config, "_attn_implementation", None) in _BIAS_ATTENTION and plain_full_attention(config):
        dtype = model.get_input_embeddings().weight.dtype
        return padding_bias(rows, mask.shape[-1], dtype, mask.device), True
    return mask, False


def _finish(b0: int, steps: int, budgets: list[int], stop_ids: list[int], segments: list[tuple]) -> tuple[
        list[list[int]], np.ndarray | None, list[int | None]]:
    """Per chunk row: tokens, entropy sums (float64, or None) and stop id, from the recorded segments.

    segments: (chunk rows [B'] of the batch rows, first step, [B', 1] token tensors, [B'] entropy tensors).
    """
    toks = np.full((b0, steps), -1, dtype=np.int64)
    ents = np.zeros((b0, steps), dtype=np.float64) if any(seg[3] for seg in segments) else None
    for live, t0, tok_list, ent_list in segments:
        if not tok_list:
            continue
        block = torch.cat(tok_list, dim=1).cpu().numpy()  # [B', n]
        toks[live, t0:t0 + block.shape[1]] = block
        if ents is not None:
            ents[live, t0:t0 + block.shape[1]] = torch.stack(ent_list, dim=1).double().cpu().numpy()
    tokens: list[list[int]] = []
    stops: list[int | None] = []
    sums = np.zeros(b0, dtype=np.float64) if ents is not None else None
    for j in range(b0):
        row = toks[j, :budgets[j]]
        hits = np.flatnonzero(np.isin(row, stop_ids)) if stop_ids else ()
        n = int(hits[0]) if len(hits) else budgets[j]
        if (row[:n] < 0).any():  # a step of a row that still ran was not recorded: a bug here
            raise RuntimeError(f"decode bookkeeping lost a token of chunk row {j}")
        tokens.append(row[:n].tolist())
        stops.append(int(row[n]) if n < budgets[j] else None)
        if sums is not None and n:
            sums[j] = np.cumsum(ents[j, :n])[-1]  # left to right, as the "cpu" loop adds
    return tokens, sums, stops


def decode_steps(sampler: Any, logits: torch.Tensor, cache: Any, rows: list[list[int]], mask: torch.Tensor,
                 budgets: list[int], params: SamplingParams, gen: torch.Generator | None, stop_ids: list[int], *,
                 compact_below: float) -> tuple[list[list[int]], list[float] | None, list[int | None]]:
    """Decode a prefilled chunk; returns per row its tokens, entropy sum and stop id (or None).

    sampler: the :class:`esreason.backends.sampling.Sampler` (model, device, compact, max_positions,
        forward_kwargs, last_stats). logits: [B, V] of the prefill; cache: its KV cache.
    rows, budgets: the chunk's prompts and token budgets. mask: [B, plen + steps] bool, False on padding.
    compact_below: drop finished rows once running rows are at most this share of the batch.
    """
    dev, model = sampler.device, sampler.model
    b0, plen, steps = len(rows), max(len(r) for r in rows), max(budgets)
    greedy = params.temperature == 0
    temperature = 1.0 if greedy else float(params.temperature)
    stop = torch.tensor(stop_ids, dtype=torch.long, device=dev) if stop_ids else None
    attn, is_bias = _step_mask(model, rows, mask)
    # Positions: len(r) for the first response token; clamp only if some row could pass the table.
    pos = torch.tensor([len(r) for r in rows], dtype=torch.long).view(-1, 1).to(dev)  # [B, 1]
    max_pos = sampler.max_positions - 1 if sampler.max_positions is not None else None
    clamp = max_pos is not None and plen + steps - 2 > max_pos
    uniforms = None if greedy else torch.rand(steps, b0, generator=gen).to(dev)  # [steps, B]
    done = torch.zeros((b0, 1), dtype=torch.bool, device=dev) if stop is not None else None  # [B, 1]

    live = np.arange(b0)  # chunk row of each batch row
    budget = np.asarray(budgets)  # [B] per batch row
    segments: list[tuple] = []
    seg: tuple = (live, 0, [], [])
    logits = logits.unsqueeze(1)  # [B, 1, V]
    kwargs = sampler.forward_kwargs(cache)
    for step in range(steps):
        log_probs = None
        if greedy:
            tok = logits.argmax(dim=-1)  # [B, 1]; ties to the lowest id, as topp.greedy
            if params.compute_entropy:
                log_probs = topp.scaled_log_probs(logits[:, -1], temperature)
        else:
            log_probs = topp.scaled_log_probs(logits[:, -1], temperature)  # [B, V] float32
            tok = topp.sample(log_probs, params.top_p, uniforms[step]).unsqueeze(-1)  # [B, 1]
        seg[2].append(tok)
        if params.compute_entropy:
            seg[3].append(topp.entropy(log_probs))
        if step == steps - 1:
            break
        expired = budget <= step + 1  # [B] rows whose budget this step used up (host-known)
        if done is not None:
            done |= torch.isin(tok, stop)
            newly = np.flatnonzero(budget == step + 1)
            if newly.size:
                done[torch.from_numpy(newly).to(dev)] = True
            running = live.size - int(done.sum())  # the loop's one host read per step
        else:
            running = live.size - int(expired.sum())
        if running == 0:
            break
        if sampler.compact and running <= compact_below * live.size:
            if done is not None:
                keep = (~done).view(-1).nonzero().view(-1)  # [B'] batch rows to keep
                keep_np = keep.cpu().numpy()
            else:
                keep_np = np.flatnonzero(~expired)
                keep = torch.from_numpy(keep_np).to(dev)
            segments.append(seg)
            cache.reorder_cache(keep)
            tok, pos = tok[keep], pos[keep]
            done = done[keep] if done is not None else None
            attn = attn[keep] if attn is not None else None
            uniforms = uniforms[:, keep] if uniforms is not None else None
            live, budget = live[keep_np], budget[keep_np]
            seg = (live, step + 1, [], [])
        # Feed the chosen tokens (finished rows not yet compacted away are fed too; ignored).
        kv = plen + step + 1
        if attn is not None:
            kwargs["attention_mask"] = attn[..., :kv] if is_bias else attn[:, :kv]
        kwargs.update(input_ids=tok, position_ids=pos.clamp(max=max_pos) if clamp else pos)
        out = model(**kwargs)
        sampler.last_stats.forwards += 1
        logits = out.logits  # [B, 1, V]
        kwargs[sampler.cache_kw] = cache = getattr(out, sampler.cache_kw)
        pos.add_(1)
    segments.append(seg)
    tokens, sums, stops = _finish(b0, steps, budgets, stop_ids, segments)
    return tokens, (sums.tolist() if sums is not None else None), stops
