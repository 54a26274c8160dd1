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

Variants (``grpo.loss_type``, ``grpo.importance_sampling_level``; docs/grpo-variants.md): the same
clipped surrogate and KL term, aggregated as Dr. GRPO, DAPO or TRL's BNPO (:func:`aggregate`), with
one importance ratio per response for GSPO (:func:`log_importance_weights`). The advantages do not
depend on the variant: Dr. GRPO's unscaled advantage is ``standardize=False``.
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


CLIPPED_LOSSES = ("grpo", "dr_grpo", "dapo", "bnpo", "luspo")
"""TRL 1.16 losses built on the clipped surrogate; they differ in the aggregation (``grpo.loss_type``)."""
LOSS_TYPES = CLIPPED_LOSSES + ("cispo", "sapo", "vespo")
"""Every ``grpo.loss_type`` (TRL 1.16 ``GRPOConfig.loss_type``)."""
#: How each loss type aggregates its per-token losses (TRL 1.16 ``GRPOTrainer._compute_loss``).
AGGREGATION = {"grpo": "grpo", "dr_grpo": "dr_grpo", "dapo": "dapo", "bnpo": "bnpo", "luspo": "luspo",
               "cispo": "dapo", "sapo": "grpo", "vespo": "dapo"}
#: TRL 1.16's GRPOConfig defaults for SAPO's gate temperatures (A > 0, A <= 0) and VESPO's Gamma weight
#: (k, lambda for A >= 0 and for A < 0); :func:`esreason.grpo.trainer.build_trl_args` passes the same values.
SAPO_TEMPERATURES = (1.0, 1.05)
VESPO_K_LAMBDA = ((2.0, 3.0), (3.0, 2.0))
IMPORTANCE_LEVELS = ("token", "sequence")


@dataclass(frozen=True)
class LossParts:
    """The loss and its diagnostics. loss: scalar to minimise. kl: token mean of k3 (or None).
    clip_low / clip_high: fraction of tokens (token-level ratios) or of responses (sequence-level
    ratios, GSPO) where the lower / upper clip is active, as TRL logs ``clip_ratio/low_mean`` / ``high_mean``."""

    loss: torch.Tensor
    kl: torch.Tensor | None
    clip_low: torch.Tensor
    clip_high: torch.Tensor


def log_importance_weights(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor,
                           level: str = "token") -> torch.Tensor:
    """log rho: per token, [N, T] (PPO/GRPO), or per response, [N, 1]: the mean of the response's token log
    ratios, so rho_i = (prod_t pi_theta / pi_old)^(1/|y_i|) (GSPO's sequence ratio s_i, arXiv 2507.18071)."""
    log_ratio = logp - old_logp  # [N, T]
    if level == "token":
        return log_ratio
    if level == "sequence":
        maskf = mask.to(logp.dtype)
        return ((log_ratio * maskf).sum(-1) / maskf.sum(-1).clamp(min=1.0)).unsqueeze(-1)  # [N, 1]
    raise ValueError(f"importance_sampling_level must be one of {IMPORTANCE_LEVELS}, got {level!r}")


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, loss_type: str = "grpo", *,
              max_completion_length: int | None = None, num_items: float | torch.Tensor | None = None
              ) -> torch.Tensor:
    """The scalar loss of one batch from per-token losses (TRL 1.16 ``GRPOTrainer._compute_loss``).

    per_token: [N, T], or [N, 1] (one value per response, broadcast over its tokens); mask: [N, T].
    With ``m`` the mask and ``l`` the per-token loss:

    - ``grpo``: mean_i (sum_t m l / sum_t m) (per-response token mean, then the mean over responses; the paper);
    - ``dr_grpo``: sum_it m l / (N * max_completion_length) (a constant normaliser: Dr. GRPO);
    - ``bnpo``: sum_it m l / sum_it m (token mean over this batch);
    - ``dapo``: sum_it m l / num_items (default: this batch's tokens);
    - ``luspo``: mean_i (sum_t m l) (each response's token sum, so a response weighs its length: LUSPO).

    In a run, TRL accumulates micro-batches: per optimizer step, 'grpo' and 'dr_grpo' equal this function on
    the step's responses (micro-batches hold equally many responses); 'bnpo' is the mean over the micro-batches
    of this function on each; 'dapo' is this function on the step with ``num_items`` = the rollout batch's
    tokens / optimizer steps per update (TRL: num_items_in_batch / processes x accumulation / steps_per_generation).
    """
    maskf = mask.to(per_token.dtype)  # [N, T]
    masked = per_token * maskf  # [N, T]
    if loss_type == "grpo":
        return (masked.sum(-1) / maskf.sum(-1).clamp(min=1.0)).mean()
    if loss_type == "dr_grpo":
        if max_completion_length is None or max_completion_length < 1:
            raise ValueError("loss_type 'dr_grpo' needs max_completion_length >= 1")
        return masked.sum() / (per_token.size(0) * max_completion_length)
    if loss_type == "bnpo":
        return masked.sum() / maskf.sum().clamp(min=1.0)
    if loss_type == "dapo":
        n = maskf.sum() if num_items is None else torch.as_tensor(num_items, dtype=per_token.dtype)
        return masked.sum() / n.clamp(min=1.0)
    if loss_type == "luspo":
        return masked.sum(-1).mean()
    raise ValueError(f"loss_type must name an aggregation, one of {tuple(dict.fromkeys(AGGREGATION.values()))}, "
                     f"got {loss_type!r}")


def gamma_weight(log_ratio: torch.Tensor, mask: torch.Tensor, advantages: torch.Tensor) -> torch.Tensor:
    """VESPO's sequence weight phi(w) = exp(lambda + k log w - lambda w), w = exp(sum_t log rho_t) (a sum,
    not GSPO's mean; log rho clamped to [-20, 20], log w to [log 1e-8, 20]), k / lambda by the sign of A
    (:data:`VESPO_K_LAMBDA`); phi(1) = 1. Detached, as in TRL 1.16 ``get_gamma_weights``. Returns [N, 1]."""
    import math

    with torch.no_grad():
        seq = (torch.clamp(log_ratio, -20.0, 20.0) * mask).sum(-1, keepdim=True)  # [N, 1]
        log_w = torch.clamp(seq, math.log(1e-8), 20.0)
        nonneg = advantages.unsqueeze(1) >= 0  # [N, 1]
        (kp, lp), (kn, ln) = VESPO_K_LAMBDA
        k = torch.where(nonneg, torch.tensor(kp, dtype=log_w.dtype), torch.tensor(kn, dtype=log_w.dtype))
        lam = torch.where(nonneg, torch.tensor(lp, dtype=log_w.dtype), torch.tensor(ln, dtype=log_w.dtype))
        return torch.exp(lam + k * log_w - lam * torch.exp(log_w)).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)


def grpo_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, *,
              epsilon: float = 0.2, epsilon_high: float | None = None, beta: float = 0.0,
              ref_logp: torch.Tensor | None = None, kl_ratio_correction: bool = False, loss_type: str = "grpo",
              importance_sampling_level: str = "token", max_completion_length: int | None = None,
              num_items: float | torch.Tensor | None = None) -> LossParts:
    """The GRPO loss on a batch of responses (Eq. grpo-clipped-objective + beta * KL; the paper's with the
    defaults), and its variants: ``loss_type`` (the per-token loss and :func:`aggregate`: :data:`AGGREGATION`)
    and ``importance_sampling_level`` (:func:`log_importance_weights`; GSPO: 'sequence'). TRL 1.16's per-token
    losses: the clipped surrogate (:data:`CLIPPED_LOSSES`); 'cispo' -sg(min(rho, epsilon_high)) A log pi;
    'sapo' -sigmoid(tau (rho - 1)) 4 / tau A; 'vespo' -sg(phi(w)) A log pi (:func:`gamma_weight`).

    logp: [N, T] log pi_theta of the sampled tokens (differentiable); old_logp: [N, T]
    behaviour-policy log-probs; advantages: [N]; mask: [N, T] 1 on response tokens;
    ref_logp: [N, T] reference log-probs (needed when beta > 0). kl_ratio_correction
    multiplies k3 by the importance ratio (TRL's use_bias_correction_kl; per response with GSPO).
    """
    eps_high = epsilon if epsilon_high is None else epsilon_high
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"loss_type must be one of {LOSS_TYPES}, got {loss_type!r}")
    ratio = torch.exp(log_importance_weights(logp, old_logp, mask, importance_sampling_level))  # [N, T] or [N, 1]
    adv = advantages.unsqueeze(1).to(logp.dtype)  # [N, 1]
    if loss_type == "cispo":  # the weight clipped from above and detached; the gradient is A grad log pi
        per_token = -torch.clamp(ratio, max=eps_high).detach() * adv * logp  # [N, T]
    elif loss_type == "sapo":  # a smooth gate in place of the clip; its slope at rho = 1 is GRPO's
        pos, neg = SAPO_TEMPERATURES
        tau = torch.where(adv > 0, torch.tensor(pos, dtype=logp.dtype), torch.tensor(neg, dtype=logp.dtype))
        per_token = -torch.sigmoid(tau * (ratio - 1)) * 4 / tau * adv  # [N, T] or [N, 1]
    elif loss_type == "vespo":
        per_token = -gamma_weight(logp - old_logp, mask.to(logp.dtype), advantages.to(logp.dtype)) * adv * logp
    else:
        per_token = -torch.min(ratio * adv, torch.clamp(ratio, 1 - epsilon, 1 + eps_high) * adv)  # [N, T] or [N, 1]
    maskf = mask.to(logp.dtype)  # [N, T]
    kl_mean = None
    if beta != 0.0:
        if ref_logp is None:
            raise ValueError("beta > 0 needs ref_logp")
        kl = k3_kl(logp, ref_logp)  # [N, T]
        if kl_ratio_correction:
            kl = kl * ratio
        per_token = per_token + beta * kl  # [N, T]
        kl_mean = (kl * maskf).sum() / maskf.sum().clamp(min=1.0)
    loss = aggregate(per_token, mask, AGGREGATION[loss_type], max_completion_length=max_completion_length,
                     num_items=num_items)
    r = ratio.detach()
    if loss_type == "cispo":  # TRL's cispo_clip_ratio: weights above epsilon_high with A > 0
        low, high = torch.zeros_like(r * adv), ((r > eps_high) & (adv > 0)).to(logp.dtype)
    elif loss_type in CLIPPED_LOSSES:
        low = ((r < 1 - epsilon) & (adv < 0)).to(logp.dtype)  # [N, T] or [N, 1]
        high = ((r > 1 + eps_high) & (adv > 0)).to(logp.dtype)
    else:  # no clip (SAPO's gate, VESPO's weight)
        low = high = torch.zeros_like(r * adv)
    if r.size(1) == 1:  # one ratio per response: the fraction of responses
        clip_low, clip_high = low.mean(), high.mean()
    else:
        n_tok = maskf.sum().clamp(min=1.0)
        clip_low, clip_high = (low * maskf).sum() / n_tok, (high * maskf).sum() / n_tok
    return LossParts(loss, kl_mean, clip_low, clip_high)


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


__all__ = ["AGGREGATION", "CLIPPED_LOSSES", "IMPORTANCE_LEVELS", "LOSS_TYPES", "LossParts", "SAPO_TEMPERATURES",
           "VESPO_K_LAMBDA", "aggregate", "clipped_surrogate", "completion_logprobs", "gamma_weight",
           "group_advantages", "grpo_loss", "k3_kl", "log_importance_weights"]
