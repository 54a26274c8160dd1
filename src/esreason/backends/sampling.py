"""Batched sampling from any Hugging Face causal LM with a plain KV-cache decode loop.

This is the generation engine behind ES training (appendix "Implementation-Level Training
Procedure", step 3: each perturbed member "generate[s] one response for every prompt in the
shared mini-batch") and behind evaluation (32 samples per problem at temperature 0.6,
appendix "Evaluation Configuration"). The paper generates with vLLM; this is the
transformers-only engine for CPU and small models.
It calls ``model(...)`` directly instead of ``model.generate``: on a tiny model the
per-call and per-step overhead of ``generate`` dominates (see benchmarks/sampler.py).

How a call runs
---------------
1. Prompts (already rendered with the chat template, which puts BOS) are tokenised with
   ``add_special_tokens=False``.
2. Rows are ordered by prompt length (longest first, stable) and cut into chunks of
   ``batch_size``; each chunk is left-padded, with an attention mask and position ids
   that start at 0 on each row's first real token, exactly as ``generate`` does. Results
   come back in prompt order.
3. One prefill forward over the padded chunk (with ``share_prefix=True``: over its *distinct*
   prompts only; an evaluation call holds every problem 32 times, so each distinct row is
   prefilled once and its logits and KV cache are copied to its duplicates, with the same padding
   and positions). Off by default: the prefill GEMMs then have fewer rows, and where the BLAS
   blocks by row count this moves the last bits of a logit. Measured: at the demo's shapes
   (embedded default, 16 problems x 32 samples) outputs are bit-identical with 12 % less CPU per
   evaluation call (benchmarks/shared_prefix.py); on the suite's tiny model and on small calls
   split over evaluation engines, token ids stay identical but entropy sums move by ~1e-6
   relative, which breaks the exact E-engines-equal-one-engine contract of docs/evaluation.md
   and the hf-equals-batched contract of ES training. Then one forward per new token, feeding the
   KV cache (under the keyword the installed transformers expects: ``past_key_values`` up to
   5.23, ``cache`` from 5.24; :func:`esreason.backends.kvcache.cache_keyword`). With ``cache="auto"`` (default) that is a ``DynamicCache``
   whose layers write into contiguous buffers widened every 16 positions, attention reading the
   whole width with the unwritten positions masked (:mod:`esreason.backends.kvcache`; no per-step
   ``torch.cat`` of the whole cache, and contiguous keys keep PyTorch's CPU ``bmm`` on its fast
   path: the demo's evaluation call 0.72 of its time before, same token ids) when
   the model's cache is plain full attention, else the model's own default cache;
   ``cache="dynamic"`` always uses the model's default. Only the last position's logits
   are computed (``logits_to_keep=1``) when the model accepts it. On the CPU, models loaded by
   :func:`esreason.backends.hf.load_model` run these one-token steps with
   :mod:`esreason.backends.cpu_attention` (eager attention; ``sdpa``'s CPU flash kernel was 35 % of
   an evaluation call).
4. Each step picks a token per row (:mod:`esreason.backends.topp`): argmax when
   ``temperature == 0``, else inversion sampling from softmax(logits / T) restricted to the
   top-p nucleus, with one uniform per (row, step) from a CPU ``torch.Generator``.
5. A row stops at an EOS id (``tokenizer.eos_token_id`` and every id in
   ``model.generation_config.eos_token_id``), after ``max_new_tokens`` tokens, or when its
   prompt + response would exceed ``model.config.max_position_embeddings`` (the response is
   cut there: length <= max_position_embeddings - prompt length; a prompt that alone fills
   the context gets an empty response and a logged warning rather than an error, so one
   long benchmark question cannot abort an evaluation). The loop ends when every row has
   stopped. Finished rows are dropped from the batch and the cache (compaction) once at
   least 1/8 of the batch has finished, so long tails do not pay for short answers.

Reproducibility: the chunk c of a call draws its uniforms from a generator seeded with
``SeedSequence([seed, c])``; every step draws one uniform for every row of the chunk,
finished or not, so row i at step t always sees the same uniform for a given
(prompt list, seed). Same seed + same weights + same prompts => identical outputs, on the
same device type. Results are not guaranteed bit-identical across different batch
compositions (matmul blocking depends on the batch size), which is not required.

Entropy (``compute_entropy``): per response, the sum over its returned tokens of the
entropy in nats of softmax(logits / T) at the sampling temperature T, before top-p
truncation (the sampling distribution the paper's entropy curves track); for greedy
decoding T = 1, i.e. the model's own distribution. The step that emits EOS is *not*
counted, so ``entropy_sum[i] / len(token_ids[i])`` is exactly the mean over the returned
tokens (TRL counts the EOS position too; the difference is one position per response).

Two decode loops (``loop``)
---------------------------
Steps 3-5 above run in one of two loops with the same contract (prompts, budgets, stop rules,
compaction rule, uniforms, returned fields). ``"cpu"`` is the loop described above, tuned for
PyTorch's CPU kernels (window KV buffers; a stop check with a host read every step); its outputs
are pinned in tests/test_decode_pinned.py. ``"cuda"`` (:mod:`esreason.backends.leandecode`) issues
as few ATen calls per step as it can, because on an accelerator every call is a kernel launch or
a dispatch and a 1.5B decode step is launch-bound: the model's own cache, no 2-D mask for the
model to rebuild every step (none when the chunk has no padding), tokens and entropies kept on the
device and turned into lengths and stop ids once per chunk, a host read only when the chunk has
stop ids. ``"auto"`` (default) takes ``"cpu"`` when ``device`` is the CPU and ``"cuda"`` on any
other device; the value can be forced either way (benchmarks/decode_ops.py counts the ``"cuda"``
loop's operations on the CPU). On the CPU both loops give the same token ids with
``cache="dynamic"`` (tests/test_decode_ops.py).

Returned ``token_ids`` exclude the EOS token; ``texts`` are decoded with
:func:`esreason.embedded.safe_decode` (special tokens dropped, ids the tokenizer never
assigned dropped instead of crashing the decoder).
"""

from __future__ import annotations

import inspect
import logging
import math
import time
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch

from esreason.backends import leandecode, topp
from esreason.backends.kvcache import cache_keyword, preallocated_cache
from esreason.backends.base import Generation, SamplingParams
from esreason.embedded import safe_decode
from esreason.errors import UserError

log = logging.getLogger(__name__)

# Compact the batch (drop finished rows from the KV cache) once the live rows fall to this
# share of the current batch (compacting copies the cache, so not at every finished row).
# 0.75-0.875 measured best on the embedded default; see ``options`` in benchmarks/sampler.py.
COMPACT_BELOW = 0.875


@dataclass
class SamplerStats:
    """Counters of the last call (for benchmarks and logs).

    prompts: rows in the call. tokens: returned tokens. forwards: model calls.
    seconds: wall time of the call. context_limited: rows cut by max_position_embeddings
    (including prompts that alone fill the context and got an empty response).
    """

    prompts: int = 0
    tokens: int = 0
    forwards: int = 0
    seconds: float = 0.0
    context_limited: int = 0


def _model_device(model: Any) -> torch.device:
    try:
        return next(model.parameters()).device
    except StopIteration:
        return torch.device("cpu")


def _eos_ids(model: Any, tokenizer: Any) -> list[int]:
    """EOS ids: the tokenizer's plus ``generation_config.eos_token_id`` (int or list)."""
    ids: set[int] = set()
    if getattr(tokenizer, "eos_token_id", None) is not None:
        ids.add(int(tokenizer.eos_token_id))
    gen_cfg = getattr(model, "generation_config", None)
    extra = getattr(gen_cfg, "eos_token_id", None) if gen_cfg is not None else None
    if isinstance(extra, int):
        ids.add(extra)
    elif isinstance(extra, (list, tuple)):
        ids.update(int(i) for i in extra)
    return sorted(ids)


def check_params(params: SamplingParams) -> None:
    """Reject sampling parameters that cannot be honoured (UserError naming the field)."""
    if not isinstance(params.max_new_tokens, int) or params.max_new_tokens < 0:
        raise UserError(f"max_new_tokens must be an integer >= 0, got {params.max_new_tokens!r}")
    if not (isinstance(params.temperature, (int, float)) and math.isfinite(params.temperature)
            and params.temperature >= 0):
        raise UserError(f"temperature must be a finite number >= 0, got {params.temperature!r}")
    if not (isinstance(params.top_p, (int, float)) and 0 < params.top_p <= 1):
        raise UserError(f"top_p must be in (0, 1], got {params.top_p!r}")
    if not isinstance(params.seed, int):
        raise UserError(f"seed must be an integer, got {params.seed!r}")


def chunk_generator(seed: int, chunk: int) -> torch.Generator:
    """The CPU generator of chunk ``chunk`` of a call with sampling seed ``seed``."""
    state = np.random.SeedSequence([seed % 2**64, chunk]).generate_state(1, dtype=np.uint64)[0]
    gen = torch.Generator(device="cpu")
    gen.manual_seed(int(state) >> 1)  # manual_seed takes a non-negative int64
    return gen


def left_pad(rows: list[list[int]], pad_id: int, steps: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A chunk's left-padded prefill inputs (CPU tensors): ids [B, plen], mask [B, plen + steps] bool
    (False on padding; preallocated for the response) and position ids [B, plen], 0 on each row's first
    real token as ``generate`` numbers them."""
    b0, plen = len(rows), max(len(r) for r in rows)
    ids = torch.full((b0, plen), pad_id, dtype=torch.long)
    mask = torch.ones((b0, plen + steps), dtype=torch.bool)
    for j, r in enumerate(rows):
        ids[j, plen - len(r):] = torch.tensor(r, dtype=torch.long)
        mask[j, :plen - len(r)] = 0
    pos = (mask[:, :plen].long().cumsum(-1) - 1).clamp_(min=0)
    return ids, mask, pos


class Sampler:
    """Batched KV-cache sampler over a Hugging Face causal LM (implements ``Generator``).

    model: a ``transformers`` causal LM (any dtype, any device); the sampler switches it
        to eval mode for the duration of a call and restores the previous mode.
    tokenizer: its tokenizer (used to tokenise prompts, for EOS/pad ids and decoding).
    batch_size: rows per forward; longer prompt lists are processed in chunks.
    device: where inputs go; default the device of the model's first parameter.
    sort_by_length: order rows by prompt length before chunking (less padding).
    compact: drop finished rows from the batch and the cache during decoding.
    cache: "auto" (esreason's KV buffers where the model allows) or "dynamic" (the
        model's default ``DynamicCache``).
    share_prefix: prefill each distinct prompt of a chunk once and copy its logits and KV
        cache to the rows that repeat it (32 samples per problem prefill 1/32; same token ids,
        logits equal up to float32 rounding; off by default, see step 3 above).
    loop: "auto" (the ``"cpu"`` loop on a CPU device, ``"cuda"`` elsewhere), "cpu" or "cuda"
        (see "Two decode loops" above). The ``"cuda"`` loop always uses the model's default
        cache, whatever ``cache`` says.
    """

    def __init__(self, model: Any, tokenizer: Any, *, batch_size: int = 256, device: Any = None,
                 sort_by_length: bool = True, compact: bool = True, cache: str = "auto",
                 share_prefix: bool = False, loop: str = "auto") -> None:
        if not isinstance(batch_size, int) or batch_size < 1:
            raise UserError(f"batch_size must be an integer >= 1, got {batch_size!r}")
        if cache not in ("auto", "dynamic"):
            raise UserError(f"cache must be 'auto' or 'dynamic', got {cache!r}")
        if loop not in ("auto", "cpu", "cuda"):
            raise UserError(f"loop must be 'auto', 'cpu' or 'cuda', got {loop!r}")
        self.cache = cache
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.device = torch.device(device) if device is not None else _model_device(model)
        self.sort_by_length = sort_by_length
        self.compact = compact
        self.share_prefix = share_prefix
        self.loop = loop if loop != "auto" else ("cpu" if self.device.type == "cpu" else "cuda")
        self.eos_ids = _eos_ids(model, tokenizer)
        pad = getattr(tokenizer, "pad_token_id", None)
        self.pad_id = int(pad) if pad is not None else (self.eos_ids[0] if self.eos_ids else 0)
        self.max_positions: int | None = getattr(model.config, "max_position_embeddings", None)
        self.vocab_size = int(model.get_input_embeddings().num_embeddings)
        self._logits_to_keep = "logits_to_keep" in inspect.signature(model.forward).parameters
        self.cache_kw = cache_keyword(model)  # "past_key_values" (transformers <= 5.23) or "cache"
        self.last_stats = SamplerStats()

    # Public API --------------------------------------------------------------------
    def generate(self, prompts: Sequence[str], params: SamplingParams, *,
                 ignore_eos: bool = False) -> Generation:
        """Sample one response per prompt, in prompt order.

        ignore_eos: never stop at EOS (every row runs to ``max_new_tokens`` or the context
            limit; EOS ids are then kept in ``token_ids``). For benchmarks that need a
            fixed number of tokens; not used by training or evaluation.
        """
        if isinstance(prompts, str):
            raise UserError("prompts must be a sequence of strings, got a single string")
        for i, p in enumerate(prompts):
            if not isinstance(p, str):
                raise UserError(f"prompt {i} is {type(p).__name__}, expected str")
        ids = self.tokenizer(list(prompts), add_special_tokens=False)["input_ids"] if len(prompts) else []
        return self.generate_ids(ids, params, ignore_eos=ignore_eos)

    def generate_ids(self, prompt_ids: Sequence[Sequence[int]], params: SamplingParams, *,
                     ignore_eos: bool = False) -> Generation:
        """Like :meth:`generate`, from token ids (each row non-empty, ids < model vocab)."""
        check_params(params)
        t0 = time.perf_counter()
        rows = [list(map(int, r)) for r in prompt_ids]
        for i, r in enumerate(rows):
            if not r:
                raise UserError(f"prompt {i} is empty after tokenisation")
            if min(r) < 0 or max(r) >= self.vocab_size:
                raise UserError(f"prompt {i} has token ids outside [0, {self.vocab_size})")
        n = len(rows)
        budgets = [self._budget(len(r), params.max_new_tokens) for r in rows]
        limited = sum(1 for r, b in zip(rows, budgets) if b < params.max_new_tokens)
        too_long = [i for i, r in enumerate(rows) if self.max_positions is not None
                    and len(r) >= self.max_positions]
        if too_long and params.max_new_tokens > 0:
            log.warning("%d prompt(s) fill the model's context of %d tokens (first: prompt %d, %d tokens); "
                        "their responses are empty", len(too_long), self.max_positions, too_long[0],
                        len(rows[too_long[0]]))
        run = [i for i in range(n) if budgets[i] > 0]
        if self.sort_by_length:
            run.sort(key=lambda i: -len(rows[i]))  # stable: equal lengths keep prompt order

        token_ids: list[list[int]] = [[] for _ in range(n)]
        entropy_sum: list[float] | None = [0.0] * n if params.compute_entropy else None
        stopped_by: list[int | None] = [None] * n
        stop_ids = [] if ignore_eos else self.eos_ids
        self.last_stats = SamplerStats(prompts=n, context_limited=limited)
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.inference_mode():
                for c, start in enumerate(range(0, len(run), self.batch_size)):
                    idx = run[start:start + self.batch_size]
                    gen = chunk_generator(params.seed, c) if params.temperature > 0 else None
                    toks, ents, stops = self._decode_chunk([rows[i] for i in idx], [budgets[i] for i in idx],
                                                           params, gen, stop_ids)
                    for j, i in enumerate(idx):
                        token_ids[i] = toks[j]
                        stopped_by[i] = stops[j]
                        if entropy_sum is not None and ents is not None:
                            entropy_sum[i] = ents[j]
        finally:
            self.model.train(was_training)
        texts = [safe_decode(self.tokenizer, t, skip_special_tokens=True) for t in token_ids]
        out = Generation(texts=texts, token_ids=token_ids, entropy_sum=entropy_sum, stop_ids=stopped_by)
        self.last_stats.tokens = out.num_tokens
        self.last_stats.seconds = time.perf_counter() - t0
        return out

    # Internals ---------------------------------------------------------------------
    def _budget(self, prompt_len: int, max_new_tokens: int) -> int:
        """New tokens allowed for a prompt: max_new_tokens, cut so prompt + response fits the context."""
        if self.max_positions is None:
            return max_new_tokens
        return max(0, min(max_new_tokens, self.max_positions - prompt_len))

    def _forward(self, input_ids: torch.Tensor, mask: torch.Tensor, position_ids: torch.Tensor,
                 cache: Any) -> tuple[torch.Tensor, Any]:
        """One model call; returns (last-position logits [B, V], the updated cache)."""
        kwargs = self.forward_kwargs(cache)
        kwargs.update(input_ids=input_ids, attention_mask=mask, position_ids=position_ids)
        out = self.model(**kwargs)
        self.last_stats.forwards += 1
        return out.logits[:, -1, :], getattr(out, self.cache_kw)

    def forward_kwargs(self, cache: Any) -> dict[str, Any]:
        """The keyword arguments every model call of a decode takes besides its inputs: ``use_cache``,
        the cache under :attr:`cache_kw` and ``logits_to_keep=1`` where the model accepts it."""
        kwargs: dict[str, Any] = {"use_cache": True, self.cache_kw: cache}
        if self._logits_to_keep:
            kwargs["logits_to_keep"] = 1
        return kwargs

    def _prefill(self, rows: list[list[int]], ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor,
                 cache: Any) -> tuple[torch.Tensor, Any]:
        """Prefill forward of a chunk: ids/mask/pos [B, plen] -> (last-position logits [B, V], cache).

        With ``share_prefix``, only the first row of each distinct prompt is fed ([U, plen], same
        padding width and positions); the other rows take copies of its logits and KV cache rows
        (``reorder_cache`` with the row -> distinct-prompt map). Every GEMM row, attention row and
        normalisation is computed per row, so the copied values are the bits a full prefill gives.
        """
        if not self.share_prefix:
            return self._forward(ids, mask, pos, cache)
        first: dict[tuple[int, ...], int] = {}
        source = [first.setdefault(tuple(r), j) for j, r in enumerate(rows)]  # [B] first row of each prompt
        if len(first) == len(rows):
            return self._forward(ids, mask, pos, cache)
        unique = sorted(first.values())  # [U] chunk rows that are fed
        slot = {j: u for u, j in enumerate(unique)}
        expand = torch.tensor([slot[j] for j in source], dtype=torch.long, device=ids.device)  # [B] -> [0, U)
        keep = torch.tensor(unique, dtype=torch.long, device=ids.device)
        logits, cache = self._forward(ids[keep], mask[keep], pos[keep], cache)  # [U, V]
        cache.reorder_cache(expand)
        return logits[expand], cache

    def _decode_chunk(self, rows: list[list[int]], budgets: list[int], params: SamplingParams,
                      gen: torch.Generator | None, stop_ids: list[int],
                      ) -> tuple[list[list[int]], list[float] | None, list[int | None]]:
        """Decode one left-padded chunk; returns per row its tokens, entropy sum and stop id (or None)."""
        dev = self.device
        b0, plen = len(rows), max(len(r) for r in rows)
        steps = max(budgets)
        ids, mask, pos = left_pad(rows, self.pad_id, steps)
        ids, mask, pos = ids.to(dev), mask.to(dev), pos.to(dev)
        if self.loop == "cuda":  # the model's own cache; the steps in leandecode
            logits, cache = self._prefill(rows, ids, mask[:, :plen], pos, None)  # [B, V]
            return leandecode.decode_steps(self, logits, cache, rows, mask, budgets, params, gen, stop_ids,
                                           compact_below=COMPACT_BELOW)
        next_pos = pos[:, -1] + 1  # [B] position of the first response token
        # Rows that stopped at the context limit but are not compacted away yet are still fed;
        # keep their positions inside the table (models with learned position embeddings).
        max_pos = (self.max_positions - 1) if self.max_positions is not None else None
        budget = torch.tensor(budgets, dtype=torch.long, device=dev)  # [B]
        stop = torch.tensor(stop_ids, dtype=torch.long, device=dev)  # [S]

        out_tok = torch.zeros((b0, steps), dtype=torch.long, device=dev)  # [B0, steps]
        out_len = torch.zeros(b0, dtype=torch.long, device=dev)  # [B0]
        finished = torch.zeros(b0, dtype=torch.bool, device=dev)  # [B0] stopped (EOS, budget)
        out_stop = torch.full((b0,), -1, dtype=torch.long, device=dev)  # [B0] the EOS id that ended a row
        ent_sum = torch.zeros(b0, dtype=torch.float64, device=dev) if params.compute_entropy else None
        live = torch.arange(b0, device=dev)  # chunk row of each batch row
        live_cpu = torch.arange(b0)
        greedy = params.temperature == 0
        temperature = 1.0 if greedy else float(params.temperature)

        cache = preallocated_cache(self.model.config, plen + steps) if self.cache == "auto" else None
        logits, cache = self._prefill(rows, ids, mask[:, :plen], pos, cache)  # [B, V]
        for step in range(steps):
            if greedy:
                tok = topp.greedy(logits)  # [B]
                log_probs = topp.scaled_log_probs(logits, temperature) if ent_sum is not None else None
            else:
                log_probs = topp.scaled_log_probs(logits, temperature)  # [B, V] float32
                uniforms = torch.rand(b0, generator=gen)[live_cpu]  # [B]; one per chunk row and step
                tok = topp.sample(log_probs, params.top_p, uniforms)
            tok.clamp_(0, logits.shape[-1] - 1)
            emit = ~finished[live]  # [B] rows that keep this step's token
            if stop.numel():
                at_stop = torch.isin(tok, stop)  # [B]
                out_stop[live] = torch.where(emit & at_stop, tok, out_stop[live])
                emit &= ~at_stop
            out_tok[live, step] = tok  # beyond a finished row's length: ignored
            out_len[live] += emit.long()
            if ent_sum is not None and log_probs is not None:
                ent_sum[live] += topp.entropy(log_probs).double() * emit
            running = emit & (out_len[live] < budget[live])  # [B]
            finished[live] = ~running
            n_running = int(running.sum())
            if n_running == 0:
                break
            if self.compact and n_running <= COMPACT_BELOW * live.numel():
                keep = running.nonzero().squeeze(-1)  # [B'] batch rows to keep
                cache.reorder_cache(keep)
                live, live_cpu = live[keep], live_cpu[keep.cpu()]
                mask, next_pos, tok = mask[keep], next_pos[keep], tok[keep]
            # Feed the chosen tokens (finished rows not yet compacted away are fed too; ignored).
            kv = plen + step + 1
            feed_pos = next_pos if max_pos is None else next_pos.clamp(max=max_pos)
            logits, cache = self._forward(tok.unsqueeze(-1), mask[:, :kv], feed_pos.unsqueeze(-1), cache)
            next_pos = next_pos + 1

        lengths = out_len.tolist()
        toks = out_tok.cpu().tolist()
        tokens = [toks[j][:lengths[j]] for j in range(b0)]
        ents = ent_sum.tolist() if ent_sum is not None else None
        stops = [s if s >= 0 else None for s in out_stop.tolist()]
        return tokens, ents, stops
