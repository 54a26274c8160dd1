"""The task contract: a task = loader + prompt rendering + verifier + vote normaliser.

A :class:`Problem` carries chat ``messages`` (the paper's appendix "Prompt
Templates", already filled in); :func:`render_prompt` turns them into the model's
input text with the tokenizer's own chat template, so the embedded default and a
real model go through the same path.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Hashable, Sequence


@dataclass(frozen=True)
class Problem:
    """One evaluation or training item.

    task: registry name of the task the problem belongs to.
    id: stable identifier, unique within the task (used to resume evaluations).
    messages: chat messages, each {"role": ..., "content": ...}, rendered with the model's chat
        template (TRL's "conversational" prompt).
    gold: the verifier's gold object (format set by the task's verifier).
    meta: anything else worth keeping (source row, shuffled choice order, ...).
    text: a prompt given as plain text (TRL's "standard" prompt): the model reads it as it is, no
        chat template; ``messages`` is then empty.
    """

    task: str
    id: str
    messages: tuple[dict[str, str], ...]
    gold: Any
    meta: dict[str, Any] = field(default_factory=dict)
    text: str | None = None


@dataclass(frozen=True)
class Task:
    """A registered task.

    name: registry name (e.g. ``gsm8k``, ``demo-add``).
    verifier: verifier name (see :mod:`esreason.verifiers`).
    loader: ``loader(split, data_path) -> list[Problem]``; ``data_path`` is a local
        JSONL/Parquet file or directory, or None to use the default source
        (synthetic generation, or the Hugging Face hub where reachable).
    splits: splits the loader accepts.
    vote_key: maps an extracted answer to the key Maj@K votes over (None abstains).
        Tasks whose equivalence is not a string key (math) set ``equivalent``.
    equivalent: optional ``equivalent(a, b) -> bool`` used to group answers for
        voting when keys are not enough (math-verify equivalence).
    description: one line for ``--help`` and reports.
    scorer_factory: optional ``scorer_factory(format_reward, tokenizer) -> scorer``; when set it
        replaces the registered verifier (a task defined by reward functions builds its scorer here;
        the tokenizer, possibly None, gives reward functions their ``completion_ids``).
    votes: samples carry an answer Maj@K can vote on; False leaves Maj@K out of the task's metrics
        (reward functions without an ``answer_fn``).
    """

    name: str
    verifier: str
    loader: Callable[[str, Path | None], list[Problem]]
    splits: tuple[str, ...] = ("test",)
    vote_key: Callable[[str | None], Hashable | None] = lambda a: a
    equivalent: Callable[[str, str], bool] | None = None
    description: str = ""
    scorer_factory: Callable[[float, Any], Any] | None = None
    votes: bool = True

    def scorer(self, format_reward: float = 0.1, tokenizer: Any = None) -> Any:
        """The scorer of this task's responses: ``scorer(text, gold) -> Verdict`` (reward functions
        also score a list at once, ``score_batch``). ``format_reward`` sets the built-in verifiers'
        reward levels; a task of reward functions has its own."""
        if self.scorer_factory is not None:
            return self.scorer_factory(format_reward, tokenizer)
        from esreason import verifiers

        return verifiers.get(self.verifier, format_reward=format_reward)

    def load(self, split: str = "test", data_path: str | Path | None = None,
             limit: int | None = None) -> list[Problem]:
        from esreason.errors import UserError

        if split not in self.splits:
            raise UserError(f"task {self.name!r} has no split {split!r}; known: {', '.join(self.splits)}")
        problems = self.loader(split, Path(data_path) if data_path is not None else None)
        if not problems:
            raise UserError(f"task {self.name!r} split {split!r} is empty"
                            + (f" (data: {data_path})" if data_path else ""))
        return problems[:limit] if limit is not None else problems


def render_prompt(tokenizer: Any, messages: Sequence[dict[str, str]]) -> str:
    """Render chat messages with the tokenizer's chat template, ending at the assistant turn."""
    return tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)


def problem_prompt(tokenizer: Any, problem: Problem) -> str:
    """The model's input text for ``problem``: its plain-text prompt as given, else its chat messages
    rendered with the tokenizer's chat template (TRL's rule for standard and conversational prompts)."""
    if problem.text is not None:
        return problem.text
    return render_prompt(tokenizer, problem.messages)


class RenderedPrompts(Sequence[str]):
    """The rendered prompts of ``problems``, each rendered on first use and kept.

    A training split is large (the demo's 20,000 problems, GSM8K's 7,473) and an ES run reads only
    the mini-batches it draws (at most ``batch_size * steps`` problems: 480 for the 30-update configs/demo/es.yaml),
    so rendering every prompt up front would cost a chat-template call per problem before the first
    update (0.65 s per run on the demo split). Item ``i`` is exactly
    ``problem_prompt(tokenizer, problems[i])``.
    """

    def __init__(self, tokenizer: Any, problems: Sequence[Problem]) -> None:
        self._tokenizer = tokenizer
        self._problems = problems
        self._cache: dict[int, str] = {}

    def __len__(self) -> int:
        return len(self._problems)

    def __getitem__(self, i):  # type: ignore[override]  # int -> str, slice -> list[str]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        i = range(len(self))[i]  # negative indices; IndexError past the end
        text = self._cache.get(i)
        if text is None:
            text = self._cache[i] = problem_prompt(self._tokenizer, self._problems[i])
        return text
