"""Choosing the next token: greedy, temperature + nucleus (top-p) sampling, and entropy.

The paper samples at temperature 0.6 in evaluation (appendix "Evaluation Configuration";
greedy = temperature 0 for the one-sample Easy protocol) and tracks the token-level
entropy of the policy (section "Entropy Collapse", ``H(s) = -sum_a p_a log p_a``). It does
not state a top-p; ``top_p=1`` (no truncation) is the default of ``SamplingParams``. This module holds that arithmetic, separate from the
decode loop in :mod:`esreason.backends.sampling`.

Sampling is by inversion: the caller supplies one uniform ``u`` in [0, 1) per row and the
token is the first index whose cumulative probability exceeds ``u`` times the kept mass.
Drawing the uniforms from a seeded CPU generator (rather than ``torch.multinomial`` on the
model's device) makes the choice reproducible and identical on CPU and GPU for equal
logits, and couples members that share a sampling seed (ES's common random numbers): a
small change of the distribution changes the chosen token only when ``u`` falls near a
boundary.
"""

from __future__ import annotations

import torch


def scaled_log_probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """log softmax(logits / temperature) in float32.

    logits: [B, V] any float dtype -> [B, V] float32. The row maximum is subtracted before
    dividing, so a tiny temperature cannot overflow to inf/inf = NaN.
    """
    z = logits.float()
    z = (z - z.amax(dim=-1, keepdim=True)) / temperature
    return torch.log_softmax(z, dim=-1)


def entropy(log_probs: torch.Tensor) -> torch.Tensor:
    """Entropy in nats of each row's distribution: [B, V] log-probs -> [B] float32.

    ``torch.special.entr`` defines 0 * log 0 = 0, so tokens with zero probability
    (-inf logits, masked vocabularies) contribute nothing instead of NaN.
    """
    return torch.special.entr(log_probs.exp()).sum(dim=-1)


def greedy(logits: torch.Tensor) -> torch.Tensor:
    """argmax per row ([B, V] -> [B] int64); ties go to the lowest id, as in HF ``generate``."""
    return logits.argmax(dim=-1)


def sample(log_probs: torch.Tensor, top_p: float, uniforms: torch.Tensor) -> torch.Tensor:
    """Draw one token per row from softmax restricted to the nucleus.

    log_probs: [B, V] float32 (from :func:`scaled_log_probs`).
    top_p: nucleus mass in (0, 1]. The nucleus is the smallest set of most probable tokens
        whose mass is >= top_p; it always holds at least the most probable token. Ties in
        probability are ordered by the (stable) sort, i.e. by lower id first. With
        ``top_p >= 1`` no sort is done and the full distribution is inverted in vocabulary
        order (a different but equally valid coupling of ``u`` to tokens).
    uniforms: [B] values in [0, 1), on any device.
    Returns [B] int64 token ids.
    """
    probs = log_probs.exp()  # [B, V]
    u = uniforms.to(device=probs.device, dtype=torch.float32).unsqueeze(-1)  # [B, 1]
    if top_p >= 1.0:
        cum = probs.cumsum(dim=-1)  # [B, V]
        idx = torch.searchsorted(cum, u * cum[:, -1:], right=True)  # [B, 1]
        return idx.clamp_(max=probs.shape[-1] - 1).squeeze(-1)
    sorted_p, order = probs.sort(dim=-1, descending=True, stable=True)  # [B, V] each
    cum = sorted_p.cumsum(dim=-1)  # [B, V]
    # Keep token j while the mass strictly before it is < top_p (so the first is always kept).
    keep = (cum - sorted_p) < top_p  # [B, V] bool, a prefix of each row
    kept_p = sorted_p * keep
    kept_cum = kept_p.cumsum(dim=-1)  # [B, V]
    n_kept = keep.sum(dim=-1, keepdim=True).clamp_(min=1)  # [B, 1]; >= 1 even for NaN rows
    pos = torch.searchsorted(kept_cum, u * kept_cum[:, -1:], right=True)  # [B, 1]
    pos = torch.minimum(pos, n_kept - 1)  # rounding at the top end stays inside the nucleus
    return order.gather(-1, pos).squeeze(-1)
