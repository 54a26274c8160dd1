"""Reference implementation of the paper's GRPO objective (torch only, no TRL).

This is the specification our TRL wiring is tested against (tests/test_grpo_objective.py
checks TRL's loss and gradients against :func:`grpo_loss` on a fixed batch, and the
advantages TRL trains on against :func:`group_advantages`).

Paper §"GRPO Fine-tuning":

- Eq. grpo-group-advantage: A_i = (r_i - mean_G r) / s_G, with s_G the group's
  *population* standard deviation (ddof 0). The paper defines A_i only for s_G > 0; a
  group whose rewards are all equal carries no signal, and we set A_i = 0 there, decided
  by exact equality of the rewards (no epsilon in the denominator, unlike TRL's
  ``std + 1e-4``).
- Eq. grpo-clipped-objective:
  L = -1/G sum_i 1/T_i sum_t min(rho_it A_i, clip(rho_it, 1 - eps, 1 + eps) A_i),
  rho_it = pi_theta(y_it | x, y_i<t) / pi_old(y_it | x, y_i<t): a per-response mean over
  tokens, then a mean over responses (TRL ``loss_type="grpo"``; not the token-level mean
  of DAPO, TRL's default). Over a batch of several groups of equal size G, the mean of the
  group means is the mean over all responses.
- KL to the reference model (appendix table: coefficient 0.001; the equation omits it).
  We add beta * k3 per token inside the per-response mean, k3 = exp(ref - logp) -
  (ref - logp) - 1 (Schulman's low-variance estimator; verl's ``low_var_kl`` without its
  [-10, 10] clamp), as a loss term rather than a reward penalty, as verl's GRPO recipe does.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def group_advantages(rewards: torch.Tensor, group_size: int, *, standardize: bool = True) -> torch.Tensor:
    """Group-relative advantages (paper Eq. grpo-group-advantage), float64.

    rewards: [B * G] with the G responses of each prompt contiguous (TRL's layout). A NaN reward is
        an unscorable response (every reward function returned None, TRL's convention): it is left
        out of its group's mean and std and gets advantage 0, as in TRL.
    standardize: divide by the population std (ddof 0); False gives r_i - mean only.
    Returns [B * G]; groups with all-equal (scored) rewards get exactly 0.
    """
    if rewards.dim() != 1 or rewards.numel() % group_size != 0:
        raise ValueError(f"rewards must be 1-D with a multiple of group_size={group_size} entries, "
                         f"got shape {tuple(rewards.shape)}")
    if torch.isinf(rewards).any():
        raise ValueError("rewards must be finite (NaN marks an unscorable response)")
    r = rewards.detach().to(torch.float64).reshape(-1, group_size)  # [B, G]
    scored = ~torch.isnan(r)  # [B, G]
    count = scored.sum(dim=1, keepdim=True).clamp(min=1)  # [B, 1]
    filled = torch.where(scored, r, torch.zeros_like(r))  # [B, G]
    first = torch.gather(filled, 1, scored.to(torch.int64).argmax(dim=1, keepdim=True))  # a scored reward per group
    constant = (torch.where(scored, r, first) == first).all(dim=1, keepdim=True)  # [B, 1]: s_G = 0 exactly
    centred = torch.where(scored, r - filled.sum(dim=1, keepdim=True) / count, torch.zeros_like(r))  # [B, G]
    if standardize:
        std = (centred.pow(2).sum(dim=1, keepdim=True) / count).sqrt()  # [B, 1] population std, ddof 0
        centred = centred / torch.where(constant, torch.ones_like(std), std)
    return torch.where(constant | ~scored, torch.zeros_like(centred), centred).reshape(-1)


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(pi_theta || pi_ref): exp(d) - d - 1 with d = ref - logp. [N, T]."""
    d = ref_logp - logp
    return torch.exp(d) - d - 1


def clipped_surrogate(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
                      epsilon: float, epsilon_high: float | None = None) -> torch.Tensor:
    """Per-token PPO-clip loss -min(rho A, clip(rho, 1-eps, 1+eps_high) A). logp/old_logp [N, T],
    advantages [N] (one per response, broadcast over its tokens). Returns [N, T]."""
    eps_high = epsilon if epsilon_high is None else epsilon_high
    ratio = torch.exp(logp - old_logp)  # [N, T]
    adv = advantages.unsqueeze(1).to(logp.dtype)  # [N, 1]
    clipped = torch.clamp(ratio, 1 - epsilon, 1 + eps_high)
    return -torch.min(ratio * adv, clipped * adv)


@dataclass(frozen=True)
class LossParts:
    """The loss and its diagnostics. loss: scalar to minimise. kl: token mean of k3 (or None).
    clip_low / clip_high: fraction of tokens where the lower / upper clip is active."""

    loss: torch.Tensor
    kl: torch.Tensor | None
    clip_low: torch.Tensor
    clip_high: torch.Tensor


def grpo_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, *,
              epsilon: float = 0.2, epsilon_high: float | None = None, beta: float = 0.0,
              ref_logp: torch.Tensor | None = None, kl_ratio_correction: bool = False) -> LossParts:
    """The paper's GRPO loss on a batch of responses (Eq. grpo-clipped-objective + beta * KL).

    logp: [N, T] log pi_theta of the sampled tokens (differentiable); old_logp: [N, T]
    behaviour-policy log-probs; advantages: [N]; mask: [N, T] 1 on response tokens;
    ref_logp: [N, T] reference log-probs (needed when beta > 0). kl_ratio_correction
    multiplies k3 by the importance ratio (TRL's use_bias_correction_kl).
    """
    maskf = mask.to(logp.dtype)  # [N, T]
    per_token = clipped_surrogate(logp, old_logp, advantages, epsilon, epsilon_high)  # [N, T]
    kl_mean = None
    if beta != 0.0:
        if ref_logp is None:
            raise ValueError("beta > 0 needs ref_logp")
        kl = k3_kl(logp, ref_logp)  # [N, T]
        if kl_ratio_correction:
            kl = kl * torch.exp(logp - old_logp)
        per_token = per_token + beta * kl
        kl_mean = (kl * maskf).sum() / maskf.sum().clamp(min=1.0)
    per_response = (per_token * maskf).sum(dim=1) / maskf.sum(dim=1).clamp(min=1.0)  # [N]: 1/T_i sum_t
    ratio = torch.exp(logp - old_logp).detach()
    adv = advantages.unsqueeze(1)
    eps_high = epsilon if epsilon_high is None else epsilon_high
    n_tok = maskf.sum().clamp(min=1.0)
    clip_low = (((ratio < 1 - epsilon) & (adv < 0)).to(logp.dtype) * maskf).sum() / n_tok
    clip_high = (((ratio > 1 + eps_high) & (adv > 0)).to(logp.dtype) * maskf).sum() / n_tok
    return LossParts(per_response.mean(), kl_mean, clip_low, clip_high)


def completion_logprobs(model: torch.nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                        completion_ids: torch.Tensor, completion_mask: torch.Tensor,
                        temperature: float = 1.0) -> torch.Tensor:
    """log softmax(logits / temperature) of the completion tokens under ``model`` (full logits).

    prompt_ids/prompt_mask: [N, P] left-padded; completion_ids/completion_mask: [N, C]
    right-padded. Returns [N, C] (values at masked positions are meaningless). Positions
    follow the model's default for the given attention mask, as in TRL's training forward.
    """
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)  # [N, P + C]
    attention = torch.cat([prompt_mask, completion_mask], dim=1)  # [N, P + C]
    logits = model(input_ids=input_ids, attention_mask=attention).logits  # [N, P + C, V]
    c = completion_ids.size(1)
    logits = logits[:, -c - 1:-1, :].float() / temperature  # [N, C, V]: position t predicts token t + 1
    logps = torch.log_softmax(logits, dim=-1)
    return logps.gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)  # [N, C]


__all__ = ["LossParts", "clipped_surrogate", "completion_logprobs", "group_advantages", "grpo_loss", "k3_kl"]
