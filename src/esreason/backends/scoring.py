"""Token entropy of sampled responses by a teacher-forced scoring pass (the fast path's entropy).

The paper tracks the token-level entropy of the policy (section "Entropy Collapse",
``H(s) = -sum_a p_a log p_a``); our evaluation records, per response, the sum over its
generated tokens of the entropy of softmax(logits / T_eval) *before* top-p truncation
(:mod:`esreason.backends.sampling`, ``compute_entropy``). The HF sampler computes it while
decoding. vLLM returns only the top-k log-probabilities of each step, not the
full-vocabulary distribution, so its prompt log-probs cannot give this number exactly.
Instead, the responses an engine sampled are fed back through a transformers copy of the
same weights in one forward per batch (teacher forcing): the logits at position
``len(prompt) + t - 1`` are the ones the sampler saw when it chose response token t.

Conventions match the sampler exactly: prompt ids are the chat-rendered prompt tokenised
without special tokens; response ids exclude the stop token (the step that emits EOS is
not counted); T = 1 for greedy responses. On the same responses the two agree to float
tolerance (tests/test_vllm_eval.py compares them; they differ only by the summation order
of a prefill + incremental decode against one full forward).

Memory: logits are computed for ``slice_tokens`` positions at a time from the final
hidden states, so a 2,048-token response at a 152k vocabulary never materialises its
[L, V] logits at once.

Shared prompts: an evaluation scores ``samples`` responses per problem, all
behind the same prompt. Rows with the same prompt are scored as a group: the prompt is forwarded
once (one row; its last hidden state gives every row's first-token entropy), its KV cache is
copied to the group's rows, and only the responses are forwarded against it. On HotpotQA's
~1,000-token prompts with 32 samples of ~250 tokens that is 1,000 + 32 x 250 instead of
32 x 1,250 scored positions (4.4x fewer). Same numbers up to float32 summation order (a prefill +
continuation, as the sampler itself computes them).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from esreason.backends import topp
from esreason.backends.kvcache import cache_keyword

#: Positions whose logits are formed at once (per row) from the final hidden states.
SLICE_TOKENS = 256
#: Prompt + response tokens per scoring forward (rows are packed up to this budget).
TOKENS_PER_FORWARD = 16384


def right_padded(prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]], device: Any) -> dict[str, Any]:
    """The forward's keyword arguments for prompt + response rows, right-padded to the longest:
    ``input_ids`` and ``attention_mask`` [B, W] and ``position_ids`` 0..W-1 per row, on ``device``."""
    lengths = [len(p) + len(r) for p, r in zip(prompts, responses)]
    width = max(lengths)
    ids = torch.zeros((len(prompts), width), dtype=torch.long)  # [B, W]
    mask = torch.zeros((len(prompts), width), dtype=torch.long)  # [B, W]
    for j, (p, r) in enumerate(zip(prompts, responses)):
        ids[j, :lengths[j]] = torch.tensor(list(p) + list(r), dtype=torch.long)
        mask[j, :lengths[j]] = 1
    pos = torch.arange(width).unsqueeze(0).expand(len(prompts), -1)  # [B, W] (right padding)
    return {"input_ids": ids.to(device), "attention_mask": mask.to(device), "position_ids": pos.to(device)}


def _decoder_and_head(model: Any) -> tuple[Any, Any]:
    """(the body returning final hidden states, the LM head) of a transformers causal LM."""
    body = model.get_decoder() if hasattr(model, "get_decoder") else getattr(model, "model", None)
    head = model.get_output_embeddings()
    if body is None or head is None:
        raise TypeError(f"{type(model).__name__}: cannot find the decoder and the LM head for entropy scoring")
    return body, head


class EntropyScorer:
    """Per-response entropy sums of given responses under a transformers causal LM.

    model: the same weights that sampled the responses (any device / dtype; the logits
        are promoted to float32 before the softmax, as in the sampler).
    tokens_per_forward: padded prompt + response tokens per forward (memory knob).
    share_prompts: score rows behind the same prompt as a group (the prompt forwarded once);
        False forwards every row's prompt + response (benchmarks/entropy_scoring.py compares).
    """

    def __init__(self, model: Any, *, tokens_per_forward: int = TOKENS_PER_FORWARD,
                 slice_tokens: int = SLICE_TOKENS, share_prompts: bool = True) -> None:
        self.model = model
        self.body, self.head = _decoder_and_head(model)
        self.tokens_per_forward = max(1, int(tokens_per_forward))
        self.slice_tokens = max(1, int(slice_tokens))
        self.share_prompts = share_prompts
        self.softcap = getattr(model.config, "final_logit_softcapping", None)
        self.device = next(model.parameters()).device
        self._cache_kw = cache_keyword(self.body)  # "past_key_values" (transformers <= 5.23) or "cache"
        self.shared_forwards = 0  # prompt forwards of shared-prompt groups (a test reads it)

    def entropy_sums(self, prompt_ids: Sequence[Sequence[int]], response_ids: Sequence[Sequence[int]],
                     temperature: float) -> list[float]:
        """Per row: sum over its response tokens of H(softmax(logits / T)) in nats (T = 1 when 0).

        prompt_ids / response_ids: one list of token ids per row (response without the stop token).
        """
        if len(prompt_ids) != len(response_ids):
            raise ValueError(f"{len(prompt_ids)} prompts for {len(response_ids)} responses")
        t = 1.0 if temperature == 0 else float(temperature)
        out = [0.0] * len(prompt_ids)
        groups: dict[Any, list[int]] = {}
        for i in range(len(prompt_ids)):
            if response_ids[i]:
                groups.setdefault(tuple(prompt_ids[i]) if self.share_prompts else i, []).append(i)
        shared = [rows for rows in groups.values() if len(rows) > 1]
        order = sorted((rows[0] for rows in groups.values() if len(rows) == 1),
                       key=lambda i: -(len(prompt_ids[i]) + len(response_ids[i])))
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.inference_mode():
                for rows in shared:
                    rows = sorted(rows, key=lambda i: -len(response_ids[i]))
                    plen = len(prompt_ids[rows[0]])
                    start = 0
                    while start < len(rows):
                        per = max(1, self.tokens_per_forward // (plen + len(response_ids[rows[start]])))
                        batch = rows[start:start + per]
                        for i, value in zip(batch, self._score_shared(prompt_ids[rows[0]],
                                                                      [response_ids[i] for i in batch], t)):
                            out[i] = value
                        start += per
                start = 0
                while start < len(order):
                    width = len(prompt_ids[order[start]]) + len(response_ids[order[start]])
                    rows = max(1, self.tokens_per_forward // width)
                    batch = order[start:start + rows]
                    for i, value in zip(batch, self._score_batch([prompt_ids[i] for i in batch],
                                                                 [response_ids[i] for i in batch], t)):
                        out[i] = value
                    start += rows
        finally:
            self.model.train(was_training)
        return out

    def _entropy(self, hidden: torch.Tensor, t: float) -> torch.Tensor:
        """Sum of per-position entropies of hidden [L, H], ``slice_tokens`` positions at a time (float64 scalar)."""
        total = torch.zeros((), dtype=torch.float64, device=hidden.device)
        for s in range(0, hidden.shape[0], self.slice_tokens):
            logits = self.head(hidden[s:s + self.slice_tokens])  # [S, V]
            if self.softcap:
                logits = torch.tanh(logits.float() / self.softcap) * self.softcap
            total += topp.entropy(topp.scaled_log_probs(logits, t)).double().sum()
        return total

    def _score_shared(self, prompt: Sequence[int], responses: list[Sequence[int]], t: float) -> list[float]:
        """Rows behind one prompt: the prompt forwarded once, its cache copied to every row, then the
        responses (all but their last token, right-padded) forwarded against it."""
        dev, kw = self.device, self._cache_kw
        plen, g = len(prompt), len(responses)
        out = self.body(input_ids=torch.tensor([list(prompt)], dtype=torch.long, device=dev), use_cache=True,
                        **{kw: None})
        self.shared_forwards += 1
        first = float(self._entropy(out.last_hidden_state[0, -1:], t))  # response token 1, every row
        width = max(len(r) for r in responses) - 1  # positions fed after the prompt
        if width == 0:
            return [first] * g
        cache = getattr(out, kw)
        cache.reorder_cache(torch.zeros(g, dtype=torch.long, device=dev))  # [1, ...] -> [G, ...]
        ids = torch.zeros((g, width), dtype=torch.long)  # [G, W] right-padded responses minus their last token
        mask = torch.zeros((g, plen + width), dtype=torch.long)  # [G, P + W]
        mask[:, :plen] = 1
        for j, r in enumerate(responses):
            ids[j, :len(r) - 1] = torch.tensor(list(r[:-1]), dtype=torch.long)
            mask[j, plen:plen + len(r) - 1] = 1
        pos = (plen + torch.arange(width)).unsqueeze(0).expand(g, -1)  # [G, W]
        hidden = self.body(input_ids=ids.to(dev), attention_mask=mask.to(dev), position_ids=pos.to(dev),
                           use_cache=True, **{kw: cache}).last_hidden_state  # [G, W, H]
        return [first + float(self._entropy(hidden[j, :len(r) - 1], t)) for j, r in enumerate(responses)]

    def _score_batch(self, prompts: list[Sequence[int]], responses: list[Sequence[int]], t: float) -> list[float]:
        """One right-padded forward over prompt + response rows; entropy sums per row."""
        hidden = self.body(**right_padded(prompts, responses, self.device)).last_hidden_state  # [B, W, H]
        # logits at positions [len(p) - 1, len(p) + len(r) - 1) choose the response tokens
        return [float(self._entropy(hidden[j, len(p) - 1:len(p) + len(r) - 1], t))
                for j, (p, r) in enumerate(zip(prompts, responses))]
