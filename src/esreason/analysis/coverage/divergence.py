"""The estimators of the Lemma 1 check: policy JS divergence of a population and the Fisher trace.

- :func:`response_logprobs`: teacher-forced next-token log-distributions along sampled responses;
- :func:`policy_js`: the per-response chain-rule estimate of KL(pi_own || pi_bar), whose mean
  estimates JS_pol_N(x);
- :func:`fisher_trace`: the score-function estimate of tr I_x(theta) and the projections of
  the score on the drawn directions.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch

def with_stop(ids: Sequence[int], max_new_tokens: int, eos: int) -> list[int]:
    """The response as a token sequence of the policy: the returned ids plus the stop token when
    the sampler stopped at EOS (it returns ids without it), i.e. when fewer than max_new_tokens came back."""
    out = list(ids)
    return out + [eos] if len(out) < max_new_tokens else out


def response_logprobs(model: Any, prompt_ids: Sequence[int], responses: Sequence[Sequence[int]],
                      temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Teacher-forced next-token log-distributions over the responses of one prompt.

    Returns (logp [R, T, V] float64 = log softmax(logits / temperature) at the step that
    emits response token t, mask [R, T] bool); rows are right-padded (causal attention
    makes the padding invisible to earlier positions)."""
    lp, r = len(prompt_ids), len(responses)
    t_max = max(1, max(len(y) for y in responses))
    dev = next(model.parameters()).device
    inp = torch.zeros((r, lp + t_max), dtype=torch.long)
    mask = torch.zeros((r, t_max), dtype=torch.bool)
    attn = torch.zeros((r, lp + t_max), dtype=torch.long)
    for k, y in enumerate(responses):
        row = list(prompt_ids) + list(y)
        inp[k, :len(row)] = torch.tensor(row)
        attn[k, :len(row)] = 1
        mask[k, :len(y)] = True
    with torch.no_grad():
        logits = model(input_ids=inp.to(dev), attention_mask=attn.to(dev)).logits  # [R, Lp+T, V]
    step_logits = logits[:, lp - 1:lp - 1 + t_max, :].to(torch.float64) / temperature  # [R, T, V]
    return torch.log_softmax(step_logits, dim=-1).cpu(), mask


def policy_js(logps: Sequence[torch.Tensor], tokens: torch.Tensor, mask: torch.Tensor,
              owner: torch.Tensor) -> torch.Tensor:
    """Per-response chain-rule estimate of KL(pi_own || pi_bar) for one prompt.

    logps[j]: [R, T, V] log-distributions of member j along every response; tokens [R, T]
    (padded), mask [R, T]; owner [R]: the member that sampled each response. With the
    posterior a_j(t) proportional to pi_j(y_<t) (uniform prior 1/N), the mixture's next-token
    distribution is pi_bar(v | y_<t) = sum_j a_j(t) pi_j(v | y_<t), and
    KL(pi_i || pi_bar) = E_{y~pi_i} sum_t KL(pi_i(.|y_<t) || pi_bar(.|y_<t)) exactly (chain
    rule), so each sampled response contributes a sum of exact per-step KLs over the
    vocabulary. Returns [R]; their mean over responses (M per member) estimates JS_pol_N(x)."""
    stacked = torch.stack(list(logps))  # [N, R, T, V]
    tok_lp = stacked.gather(-1, tokens.clamp(min=0)[None, :, :, None].expand(len(logps), -1, -1, 1))[..., 0]
    tok_lp = tok_lp * mask[None]  # [N, R, T]
    prefix = torch.cumsum(tok_lp, dim=-1) - tok_lp  # log pi_j(y_<t), [N, R, T]
    log_a = prefix - torch.logsumexp(prefix, dim=0, keepdim=True)  # log posterior, [N, R, T]
    log_bar = torch.logsumexp(log_a[..., None] + stacked, dim=0)  # [R, T, V]
    own = stacked[owner, torch.arange(len(owner))]  # [R, T, V]
    kl_t = (own.exp() * (own - log_bar)).sum(-1)  # [R, T]
    return (kl_t * mask).sum(-1)


def flat_params(params: Sequence[tuple[str, torch.nn.Parameter]]) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1).to(torch.float64) for _, p in params])


def fisher_trace(model: Any, params: Sequence[tuple[str, torch.nn.Parameter]], prompt_ids: Sequence[int],
                 responses: Sequence[Sequence[int]], temperature: float,
                 directions: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Score-function estimate of tr I_x(theta) = E_y ||grad log pi(y|x)||^2 from responses sampled at theta.

    For each response: log pi(y|x) = sum_t log softmax(logits/T)[y_t] (stop token included),
    backward, squared norm of the gradient over the ES-perturbed parameters (tied weights
    once), and its projections on ``directions`` [D, d] (offsets eps_i - eps_bar, used for
    the realised quadratic form of Appendix eq. app-local-js-expansion).
    Returns (sq_norms [M], projections [M, D])."""
    dev = next(model.parameters()).device
    sq, proj = [], []
    for y in responses:
        inp = torch.tensor([list(prompt_ids) + list(y)], dtype=torch.long, device=dev)
        lp = len(prompt_ids)
        model.zero_grad(set_to_none=True)
        logits = model(input_ids=inp).logits[0, lp - 1:lp - 1 + len(y)]  # [T, V]
        logp = torch.log_softmax(logits.to(torch.float64) / temperature, dim=-1)
        total = logp.gather(-1, torch.tensor(y, device=dev)[:, None]).sum()
        total.backward()
        g = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1).to(torch.float64)
                       for _, p in params]).cpu()
        sq.append(float(g @ g))
        proj.append((directions @ g).numpy())
    model.zero_grad(set_to_none=True)
    return np.asarray(sq), np.asarray(proj).reshape(len(responses), -1)


__all__ = ["fisher_trace", "flat_params", "policy_js", "response_logprobs", "with_stop"]
