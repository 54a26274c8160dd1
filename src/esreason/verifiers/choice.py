"""Multiple-choice verifier — the last ``\\boxed{}`` holds one choice letter.

Paper, appendix "Prompt Templates" (multiple-choice reasoning): "Put your final
choice letter inside \\boxed{}, e.g., \\boxed{C}". Used for CommonsenseQA (A–E) and
GPQA (A–D).

Gold formats accepted:

- a letter string, ``"B"`` — the valid set is the default ``A``–``E``;
- a mapping ``{"answer": "B", "choices": "ABCD"}`` — ``choices`` is a string of
  letters or a list of one-letter strings and sets the valid letters.

Extraction: the last box (:func:`esreason.verifiers.extract.last_boxed`); inside it,
``\\text{}``/``\\textbf{}``/``\\mathrm{}`` wrappers, ``$``, ``*``, whitespace, surrounding
brackets ``(B)``/``[B]`` and a trailing ``.``/``)``/``:`` are removed, and the rest
must be one letter (either case) from the valid set. ``\\boxed{(B) 42}`` or
``\\boxed{B and C}`` is not a letter: formatted, wrong, no extracted answer.

``formatted`` = a box with non-blank content exists; ``correct`` = the normalised
letter equals the gold letter. The vote key is the extracted (upper-case) letter.
"""

from __future__ import annotations

import re
from typing import Any

from esreason.errors import UserError
from esreason.verifiers.base import Verdict, reward_for
from esreason.verifiers.extract import last_boxed, strip_latex_wrappers

DEFAULT_CHOICES = "ABCDE"

_BRACKETS = re.compile(r"^[(\[{]\s*(.*?)\s*[)\]}]$")


def normalize_choice(content: str) -> str:
    """The box content reduced to its letter candidate (upper-case); may still be more than one letter."""
    t = strip_latex_wrappers(content, ("text", "textbf", "textrm", "mathrm", "mathbf", "mbox", "boxed", "fbox"))
    t = t.replace("$", "").replace("*", "").strip().rstrip(".:").strip()
    for _ in range(2):
        m = _BRACKETS.match(t)
        if m:
            t = m.group(1).strip()
    if len(t) == 2 and t[1] == ")":  # "B)"
        t = t[0]
    return t.upper()


def parse_gold(gold: Any) -> tuple[str, str]:
    """``(answer letter, valid letters)`` from a letter or ``{"answer", "choices"}``; UserError otherwise."""
    if isinstance(gold, dict):
        if "answer" not in gold:
            raise UserError(f"choice gold mapping needs an 'answer' key, got keys {sorted(gold)}")
        answer, choices = gold["answer"], gold.get("choices", DEFAULT_CHOICES)
        if not isinstance(choices, str):
            if not isinstance(choices, (list, tuple)) or not all(isinstance(c, str) for c in choices):
                raise UserError(f"choice gold 'choices' must be a string or a list of letters, got {choices!r}")
            choices = "".join(choices)
    else:
        answer, choices = gold, DEFAULT_CHOICES
    letters = choices.upper()
    if not letters or not all(c.isalpha() and len(c) == 1 for c in letters) or len(set(letters)) != len(letters):
        raise UserError(f"choice gold 'choices' must be distinct single letters, got {choices!r}")
    if not isinstance(answer, str) or answer.strip().upper() not in letters or len(answer.strip()) != 1:
        raise UserError(f"choice gold answer must be one letter of {letters!r}, got {answer!r}")
    return answer.strip().upper(), letters


class ChoiceScorer:
    """``score(response, gold) -> Verdict`` for multiple choice (picklable)."""

    def __init__(self, format_reward: float = 0.1) -> None:
        self.format_reward = float(format_reward)

    def __call__(self, response: str, gold: Any) -> Verdict:
        answer, letters = parse_gold(gold)
        box = last_boxed(response)
        if box is None or not box.strip():
            return Verdict(0.0, False, None, "no \\boxed{} answer" if box is None else "empty \\boxed{}",
                           formatted=False)
        letter = normalize_choice(box)
        if len(letter) != 1 or letter not in letters:
            return Verdict(reward_for(False, True, self.format_reward), False, None,
                           f"boxed {box.strip()!r} is not one letter of {letters}", formatted=True)
        ok = letter == answer
        return Verdict(reward_for(ok, True, self.format_reward), ok, letter,
                       "correct" if ok else f"chose {letter}, gold {answer}", formatted=True)


def make_scorer(format_reward: float = 0.1) -> ChoiceScorer:
    return ChoiceScorer(format_reward)
