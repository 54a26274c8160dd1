"""The verifier contract shared by training rewards and evaluation.

A verifier is a pure function ``score(response: str, gold) -> Verdict``. The
training reward follows the paper's appendix "Implementation-Level Training
Procedure": 1 for a verifier-correct response, ``format_reward`` (default 0.1)
for a response that follows the required final-answer format but is wrong, and 0
for a response that fails the format.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Protocol


@dataclass(frozen=True)
class Verdict:
    """Outcome of scoring one response.

    reward: training reward in [0, 1] (1 / format_reward / 0).
    correct: verifier-correct.
    extracted: the final answer as extracted from the response (task-normalised
        text), or None when extraction failed (an abstention for Maj@K).
    reason: short human-readable explanation ("correct", "no \\boxed{}", ...).
    formatted: the response followed the required final-answer format.
    extra: task-specific details (e.g. HotpotQA F1, MBPP per-test results).
    """

    reward: float
    correct: bool
    extracted: str | None
    reason: str
    formatted: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


class Scorer(Protocol):
    def __call__(self, response: str, gold: Any) -> Verdict: ...


def reward_for(correct: bool, formatted: bool, format_reward: float) -> float:
    """Paper's three-level training reward: 1 correct, format_reward formatted, 0 otherwise."""
    if correct:
        return 1.0
    return float(format_reward) if formatted else 0.0


ScorerFactory = Callable[..., Scorer]
