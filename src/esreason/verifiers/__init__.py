"""Task verifiers: ``get(name)(response, gold) -> Verdict``.

Names and gold formats (see each module's docstring):

- ``math``      gold: str    last ``\\boxed{}``; equivalence by math-verify in a worker pool
- ``choice``    gold: letter last ``\\boxed{}``, one letter from the valid set
- ``hotpotqa``  gold: str    ``<answer>`` tags, official normalisation, EM (+F1)
- ``countdown`` gold: {"target": int, "numbers": [int]}  AST walker over Fractions
- ``mbpp``      gold: {"tests": [str], "setup": str}     sandboxed execution
"""

from __future__ import annotations

import importlib

from esreason.errors import UserError
from esreason.verifiers.base import Scorer, Verdict, reward_for

_MODULES = {
    "math": "esreason.verifiers.math",
    "choice": "esreason.verifiers.choice",
    "hotpotqa": "esreason.verifiers.hotpotqa",
    "countdown": "esreason.verifiers.countdown",
    "mbpp": "esreason.verifiers.mbpp",
}

NAMES = tuple(sorted(_MODULES))


def get(name: str, *, format_reward: float = 0.1) -> Scorer:
    """Return the scorer for verifier ``name``.

    Each verifier module exposes ``make_scorer(format_reward: float) -> Scorer``.
    """
    if name not in _MODULES:
        raise UserError(f"unknown verifier {name!r}; known: {', '.join(NAMES)}")
    module = importlib.import_module(_MODULES[name])
    return module.make_scorer(format_reward=format_reward)


__all__ = ["NAMES", "Scorer", "Verdict", "get", "reward_for"]
