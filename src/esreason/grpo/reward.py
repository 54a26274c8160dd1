"""The task reward as a TRL reward function: the same verifier and reward levels as ES.

TRL calls a reward function with keyword arguments ``prompts``, ``completions``,
``completion_ids``, every extra dataset column (here ``problem_index``), ``trainer_state``,
``log_extra`` and ``log_metric``, and expects one float per completion. We decode the
completion token ids ourselves with :func:`esreason.embedded.safe_decode` (special tokens
dropped, ids the vocabulary never assigned dropped), exactly as the ES sampler decodes its
responses, and score the text with the task's verifier against the problem's gold object:
1 correct, ``format_reward`` formatted but wrong, 0 otherwise (paper appendix
"Implementation-Level Training Procedure").
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from esreason.embedded import safe_decode
from esreason.tasks.base import Problem
from esreason.verifiers.base import Verdict
from esreason.verifiers.reward_functions import TASK_REWARD, call_reward

PROBLEM_COLUMN = "problem_index"


class TaskReward:
    """Callable reward ``(completion_ids, problem_index, ...) -> list[float]``.

    problems: the training split (``problem_index`` indexes it); tokenizer: decodes the
    completion ids; scorer: the task verifier ``score(text, gold) -> Verdict``.
    Per call it reports, through TRL's ``log_metric``, ``accuracy/mean`` (verifier-correct),
    ``format/mean`` (final-answer format followed) and ``reward/mean`` — the keys ES logs. TRL
    averages them over processes, which is the batch mean because every process scores the same
    number of responses. ``reward/std`` (population std over the whole rollout batch) is logged by
    :class:`esreason.grpo.trainer.PaperGRPOTrainer` from the gathered rewards, since a mean of
    per-process stds is not the batch std.
    """

    __name__ = TASK_REWARD  # TRL names the reward column after the callable

    def __init__(self, problems: Sequence[Problem], tokenizer: Any, scorer: Callable[[str, Any], Verdict]) -> None:
        self.problems = list(problems)
        self.tokenizer = tokenizer
        self.scorer = scorer

    def verdicts(self, completion_ids: Sequence[Sequence[int]], problem_index: Sequence[int]) -> list[Verdict]:
        if len(completion_ids) != len(problem_index):
            raise ValueError(f"{len(completion_ids)} completions but {len(problem_index)} problem indices")
        texts = [safe_decode(self.tokenizer, ids) for ids in completion_ids]
        return [self.scorer(text, self.problems[int(i)].gold) for text, i in zip(texts, problem_index)]

    def __call__(self, *, completion_ids: Sequence[Sequence[int]], problem_index: Sequence[int],
                 log_metric: Callable[[str, float], None] | None = None, **_: Any) -> list[float]:
        verdicts = self.verdicts(completion_ids, problem_index)
        rewards = np.array([v.reward for v in verdicts], dtype=np.float64)
        if log_metric is not None and len(verdicts):
            log_metric("reward/mean", float(rewards.mean()))
            log_metric("accuracy/mean", float(np.mean([v.correct for v in verdicts])))
            log_metric("format/mean", float(np.mean([v.formatted for v in verdicts])))
        return [float(r) for r in rewards]


class CheckedReward:
    """A user's reward function as TRL calls it, through :func:`esreason.verifiers.reward_functions.call_reward`:
    a function that raises, returns strings, the wrong count, NaN or inf stops the run with the one line
    ES gives (a :class:`~esreason.verifiers.reward_functions.RewardFunctionError`), instead of TRL's own
    error from deep in its trainer ("too many dimensions 'str'") or the function's traceback. It keeps
    the function's name, so TRL logs ``rewards/<name>/mean`` as before; values pass through unchanged.
    """

    def __init__(self, func: Callable[..., Any], name: str) -> None:
        self.func = func
        self.__name__ = name

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], completion_ids: Sequence[Any],
                 **kwargs: Any) -> list[float | None]:
        return call_reward(self.func, self.__name__, prompts=prompts, completions=completions,
                           completion_ids=completion_ids, **kwargs)


def overlong_reward(cfg: Any) -> Any | None:
    """DAPO's soft overlong punishment for ``cfg`` (``grpo.soft_overlong_punishment`` > 0): TRL 1.16's
    ``get_soft_overlong_punishment`` with L_max = generation.max_new_tokens and L_cache the share of it
    (:func:`esreason.grpo.config.overlong_cache_tokens`); a second reward function, weight 1 (TRL adds the
    weighted rewards before the group advantage). None when off."""
    from esreason.grpo.config import overlong_cache_tokens

    if not cfg.grpo.soft_overlong_punishment:
        return None
    from trl.rewards import get_soft_overlong_punishment

    return get_soft_overlong_punishment(max_completion_len=cfg.generation.max_new_tokens,
                                        soft_punish_cache=overlong_cache_tokens(cfg))


def trl_rewards(problems: Sequence[Problem], tokenizer: Any, scorer: Any) -> tuple[list[Any], list[float], list[dict[str, Any]]]:
    """(reward functions, their weights, dataset rows) to hand TRL for ``problems`` scored by ``scorer``.

    A task of TRL-style reward functions (:class:`esreason.verifiers.reward_functions.RewardFunctions`)
    gives TRL the user's functions, each behind a :class:`CheckedReward` (the same checks and one-line
    errors as ES), with their weights, and rows holding the prompt (text or messages) and every column of
    the user's data, so TRL calls them with exactly the arguments it would without us.
    Any other task gets one :class:`TaskReward` over its verifier, and rows that index the problems.
    """
    from esreason.verifiers.reward_functions import RewardFunctions

    def prompt(p: Problem) -> Any:
        return p.text if p.text is not None else [dict(m) for m in p.messages]

    if isinstance(scorer, RewardFunctions):
        rows = [{"prompt": prompt(p), **dict(p.gold.columns)} for p in problems]
        funcs = [CheckedReward(f, name) for f, name in zip(scorer.funcs, scorer.names)]
        return funcs, [float(w) for w in scorer.weights], rows
    rows = [{"prompt": prompt(p), PROBLEM_COLUMN: i} for i, p in enumerate(problems)]
    return [TaskReward(problems, tokenizer, scorer)], [1.0], rows


def reward_functions(cfg: Any, problems: Sequence[Problem], tokenizer: Any, scorer: Any
                     ) -> tuple[list[Any], int, list[dict[str, Any]]]:
    """(reward functions, how many of them are the task's, dataset rows) of a GRPO run: the task's
    (:func:`trl_rewards`) and, with ``grpo.soft_overlong_punishment``, DAPO's overlong penalty after them
    (:func:`overlong_reward`; its weight 1 is in :func:`esreason.grpo.trainer.build_trl_args`)."""
    funcs, _, rows = trl_rewards(problems, tokenizer, scorer)
    overlong = overlong_reward(cfg)
    return funcs + ([overlong] if overlong is not None else []), len(funcs), rows


__all__ = ["PROBLEM_COLUMN", "CheckedReward", "TaskReward", "overlong_reward", "reward_functions", "trl_rewards"]
