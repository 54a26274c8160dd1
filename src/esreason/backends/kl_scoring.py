"""Token-level KL divergence between two models on given token sequences, by teacher forcing.

The off-task drift analysis (:mod:`esreason.analysis.offtask`) measures how far a trained model's
next-token distribution moved from the base model's on text outside training. For each scored
position t of a row (prompt + response, response tokens scored), both models see the same prefix,
and the full-vocabulary divergence

    KL_t(base || tuned) = sum_v p_base(v | y_<t) * (log p_base(v | y_<t) - log p_tuned(v | y_<t))

is computed exactly from both models' logits (log-softmax in float32; no sampling of v). A row's
value is the sum over its response positions, with the number of positions.

The structure is :class:`esreason.backends.scoring.EntropyScorer`'s: rows right-padded and
packed up to ``tokens_per_forward`` tokens per forward, the logits at positions
``[len(prompt) - 1, len(prompt) + len(response) - 1)`` are the ones that predict the response
tokens, and logits are formed ``slice_tokens`` positions at a time from the final hidden states,
so a long row never materialises its [L, V] logits (here twice: one per model).

Both models must share the tokenizer (the same vocabulary); they may live on any one device and
dtype (logits are promoted to float32 before the softmax).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from esreason.backends.scoring import SLICE_TOKENS, TOKENS_PER_FORWARD, _decoder_and_head, right_padded


def token_kl(base_logits: torch.Tensor, tuned_logits: torch.Tensor) -> torch.Tensor:
    """KL(base || tuned) per position: [S] float32 from two [S, V] logits (any float dtype)."""
    lp = torch.log_softmax(base_logits.float(), dim=-1)  # [S, V]
    lq = torch.log_softmax(tuned_logits.float(), dim=-1)  # [S, V]
    return (lp.exp() * (lp - lq)).sum(dim=-1)  # [S]


class TokenKLScorer:
    """Per-row sums of KL(base || tuned) over response tokens (see the module docstring).

    base / tuned: transformers causal LMs with the same vocabulary, on the same device.
    tokens_per_forward: padded prompt + response tokens per forward (memory knob).
    """

    def __init__(self, base: Any, tuned: Any, *, tokens_per_forward: int = TOKENS_PER_FORWARD,
                 slice_tokens: int = SLICE_TOKENS) -> None:
        vb, vt = base.get_output_embeddings().weight.shape[0], tuned.get_output_embeddings().weight.shape[0]
        if vb != vt:
            raise ValueError(f"the two models' vocabularies differ ({vb} vs {vt} logits): KL needs one tokenizer")
        self.models = (base, tuned)
        self.parts = (_decoder_and_head(base), _decoder_and_head(tuned))
        self.softcaps = tuple(getattr(m.config, "final_logit_softcapping", None) for m in self.models)
        self.tokens_per_forward = max(1, int(tokens_per_forward))
        self.slice_tokens = max(1, int(slice_tokens))
        self.device = next(base.parameters()).device

    def kl_sums(self, prompt_ids: Sequence[Sequence[int]], response_ids: Sequence[Sequence[int]]
                ) -> list[tuple[float, int]]:
        """Per row: (sum over its response tokens of KL_t(base || tuned) in nats, number of tokens).

        prompt_ids: the context of each row (at least one token); response_ids: the scored tokens.
        """
        if len(prompt_ids) != len(response_ids):
            raise ValueError(f"{len(prompt_ids)} prompts for {len(response_ids)} responses")
        if any(len(p) == 0 for p in prompt_ids):
            raise ValueError("every row needs at least one context token")
        out: list[tuple[float, int]] = [(0.0, 0)] * len(prompt_ids)
        order = sorted((i for i in range(len(prompt_ids)) if response_ids[i]),
                       key=lambda i: -(len(prompt_ids[i]) + len(response_ids[i])))
        modes = [m.training for m in self.models]
        for m in self.models:
            m.eval()
        try:
            with torch.inference_mode():
                start = 0
                while start < len(order):
                    width = len(prompt_ids[order[start]]) + len(response_ids[order[start]])
                    batch = order[start:start + max(1, self.tokens_per_forward // width)]
                    sums = self._score_batch([prompt_ids[i] for i in batch], [response_ids[i] for i in batch])
                    for i, value in zip(batch, sums):
                        out[i] = (value, len(response_ids[i]))
                    start += len(batch)
        finally:
            for m, mode in zip(self.models, modes):
                m.train(mode)
        return out

    def _logits(self, which: int, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.parts[which][1](hidden)  # [S, V]
        cap = self.softcaps[which]
        return torch.tanh(logits.float() / cap) * cap if cap else logits

    def _score_batch(self, prompts: list[Sequence[int]], responses: list[Sequence[int]]) -> list[float]:
        """One right-padded forward per model over prompt + response rows; KL sums per row (float64)."""
        kw = right_padded(prompts, responses, self.device)
        hidden = [body(**kw).last_hidden_state for body, _ in self.parts]  # 2 x [B, W, H]
        out = []
        for j, (p, r) in enumerate(zip(prompts, responses)):
            lo, hi = len(p) - 1, len(p) + len(r) - 1  # positions whose logits predict the response tokens
            total = torch.zeros((), dtype=torch.float64, device=self.device)
            for s in range(lo, hi, self.slice_tokens):
                e = min(hi, s + self.slice_tokens)
                total += token_kl(self._logits(0, hidden[0][j, s:e]), self._logits(1, hidden[1][j, s:e])).double().sum()
            out.append(float(total))
        return out


def relative_l2(base: Any, tuned: Any) -> float:
    """||theta - theta_0||_2 / ||theta_0||_2 over unique parameters (tied weights once), in float64
    (the paper's D_rel, :mod:`esreason.analysis.weights.drift`)."""
    from esreason.es.params import unique_named_parameters

    theirs = dict(unique_named_parameters(tuned))
    num = den = 0.0
    with torch.no_grad():
        for name, p0 in unique_named_parameters(base):
            a = p0.detach().double()
            num += float(((theirs[name].detach().to(a.device).double() - a) ** 2).sum())
            den += float((a ** 2).sum())
    return (num ** 0.5) / (den ** 0.5) if den > 0 else float("nan")
