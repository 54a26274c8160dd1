"""Named GRPO variants: overlays of a GRPO run config that turn the paper's GRPO into Dr. GRPO, DAPO,
BNPO or GSPO as TRL 1.16 implements them (docs/grpo-variants.md).

A variant changes only the keys that define it; everything else (B, G, learning rate, lengths,
optimizer) stays the base GRPO config's, so an experiment's variants differ from its GRPO in the
objective alone and share its FLOP budget (FLOPs_GRPO = 8 T B G P L does not depend on the loss).
What TRL 1.16 does not implement is left out and said so: DAPO's dynamic sampling (refilling
groups whose rewards are all equal) and its soft overlong punishment (a reward penalty).
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
    """Where each overlaid value comes from."""


PRESETS: dict[str, Variant] = {v.name: v for v in (
    Variant("dr_grpo", "Dr. GRPO", {"grpo": {"loss_type": "dr_grpo", "standardize_advantages": False}},
            "Liu et al. 2025, 'Understanding R1-Zero-Like Training' (arXiv 2503.20783): the per-response length "
            "normalisation and the std division of the advantage both removed (token sum / (responses x "
            "max_new_tokens); A = r - mean); KL as the base config"),
    Variant("dapo", "DAPO", {"grpo": {"loss_type": "dapo", "epsilon": 0.2, "epsilon_high": 0.28, "beta": 0.0,
                                      "mask_truncated_completions": True}},
            "Yu et al. 2025, DAPO (arXiv 2503.14476): Clip-Higher 0.2 / 0.28 (Sec. 3.1; verl's DAPO recipe "
            "clip_ratio_low / clip_ratio_high), token-level loss (Sec. 3.3), no KL term (Sec. 2.3), overlong "
            "filtering (Sec. 3.4, TRL's mask_truncated_completions); dynamic sampling and the soft overlong "
            "punishment are not in TRL 1.16 and not applied"),
    Variant("bnpo", "BNPO", {"grpo": {"loss_type": "bnpo"}},
            "TRL 1.16 loss_type 'bnpo': token mean over each micro-batch; everything else the base config"),
    Variant("gspo", "GSPO", {"grpo": {"loss_type": "grpo", "importance_sampling_level": "sequence",
                                      "epsilon": 3.0e-4, "epsilon_high": 4.0e-4, "beta": 0.0}},
            "Zheng et al. 2025, GSPO (arXiv 2507.18071): one importance ratio per response, clip 3e-4 / 4e-4 "
            "(its Sec. 5.1, as TRL's paper index configures it), no KL term; it differs from GRPO only "
            "off-policy, i.e. with several optimizer steps per update (grpo.mini_batch_size < train.batch_size)"),
)}


def preset(name: str) -> Variant | None:
    """The preset called ``name``, or None."""
    return PRESETS.get(name)


def describe(cfg: Any) -> dict[str, Any]:
    """The objective settings of a GRPO run config that tell the variants apart (for experiment.json and
    the report)."""
    g = cfg.grpo
    return {"loss_type": g.loss_type, "importance_sampling_level": g.importance_sampling_level,
            "epsilon": g.epsilon, "epsilon_high": g.epsilon if g.epsilon_high is None else g.epsilon_high,
            "beta": g.beta, "standardize_advantages": g.standardize_advantages,
            "mask_truncated_completions": g.mask_truncated_completions}


__all__ = ["PRESETS", "Variant", "describe", "preset"]
