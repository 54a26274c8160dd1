"""Reward functions in TRL's signature: they run unchanged under esreason's ES, its GRPO comparator
(TRL's GRPOTrainer) and its Pass@K evaluation."""

import re

BOXED = re.compile(r"\\boxed\{([^}]*)\}")


def final_answer(text: str) -> str | None:
    """The last \\boxed{...} of a completion, or None."""
    found = BOXED.findall(text)
    return found[-1].strip() if found else None


def _text(completion) -> str:
    # TRL passes a conversational completion as [{"role": "assistant", "content": ...}]
    return completion if isinstance(completion, str) else completion[0]["content"]


def digit_reward(completions, total, **kwargs) -> list[float]:
    """Partial credit: the share of the sum's digits right (aligned from the right), 1.0 when exact."""
    rewards = []
    for completion, gold in zip(completions, total):
        answer, want = final_answer(_text(completion)), str(gold)
        if answer is None:
            rewards.append(0.0)
            continue
        right = sum(x == y for x, y in zip(answer[::-1], want[::-1]))
        rewards.append(right / max(len(answer), len(want)))
    return rewards
