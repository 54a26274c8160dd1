"""Named variants: overlays of a GRPO run config that turn the paper's GRPO into Dr. GRPO, DAPO, BNPO, GSPO, or
one of TRL 1.16's other losses (CISPO, SAPO, LUSPO, VESPO), as TRL 1.16 implements them (docs/grpo-variants.md).

A variant changes only the keys that define it; everything else (B, G, learning rate, lengths, optimizer)
stays the base GRPO config's. Where a paper's mechanism needs several optimizer steps per rollout batch
(importance ratios off 1, a clip or gate that acts), the preset sets them with ``grpo.mini_batches``, so it
is the mechanism that runs and not GRPO under another name: with one optimizer step per update TRL takes the
behaviour log-probabilities as the current ones, every ratio is exactly 1 and GSPO, CISPO, SAPO and VESPO
all train exactly as an on-policy GRPO or DAPO would. Those steps cost an old-policy forward per token
(:func:`esreason.grpo.plan.passes_per_token`), which the compute accounting counts.

Each preset's ``source`` gives, per value, the section or table it comes from, and what is left out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping


@dataclass(frozen=True)
class Variant:
    """One named variant of the GRPO comparator."""

    name: str
    """Method name in an experiment's ``methods`` list."""
    label: str
    """Row label in the report's tables."""
    overlay: Mapping[str, Any] = field(default_factory=dict)
    """Merged into the GRPO run config (nested keys, e.g. ``{"grpo": {"loss_type": "dapo"}}``)."""
    source: str = ""
    """Where each overlaid value comes from, and what the preset leaves out."""
    mechanism: str = ""
    """What must engage for the preset to be itself: 'off_policy' (importance ratios off 1 from the second
    mini-batch on), 'clip' (and the clip acts), or '' (it differs from GRPO on-policy)."""


#: Keys a preset that sets ``mini_batches`` clears, so a base config's ``mini_batch_size`` does not conflict.
_STEPS = {"mini_batch_size": None}

PRESETS: dict[str, Variant] = {v.name: v for v in (
    Variant("dr_grpo", "Dr. GRPO", {"grpo": {"loss_type": "dr_grpo", "standardize_advantages": False}},
            "Liu et al. 2025, 'Understanding R1-Zero-Like Training' (arXiv 2503.20783), Dr. GRPO: the "
            "per-response length normalisation and the std division of the advantage both removed (token sum / "
            "(responses x max_new_tokens); A = r - mean). Optimizer steps and KL: the base config's (the paper's "
            "own run settings are not part of the method)"),
    Variant("dapo", "DAPO", {"grpo": {"loss_type": "dapo", "epsilon": 0.2, "epsilon_high": 0.28, "beta": 0.0,
                                      "mask_truncated_completions": True, "soft_overlong_punishment": 0.2,
                                      **_STEPS, "mini_batches": 16}},
            "Yu et al. 2025, DAPO (arXiv 2503.14476): Clip-Higher 0.2 / 0.28 (Sec. 3.1; values Sec. 4.1), "
            "token-level loss (Sec. 3.3), no KL term (Sec. 2.3), overlong filtering (Sec. 3.4, TRL's "
            "mask_truncated_completions) and soft overlong punishment (Sec. 3.4, Eq. 13; Sec. 4.1: a 4,096-token "
            "cache at a 20,480-token limit = 0.2 of the limit), 16 optimizer steps per rollout batch (Sec. 4.1: "
            "512 prompts x 16 responses in mini-batches of 512 responses). Left out: dynamic sampling (Sec. 3.2, "
            "refilling the batch with groups whose rewards differ), which TRL 1.16 does not implement",
            "clip"),
    Variant("bnpo", "BNPO", {"grpo": {"loss_type": "bnpo"}},
            "TRL 1.16 loss_type 'bnpo' (TRL's own, no paper): token mean over each micro-batch; everything else "
            "the base config"),
    Variant("gspo", "GSPO", {"grpo": {"loss_type": "grpo", "importance_sampling_level": "sequence",
                                      "epsilon": 3.0e-4, "epsilon_high": 4.0e-4, "beta": 0.0,
                                      **_STEPS, "mini_batches": 4}},
            "Zheng et al. 2025, GSPO (arXiv 2507.18071 v2): one importance ratio per response, the geometric "
            "mean of its token ratios, clipped to 3e-4 / 4e-4 (Sec. 5.1), each rollout batch "
            "split into 4 mini-batches (Sec. 5.1), no KL term (TRL's paper index, after verl); 'grpo' "
            "aggregation (a mean over responses). Left out: Routing Replay (for mixture-of-experts "
            "models only)", "clip"),
    Variant("cispo", "CISPO", {"grpo": {"loss_type": "cispo", "epsilon_high": 5.0, **_STEPS, "mini_batches": 4}},
            "MiniMax-M1 (arXiv 2506.13585), CISPO: the importance-sampling weight clipped from above and "
            "detached, times A log pi, token-level normaliser (TRL loss_type 'cispo'); epsilon_max 5.0 as "
            "ScaleRL (arXiv 2510.13786) recommends (TRL 1.16 GRPOConfig.epsilon_high). 4 optimizer steps per "
            "rollout batch: ours (the weight acts only off-policy; the paper's count is not taken), as GSPO's. "
            "KL: the base config's. Left out: ScaleRL's batch-level reward scaling (our advantages are the "
            "paper's group ones) and fp32 LM head", "off_policy"),
    Variant("sapo", "SAPO", {"grpo": {"loss_type": "sapo", **_STEPS, "mini_batches": 4}},
            "Soft Adaptive Policy Optimization (arXiv 2511.20347): a sigmoid gate of temperature 1.0 (A > 0) / "
            "1.05 (A <= 0) in place of the hard clip, per token (TRL loss_type 'sapo'; the temperatures are TRL "
            "1.16's defaults, which TRL's paper index gives as the paper's). 4 optimizer steps per rollout batch: "
            "ours (the gate's slope at ratio 1 is GRPO's, so it acts only off-policy), as GSPO's. KL: the base "
            "config's", "off_policy"),
    Variant("luspo", "LUSPO", {"grpo": {"loss_type": "luspo", "importance_sampling_level": "sequence",
                                       "epsilon": 3.0e-4, "epsilon_high": 4.0e-4, "beta": 0.0,
                                       **_STEPS, "mini_batches": 4}},
            "Length-Unbiased Sequence Policy Optimization (arXiv 2602.05261; TRL loss_type 'luspo'): GSPO's "
            "clipped sequence ratio with each response's loss summed over its tokens (scaled by its length) "
            "instead of averaged; TRL requires sequence-level ratios. Clip range, mini-batches and KL: GSPO's "
            "(above), which LUSPO modifies; the paper's own values are not taken", "clip"),
    Variant("vespo", "VESPO", {"grpo": {"loss_type": "vespo", **_STEPS, "mini_batches": 4}},
            "Variational Sequence-Level Soft Policy Optimization (arXiv 2602.10693; TRL loss_type 'vespo'): a "
            "Gamma weight phi(w) = exp(lambda + k log w - lambda w) of the sequence ratio w (product of the "
            "token ratios), detached, times A log pi, token-level normaliser; k / lambda 2 / 3 for A >= 0 and "
            "3 / 2 for A < 0 (TRL 1.16's defaults). 4 optimizer steps per rollout batch: ours (phi(1) = 1, so "
            "it acts only off-policy), as GSPO's. KL: the base config's", "off_policy"),
)}


def preset(name: str) -> Variant | None:
    """The preset called ``name``, or None."""
    return PRESETS.get(name)


def describe(cfg: Any) -> dict[str, Any]:
    """The objective settings of a GRPO run config that tell the variants apart (for experiment.json and
    the report)."""
    from esreason.grpo.config import mini_batch_prompts

    g = cfg.grpo
    return {"loss_type": g.loss_type, "importance_sampling_level": g.importance_sampling_level,
            "epsilon": g.epsilon, "epsilon_high": g.epsilon if g.epsilon_high is None else g.epsilon_high,
            "beta": g.beta, "standardize_advantages": g.standardize_advantages,
            "mask_truncated_completions": g.mask_truncated_completions,
            "soft_overlong_punishment": g.soft_overlong_punishment,
            "optimizer_steps_per_update": cfg.train.batch_size // mini_batch_prompts(cfg)}


__all__ = ["PRESETS", "Variant", "describe", "preset"]
