"""The completions table of a GRPO run on W&B (``logging.wandb.table_every``; :mod:`esreason.io.wandb_log`).

TRL keeps the prompts, completions and per-reward-function rewards of the last generation batch in
``GRPOTrainer._logs`` (trl 1.16 ``grpo_trainer.py``: deques of ``generation_batch_size``, filled in
``_generate_and_score_completions`` on the main process whether or not ``log_completions`` is on).
The table takes the last ``table_rows`` rollouts of update ``step``'s batch from there, the reward
being the weighted sum of the reward functions (our one :class:`esreason.grpo.reward.TaskReward`,
weight 1): the rollouts the update trained on, not an extra generation. We leave TRL's own
``log_completions`` off: it also prints every batch (rich) and writes parquet files into RUN/trl.
"""

from __future__ import annotations

from typing import Any, Callable


def message_text(value: Any) -> str:
    """A TRL prompt or completion as text: conversational ones are lists of {role, content} messages
    (the prompt: its last user message; a completion: its content), plain ones are strings."""
    if isinstance(value, str):
        return value
    if isinstance(value, (list, tuple)) and value:
        users = [m.get("content", "") for m in value if isinstance(m, dict) and m.get("role") == "user"]
        last = users[-1] if users else value[-1].get("content", "") if isinstance(value[-1], dict) else value[-1]
        return str(last)
    return str(value)


def grpo_completions(trainer: Any, rows: int) -> Callable[[int], list[tuple[str, str, float]]]:
    """``sample(step)``: (prompt, completion, reward) of the last ``rows`` rollouts TRL scored."""

    def sample(step: int) -> list[tuple[str, str, float]]:
        logs = trainer._logs
        prompts, completions = list(logs["prompt"])[-rows:], list(logs["completion"])[-rows:]
        weights = [float(w) for w in trainer.reward_weights]
        per_func = [list(logs["rewards"][name])[-rows:] for name in trainer.reward_func_names]
        rewards = [sum(w * r[i] for w, r in zip(weights, per_func)) for i in range(len(prompts))]
        return [(message_text(p), message_text(c), float(r)) for p, c, r in zip(prompts, completions, rewards)]

    return sample


__all__ = ["grpo_completions", "message_text"]
