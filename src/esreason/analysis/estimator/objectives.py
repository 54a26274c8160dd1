"""Scalar objectives of the ES–ZO estimator diagnostic (paper appendix "ES–ZO Estimator Equivalence").

Every objective maps the model's current weights to one scalar *per observation*
(a prompt/seed pair or a supervised example); the diagnostic evaluates it at
theta + sigma*eps, theta and theta - sigma*eps and pools the observations.

- :func:`rollout_rewards`: regenerated-rollout reward. Responses are sampled at the
  current weights and scored by the task verifier (1 correct / ``format_reward`` / 0).
- :func:`supervised_ce`: fixed-batch supervised cross-entropy. One candidate: the mean
  token negative log-likelihood of the gold completion (LM cross-entropy); several
  candidates (SST-2 with a verbaliser): the classification cross-entropy
  -log softmax_k(log p(candidate_k | prompt))[label], as in MeZO's prompt-based SST-2.
- :func:`fixed_rollout_objectives`: responses sampled once at the centre and frozen,
  rescored under the current weights: mean token log-probability, policy sequence
  loss and GRPO surrogate (definitions in :class:`FixedRollouts` and docs/estimator.md).

All log-probabilities are log softmax(logits) at temperature 1 (the model's own
distribution), computed in float32 and accumulated in float64.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch

from esreason.backends.base import SamplingParams
from esreason.backends.sampling import Sampler
from esreason.grpo.objective import clipped_surrogate, group_advantages


@dataclass(frozen=True)
class SupervisedExample:
    """One fixed-batch example: prompt token ids, candidate completions (token ids), gold index.

    One candidate: the objective is the LM cross-entropy of that completion.
    Several: the classification cross-entropy over the candidates (label = gold index).
    """

    prompt_ids: tuple[int, ...]
    candidates: tuple[tuple[int, ...], ...]
    label: int = 0


def _device(model: Any) -> torch.device:
    return next(model.parameters()).device


@torch.inference_mode()
def completion_logprobs(model: Any, pairs: Sequence[tuple[Sequence[int], Sequence[int]]], *,
                        batch_size: int = 16, pad_id: int = 0) -> list[np.ndarray]:
    """log p(completion_t | prompt, completion_<t) for each (prompt ids, completion ids) pair.

    Rows are right-padded (positions 0..L-1 on real tokens, the causal mask keeps real
    tokens from seeing padding), so no position bookkeeping is needed. Returns, per pair,
    a float64 array [len(completion)]. Batches are formed in the given order, so the same
    pairs at the same weights give bit-identical values.
    """
    dev = _device(model)
    out: list[np.ndarray] = []
    for start in range(0, len(pairs), batch_size):
        chunk = pairs[start:start + batch_size]
        seqs = [list(p) + list(c) for p, c in chunk]
        width = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)  # [B, L]
        mask = torch.zeros((len(seqs), width), dtype=torch.long)  # [B, L]
        for j, s in enumerate(seqs):
            ids[j, :len(s)] = torch.tensor(s, dtype=torch.long)
            mask[j, :len(s)] = 1
        logits = model(input_ids=ids.to(dev), attention_mask=mask.to(dev)).logits  # [B, L, V]
        for j, (p, c) in enumerate(chunk):
            if not c:
                out.append(np.zeros(0, dtype=np.float64))
                continue
            lo = len(p) - 1  # position lo predicts the first completion token
            rows = torch.log_softmax(logits[j, lo:lo + len(c)].float(), dim=-1)  # [C, V] fp32
            target = torch.tensor(list(c), dtype=torch.long, device=rows.device)  # [C]
            lp = rows.gather(-1, target.unsqueeze(-1)).squeeze(-1)  # [C]
            out.append(lp.double().cpu().numpy())
    return out


def supervised_ce(model: Any, examples: Sequence[SupervisedExample], *, batch_size: int = 16,
                  pad_id: int = 0) -> np.ndarray:
    """Per-example cross-entropy of the fixed batch, float64 [len(examples)] (a loss: lower is better)."""
    pairs: list[tuple[tuple[int, ...], tuple[int, ...]]] = []
    for ex in examples:
        pairs += [(ex.prompt_ids, cand) for cand in ex.candidates]
    logps = completion_logprobs(model, pairs, batch_size=batch_size, pad_id=pad_id)
    out = np.zeros(len(examples), dtype=np.float64)
    k = 0
    for i, ex in enumerate(examples):
        scores = logps[k:k + len(ex.candidates)]
        k += len(ex.candidates)
        if len(ex.candidates) == 1:
            out[i] = -float(scores[0].mean())  # LM cross-entropy: mean token NLL of the gold completion
        else:
            s = np.array([float(x.sum()) for x in scores])  # [K] log p(candidate_k | prompt)
            out[i] = -(s[ex.label] - np.logaddexp.reduce(s))  # -log softmax over candidates
    return out


def rollout_rewards(sampler: Sampler, prompts: Sequence[str], golds: Sequence[Any], scorer: Any,
                    params: SamplingParams) -> tuple[np.ndarray, list[str]]:
    """Regenerated-rollout reward: sample one response per row, score it; float64 [rows] and the texts."""
    gen = sampler.generate(list(prompts), params)
    rewards = np.array([scorer(text, gold).reward for text, gold in zip(gen.texts, golds)], dtype=np.float64)
    return rewards, gen.texts


@dataclass(frozen=True)
class FixedRollouts:
    """Responses sampled once at the centre, frozen, rescored at perturbed weights.

    pairs: (prompt ids, response ids) per response, rows grouped by prompt: the
        ``group_size`` responses of prompt p are rows p*G .. p*G+G-1.
    advantages: [rows] float64 GRPO group advantages of the centre rewards
        (paper Eq. grpo-group-advantage; 0 for all-equal groups).
    old_logps: per row, the centre's token log-probs (pi_old of the GRPO ratio).
    rewards: [rows] the verifier rewards of the responses.

    Objectives per response y_i with T_i tokens (EOS included when the response ended there):
    - mean token log-probability: (1/T_i) sum_t log pi(y_it | x, y_i<t)
    - policy sequence loss: -log pi(y_i | x) = -sum_t log pi(y_it | x, y_i<t)
    - GRPO surrogate (a loss): -(1/T_i) sum_t min(rho_it A_i, clip(rho_it, 1-e, 1+e) A_i),
      rho_it = pi(y_it | .) / pi_old(y_it | .), pi_old = the centre, e = ``epsilon``.
    """

    pairs: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]
    group_size: int
    advantages: np.ndarray
    old_logps: tuple[np.ndarray, ...]
    rewards: np.ndarray
    epsilon: float = 0.2


FIXED_OBJECTIVES = ("logprob", "seqloss", "grpo")


def build_fixed_rollouts(model: Any, sampler: Sampler, prompts: Sequence[str], golds: Sequence[Any],
                         scorer: Any, group_size: int, params: SamplingParams, *, epsilon: float = 0.2,
                         batch_size: int = 16, pad_id: int = 0) -> FixedRollouts:
    """Sample ``group_size`` responses per prompt at the current (centre) weights and freeze them.

    Rows are prompt-major: each prompt is repeated ``group_size`` times in one sampler call,
    so every response has its own sampling stream (row of the call). The EOS token is
    appended to a response that stopped before ``params.max_new_tokens`` (it stopped at EOS).
    """
    tok = sampler.tokenizer
    rows = [p for p in prompts for _ in range(group_size)]
    row_golds = [g for g in golds for _ in range(group_size)]
    gen = sampler.generate(rows, params)
    rewards = np.array([scorer(t, g).reward for t, g in zip(gen.texts, row_golds)], dtype=np.float64)
    prompt_ids = tok(list(prompts), add_special_tokens=False)["input_ids"]
    eos = sampler.eos_ids[0] if sampler.eos_ids else None
    pairs = []
    for i, resp in enumerate(gen.token_ids):
        ids = list(resp) + ([eos] if eos is not None and len(resp) < params.max_new_tokens else [])
        pairs.append((tuple(prompt_ids[i // group_size]), tuple(ids)))
    adv = group_advantages(torch.tensor(rewards, dtype=torch.float64), group_size).numpy()  # [rows]
    old = completion_logprobs(model, pairs, batch_size=batch_size, pad_id=pad_id)
    return FixedRollouts(pairs=tuple(pairs), group_size=group_size, advantages=adv, old_logps=tuple(old),
                         rewards=rewards, epsilon=epsilon)


def fixed_rollout_objectives(model: Any, fixed: FixedRollouts, *, batch_size: int = 16,
                             pad_id: int = 0) -> dict[str, np.ndarray]:
    """The three fixed-rollout objectives at the current weights: {name: float64 [rows]}."""
    logps = completion_logprobs(model, list(fixed.pairs), batch_size=batch_size, pad_id=pad_id)
    n = len(logps)
    mean_lp = np.zeros(n, dtype=np.float64)
    seq_loss = np.zeros(n, dtype=np.float64)
    grpo = np.zeros(n, dtype=np.float64)
    for i, (lp, old) in enumerate(zip(logps, fixed.old_logps)):
        if lp.size == 0:
            continue  # an empty response (prompt filled the context) contributes 0 everywhere
        mean_lp[i] = lp.mean()
        seq_loss[i] = -lp.sum()
        per_tok = clipped_surrogate(torch.from_numpy(lp)[None], torch.from_numpy(old)[None],
                                    torch.tensor([fixed.advantages[i]], dtype=torch.float64),
                                    fixed.epsilon)  # [1, T_i]
        grpo[i] = float(per_tok.mean())
    return {"logprob": mean_lp, "seqloss": seq_loss, "grpo": grpo}


__all__ = ["FIXED_OBJECTIVES", "FixedRollouts", "SupervisedExample", "build_fixed_rollouts",
           "completion_logprobs", "fixed_rollout_objectives", "rollout_rewards", "supervised_ce"]
