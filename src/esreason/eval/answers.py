"""Task-specific answer normalisation for Maj@K (paper, appendix "Evaluation Metrics":
"Maj@K normalizes task-specific answers").

A vote key is a string (it is stored in ``responses.jsonl`` so a summary can be
recomputed from the file alone) or None for an abstention (failed extraction). By the
task's verifier family:

- ``math``: ``task.vote_key(extracted)``; keys that differ as strings are then grouped
  by equivalence, ``task.equivalent`` when the task sets one, else
  :func:`esreason.verifiers.math.math_equivalent` (fast exact path for plain numbers,
  math-verify in the worker pool otherwise).
- ``countdown``: ``"value:<exact value>"`` for a valid expression (each given number
  used once; :func:`esreason.verifiers.countdown.countdown_value`), so ``3*4+1`` and
  ``1+4*3`` vote together; an extracted but invalid expression votes as
  ``"expr:<text>"`` (it was answered, so it is not an abstention; it is wrong).
- ``mbpp``: ``"tests:<pass/fail vector>"`` such as ``"tests:1101"`` — two programs that
  pass the same tests vote together (:func:`esreason.verifiers.mbpp.mbpp_vote_key`);
  a response without a code block abstains.
- every other family: ``task.vote_key(extracted)``.
"""

from __future__ import annotations

from typing import Any, Callable

from esreason.tasks.base import Task
from esreason.verifiers.base import Verdict


def _as_key(value: Any) -> str | None:
    if value is None:
        return None
    return value if isinstance(value, str) else repr(value)


def vote_key(task: Task, verdict: Verdict, gold: Any) -> str | None:
    """The normalised answer sample ``verdict`` votes for on a problem of ``task`` (None = abstain)."""
    if task.verifier == "mbpp":
        from esreason.verifiers.mbpp import mbpp_vote_key

        vector = mbpp_vote_key(verdict)
        return None if vector is None else "tests:" + "".join("1" if x else "0" for x in vector)
    if verdict.extracted is None:
        return None
    if task.verifier == "countdown":
        from esreason.verifiers.countdown import countdown_value

        numbers = gold.get("numbers") if isinstance(gold, dict) else None
        value = countdown_value(verdict.extracted, numbers)
        if value is not None:
            return f"value:{value}"
        text = _as_key(task.vote_key(verdict.extracted))
        return None if text is None else f"expr:{text}"
    return _as_key(task.vote_key(verdict.extracted))


def equivalence(task: Task) -> Callable[[str, str], bool] | None:
    """How keys that are not string-equal are grouped for ``task`` (None: string equality only)."""
    if task.equivalent is not None:
        return task.equivalent
    if task.verifier == "math":
        from esreason.verifiers.math import math_equivalent

        return math_equivalent
    return None
