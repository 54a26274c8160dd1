"""Scoring many responses at once: one call per batch for scorers that take lists.

A scorer is ``scorer(text, gold) -> Verdict``; one that also has ``score_batch(texts, golds)``
(TRL-style reward functions, :class:`esreason.verifiers.reward_functions.RewardFunctions`) is
called once over the whole list, so a user's reward function runs once per population member per
mini-batch, not once per sample.
"""

from __future__ import annotations

from typing import Any, Sequence

from esreason.verifiers.base import Verdict


def score_texts(scorer: Any, texts: Sequence[str], golds: Sequence[Any]) -> list[Verdict]:
    """Verdicts of ``texts[i]`` against ``golds[i]``, in order (one ``score_batch`` call when the
    scorer has one, else one call per item)."""
    if len(texts) != len(golds):
        raise ValueError(f"{len(texts)} texts for {len(golds)} golds")
    batch = getattr(scorer, "score_batch", None)
    if batch is None:
        return [scorer(t, g) for t, g in zip(texts, golds)]
    verdicts = list(batch(list(texts), list(golds)))
    if len(verdicts) != len(texts):
        raise RuntimeError(f"{type(scorer).__name__}.score_batch returned {len(verdicts)} verdicts for {len(texts)} texts")
    return verdicts


__all__ = ["score_texts"]
