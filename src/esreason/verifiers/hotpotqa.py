"""HotpotQA verifier — ``<answer>`` tags, official normalisation, exact match (+ F1).

Paper, appendix "Prompt Templates" (open question answering): "Keep the final
answer short, and put it inside <answer> </answer> tags". The metric is HotpotQA's
official answer evaluation (Yang et al. 2018, ``hotpot_evaluate_v1.py``), written
from its description:

- normalisation: lower-case, remove punctuation, remove the articles a/an/the,
  collapse whitespace (:func:`normalize_answer`, also the Maj@K vote key);
- exact match = normalised strings equal — this is ``correct``;
- token F1 over normalised whitespace tokens, except that F1 is 0 when either
  normalised side is ``yes``, ``no`` or ``noanswer`` and the two differ. It is
  reported in ``extra["f1"]`` (and ``extra["em"]``) and in the reason; it does not
  change the reward, which stays 1 / format_reward / 0 like every task.

Gold formats: a string, or a list of acceptable strings (aliases; EM and F1 take
the best alias). Extraction: the last closed ``<answer>...</answer>`` block
(:func:`esreason.verifiers.extract.last_answer_block`). ``formatted`` = that block
exists and is not blank after stripping.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from typing import Any

from esreason.errors import UserError
from esreason.verifiers.base import Verdict, reward_for
from esreason.verifiers.extract import last_answer_block

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = frozenset(string.punctuation)
_SPECIAL = frozenset({"yes", "no", "noanswer"})


def normalize_answer(s: str) -> str:
    """Official HotpotQA/SQuAD answer normalisation (the Maj@K vote key)."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in _PUNCT)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def f1_score(prediction: str, gold: str) -> float:
    """Official token F1 between two raw answers, with the yes/no/noanswer rule."""
    p, g = normalize_answer(prediction), normalize_answer(gold)
    if (p in _SPECIAL or g in _SPECIAL) and p != g:
        return 0.0
    p_tokens, g_tokens = p.split(), g.split()
    same = sum((Counter(p_tokens) & Counter(g_tokens)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(p_tokens), same / len(g_tokens)
    return 2 * precision * recall / (precision + recall)


def exact_match(prediction: str, gold: str) -> bool:
    return normalize_answer(prediction) == normalize_answer(gold)


def _golds(gold: Any) -> list[str]:
    if isinstance(gold, str):
        golds = [gold]
    elif isinstance(gold, (list, tuple)) and gold and all(isinstance(g, str) for g in gold):
        golds = list(gold)
    else:
        raise UserError(f"hotpotqa gold must be a string or a non-empty list of strings, got {gold!r}")
    if not any(g.strip() for g in golds):
        raise UserError("hotpotqa gold answer is empty")
    return golds


class HotpotQAScorer:
    """``score(response, gold: str | list[str]) -> Verdict`` (picklable)."""

    def __init__(self, format_reward: float = 0.1) -> None:
        self.format_reward = float(format_reward)

    def __call__(self, response: str, gold: Any) -> Verdict:
        golds = _golds(gold)
        block = last_answer_block(response)
        if block is None or not block.strip():
            return Verdict(0.0, False, None, "no <answer> block" if block is None else "empty <answer> block",
                           formatted=False, extra={"em": 0.0, "f1": 0.0})
        pred = block.strip()
        em = any(exact_match(pred, g) for g in golds)
        f1 = max(f1_score(pred, g) for g in golds)
        reason = f"{'exact match' if em else 'no exact match'} (F1 {f1:.3f})"
        return Verdict(reward_for(em, True, self.format_reward), em, pred, reason, formatted=True,
                       extra={"em": float(em), "f1": f1})


def make_scorer(format_reward: float = 0.1) -> HotpotQAScorer:
    return HotpotQAScorer(format_reward)
