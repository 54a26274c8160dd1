"""TRL-style reward functions as an esreason scorer: a user's reward runs unchanged under ES,
GRPO and the Pass@K evaluation.

The contract is TRL's (``trl.GRPOTrainer``, 1.16): a reward function is called with keyword
arguments ``prompts``, ``completions``, ``completion_ids`` and every other dataset column (one list
entry per completion), and returns one ``float`` or ``None`` per completion. Several functions are
combined as TRL combines them (``multi_objective_aggregation="sum_then_normalize"``): the weighted
sum of their outputs, a ``None`` skipped for that sample (``nansum``); a sample for which *every*
function returned ``None`` is unscorable (its reward is NaN and it is left out of a member's mean,
as TRL leaves it out of a group's baseline).

What esreason passes, per call (one call per function per population member per mini-batch, or per
evaluation call, over lists):

- ``prompts``: the dataset's ``prompt`` values (a string, or a list of chat messages);
- ``completions``: the decoded responses; for conversational prompts each is
  ``[{"role": "assistant", "content": text}]``, as TRL passes them;
- ``completion_ids``: each response re-tokenised (no special tokens), so every backend passes the
  same ids for the same text (TRL passes the sampled ids; they agree unless a tokenizer does not
  round-trip);
- every other column of the row, by name;
- ``trainer_state``: under ES the trainer's ``transformers.TrainerState`` (``global_step`` = updates
  done, ``max_steps``; set on :attr:`RewardFunctions.trainer_state`), None in evaluations; and
  ``log_extra`` / ``log_metric`` as no-ops (TRL's logging hooks: ES logs its own reward statistics,
  ``rewards/<name>/mean`` and ``/std`` included).

A sample counts as *correct* when its reward is at least ``pass_threshold`` (default 1.0). Maj@K
needs an answer to vote on: ``answer_fn(completion_text) -> hashable | None`` gives it (None
abstains); without one the evaluation leaves Maj@K out and says why.

Errors name the function and the first bad row: a function that raises, returns the wrong number
of values, or returns NaN, inf or a non-number (:class:`RewardFunctionError`, a UserError), under GRPO
too (:func:`call_reward`). A string in ``reward_funcs`` (TRL's reward-model id) is refused: esreason
does not load reward models.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Mapping, Sequence

import numpy as np

from esreason.errors import UserError
from esreason.verifiers.base import Verdict

#: The name of a built-in verifier's reward under GRPO and in ES's ``rewards/<name>/mean`` metrics
#: (:class:`esreason.grpo.reward.TaskReward`).
TASK_REWARD = "task_reward"
#: The dataset column every row has (TRL's name).
PROMPT = "prompt"
#: Keyword arguments TRL passes besides the columns; a column with one of these names is refused.
RESERVED = ("prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric")


class RewardFunctionError(UserError):
    """A reward function failed or returned something that is not one number (or None) per completion."""


def function_name(func: Any) -> str:
    """The name TRL gives a reward function (its ``__name__``, else its class name)."""
    name = getattr(func, "__name__", None)
    return str(name) if name else type(func).__name__


def _no_op(*_: Any, **__: Any) -> None:
    return None


def is_conversational(prompt: Any) -> bool:
    """TRL's test: a prompt given as a list of ``{"role", "content"}`` messages."""
    return isinstance(prompt, (list, tuple)) and bool(prompt) and isinstance(prompt[0], Mapping) \
        and "role" in prompt[0]


@dataclass(frozen=True)
class Row:
    """A dataset row as the gold object of a problem: the ``prompt`` value and the other columns.

    Reward functions receive ``columns`` as keyword arguments (lists over the batch).
    """

    prompt: Any
    columns: Mapping[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {PROMPT: self.prompt, **dict(self.columns)}


def _as_float(value: Any, name: str, row: int) -> float:
    """One reward value as a float (None -> NaN); refuse NaN, inf and non-numbers naming the row."""
    if value is None:
        return math.nan
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:  # a 0-d tensor or array
            value = value.item()
        else:
            raise RewardFunctionError(f"reward function {name!r} returned {value!r} ({type(value).__name__}) "
                                      f"for row {row}: expected a number or None")
    out = float(value)
    if not math.isfinite(out):
        raise RewardFunctionError(f"reward function {name!r} returned {out} for row {row}: rewards must be "
                                  "finite (return None to skip a sample)")
    return out


def call_reward(func: Callable[..., Any], name: str, *, prompts: Sequence[Any], completions: Sequence[Any],
                completion_ids: Sequence[Any], **kwargs: Any) -> list[float | None]:
    """Call one reward function with TRL's keyword arguments and check what it returns: one float (or
    None) per completion, finite. Every error is one :class:`RewardFunctionError` line naming the
    function and the first bad row, under ES, under GRPO (TRL calls the function through
    :func:`esreason.grpo.reward.trl_rewards`' wrapper, which calls this) and in evaluations."""
    n = len(completions)
    try:
        values = func(prompts=prompts, completions=completions, completion_ids=completion_ids, **kwargs)
    except RewardFunctionError:
        raise
    except Exception as exc:  # the user's code: name it, its error and the batch, keep the cause
        first = f", first row: prompt {prompts[0]!r:.80}" if len(prompts) else ""
        raise RewardFunctionError(f"reward function {name!r} raised {type(exc).__name__}: {exc} "
                                  f"(called on {n} completions{first})") from exc
    if isinstance(values, (str, bytes)) or not hasattr(values, "__len__"):
        raise RewardFunctionError(f"reward function {name!r} returned {type(values).__name__}, expected a "
                                  f"list of {n} rewards (one per completion)")
    if len(values) != n:
        raise RewardFunctionError(f"reward function {name!r} returned {len(values)} rewards for {n} "
                                  f"completions (row {min(len(values), n)} is the first without one)")
    out: list[float | None] = []
    for r, v in enumerate(values):
        x = _as_float(v, name, r)
        out.append(None if math.isnan(x) else x)
    return out


class RewardFunctions:
    """A scorer over TRL-style reward functions (``score_batch(texts, golds) -> list[Verdict]``).

    funcs: one callable or a list. weights: one per function (TRL's ``reward_weights``; default 1 each).
    pass_threshold: a sample is correct when its combined reward >= this (default 1.0).
    answer_fn: optional ``answer_fn(completion_text) -> hashable | None`` for Maj@K.
    tokenizer: re-tokenises completions for ``completion_ids`` (None: an empty list per completion).
    golds: :class:`Row` objects (prompt and columns) -- plain mappings with a ``prompt`` key work too.
    """

    def __init__(self, funcs: Callable[..., Any] | Sequence[Callable[..., Any]], *,
                 weights: Sequence[float] | None = None, pass_threshold: float = 1.0,
                 answer_fn: Callable[[str], Hashable | None] | None = None, tokenizer: Any = None) -> None:
        if isinstance(funcs, (str, bytes)) or (isinstance(funcs, (list, tuple)) and
                                               any(isinstance(f, (str, bytes)) for f in funcs)):
            name = funcs if isinstance(funcs, (str, bytes)) else next(f for f in funcs if isinstance(f, (str, bytes)))
            raise UserError(f"reward_funcs: {name!r} is a string; TRL loads a string as a reward model "
                            "(AutoModelForSequenceClassification), which esreason does not support: give a reward "
                            "function, e.g. def rm_reward(prompts, completions, **kwargs) that scores the "
                            "completions with your model and returns one float per completion")
        self.funcs = [funcs] if callable(funcs) else list(funcs)
        if not self.funcs:
            raise UserError("reward_funcs: give at least one reward function")
        for f in self.funcs:
            if not callable(f):
                raise UserError(f"reward_funcs: {f!r} is not callable")
            if inspect.iscoroutinefunction(f):
                raise UserError(f"reward function {function_name(f)!r} is async; esreason calls reward functions "
                                "synchronously (wrap it with asyncio.run)")
        self.names = [function_name(f) for f in self.funcs]
        if weights is None:
            weights = [1.0] * len(self.funcs)
        weights = [float(w) for w in weights]
        if len(weights) != len(self.funcs):
            raise UserError(f"reward_weights: {len(weights)} weights for {len(self.funcs)} reward functions")
        if not all(math.isfinite(w) for w in weights):
            raise UserError(f"reward_weights: every weight must be finite (got {weights})")
        self.weights = np.asarray(weights, dtype=np.float64)  # [F]
        self.pass_threshold = float(pass_threshold)
        self.answer_fn = answer_fn
        self.tokenizer = tokenizer
        #: What reward functions get as ``trainer_state``: the ES trainer sets its
        #: ``transformers.TrainerState`` here (``global_step``, ``max_steps``, ...); None in evaluations.
        self.trainer_state: Any = None
        self.recorded: list[np.ndarray] | None = None

    @property
    def votes(self) -> bool:
        """True when samples carry an answer to vote on (an ``answer_fn`` is set)."""
        return self.answer_fn is not None

    def __call__(self, response: str, gold: Any) -> Verdict:
        return self.score_batch([response], [gold])[0]

    def rewards(self, texts: Sequence[str], golds: Sequence[Any]) -> np.ndarray:
        """The combined reward per completion, float64 [n] (NaN where every function returned None)."""
        per_func = self.per_function(texts, golds)  # [n, F]
        combined = np.nansum(per_func * self.weights[None, :], axis=1)  # [n]
        combined[np.isnan(per_func).all(axis=1)] = np.nan
        return combined

    def per_function(self, texts: Sequence[str], golds: Sequence[Any]) -> np.ndarray:
        """Each function's reward per completion, float64 [n, F] (None -> NaN)."""
        n = len(texts)
        if len(golds) != n:
            raise ValueError(f"{n} completions for {len(golds)} rows")
        rows = [g.as_dict() if isinstance(g, Row) else dict(g) for g in golds]
        for r, row in enumerate(rows):
            if PROMPT not in row:
                raise UserError(f"row {r} has no '{PROMPT}' (columns: {', '.join(sorted(row))})")
        prompts = [row[PROMPT] for row in rows]
        completions: list[Any] = [[{"role": "assistant", "content": t}] if is_conversational(p) else t
                                  for p, t in zip(prompts, texts)]
        ids = self._ids(texts)
        keys = [k for k in rows[0] if k != PROMPT] if rows else []
        columns = {k: [row.get(k) for row in rows] for k in keys}
        out = np.zeros((n, len(self.funcs)), dtype=np.float64)  # [n, F]
        for j, func in enumerate(self.funcs):
            values = call_reward(func, self.names[j], prompts=prompts, completions=completions, completion_ids=ids,
                                 trainer_state=self.trainer_state, log_extra=_no_op, log_metric=_no_op, **columns)
            out[:, j] = [math.nan if v is None else v for v in values]
        if self.recorded is not None:
            self.recorded.append(out.copy())
        return out

    def start_recording(self) -> None:
        """Keep every call's per-function rewards until :meth:`take_recorded` (the ES trainer logs their
        ``rewards/<name>/mean`` and ``/std`` per update, as TRL's GRPO does)."""
        self.recorded = []

    def take_recorded(self) -> np.ndarray:
        """The per-function rewards of the calls since the last take, stacked [n, F] (None -> NaN); clears them."""
        parts, self.recorded = self.recorded or [], [] if self.recorded is not None else None
        if not parts:
            return np.zeros((0, len(self.funcs)), dtype=np.float64)
        return np.concatenate(parts, axis=0)

    def _ids(self, texts: Sequence[str]) -> list[list[int]]:
        if self.tokenizer is None or not texts:
            return [[] for _ in texts]
        return [list(x) for x in self.tokenizer(list(texts), add_special_tokens=False)["input_ids"]]

    def score_batch(self, texts: Sequence[str], golds: Sequence[Any]) -> list[Verdict]:
        """One Verdict per completion: reward = the combined reward (NaN when unscorable), correct =
        reward >= pass_threshold, extracted = ``answer_fn(text)`` as a string key (None abstains)."""
        combined = self.rewards(texts, golds)
        out = []
        for text, reward in zip(texts, combined):
            answer = self._answer(text)
            scorable = not math.isnan(reward)
            reason = "no reward function scored it" if not scorable else \
                ("reward >= pass_threshold" if reward >= self.pass_threshold else "reward < pass_threshold")
            out.append(Verdict(reward=float(reward), correct=bool(scorable and reward >= self.pass_threshold),
                               extracted=answer, reason=reason,
                               formatted=answer is not None if self.answer_fn is not None else bool(
                                   scorable and reward > 0)))
        return out

    def _answer(self, text: str) -> str | None:
        if self.answer_fn is None:
            return None
        try:
            value = self.answer_fn(text)
        except Exception as exc:  # the user's code: name it
            raise RewardFunctionError(f"answer_fn {function_name(self.answer_fn)!r} raised {type(exc).__name__}: "
                                      f"{exc} on completion {text[:80]!r}") from exc
        if value is None:
            return None
        return value if isinstance(value, str) else repr(value)


__all__ = ["PROMPT", "RESERVED", "RewardFunctionError", "RewardFunctions", "Row", "TASK_REWARD", "call_reward",
           "function_name", "is_conversational"]
