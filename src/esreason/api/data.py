"""A user's dataset and reward functions as an esreason task (what the Python API trains and evaluates).

A dataset is a ``datasets.Dataset`` (or anything iterable of mappings: a list of dicts) with a
``prompt`` column, in TRL's two formats:

- standard: ``prompt`` is a string, read by the model as it is (no chat template);
- conversational: ``prompt`` is a list of ``{"role", "content"}`` messages, rendered with the
  tokenizer's chat template.

Every other column is kept and reaches the reward functions as a keyword argument (TRL's contract,
:mod:`esreason.verifiers.reward_functions`). The task is registered under its name (source "python
API"), so periodic held-out evaluation and ``esreason.evaluate`` find it like any other task.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Hashable, Iterable, Mapping, Sequence

from esreason.errors import UserError
from esreason.tasks.base import Problem, Task
from esreason.verifiers.reward_functions import PROMPT, RESERVED, RewardFunctions, Row, is_conversational

API_SOURCE = "python API"


def dataset_rows(dataset: Any, what: str) -> list[dict[str, Any]]:
    """The rows of ``dataset`` as dicts, checked: a ``prompt`` column, and no column named like one of
    the reward functions' own arguments. Errors name ``what`` (``train_dataset``) and the columns."""
    if dataset is None:
        raise UserError(f"{what}: no dataset given")
    columns = getattr(dataset, "column_names", None)
    if columns is not None and hasattr(dataset, "__len__") and len(dataset) == 0:
        raise UserError(f"{what} is empty (0 rows"
                        + (f"; columns: {', '.join(columns)})" if columns else ", no columns)"))
    if columns is not None and PROMPT not in columns:
        raise UserError(f"{what} has no '{PROMPT}' column; its columns are: {', '.join(columns)} "
                        f"(rename one, e.g. dataset.rename_column('question', '{PROMPT}'))")
    if isinstance(dataset, (str, bytes, Mapping)) or not isinstance(dataset, Iterable):
        raise UserError(f"{what}: expected a datasets.Dataset or a list of dicts, got {type(dataset).__name__}")
    rows = []
    for i, row in enumerate(dataset):
        if not isinstance(row, Mapping):
            raise UserError(f"{what} row {i}: expected a mapping of columns, got {type(row).__name__}")
        if PROMPT not in row:
            raise UserError(f"{what} row {i} has no '{PROMPT}'; its columns are: {', '.join(map(str, row))}")
        bad = sorted(set(row) & set(RESERVED))
        if bad:
            raise UserError(f"{what}: column {bad[0]!r} is reserved for the reward functions' own arguments "
                            f"({', '.join(RESERVED)}); rename it")
        prompt = row[PROMPT]
        if not (isinstance(prompt, str) or is_conversational(prompt)):
            raise UserError(f"{what} row {i}: '{PROMPT}' must be a string or a list of {{role, content}} "
                            f"messages, got {type(prompt).__name__}")
        rows.append(dict(row))
    if not rows:
        raise UserError(f"{what} is empty")
    return rows


def row_problem(task: str, split: str, index: int, row: Mapping[str, Any]) -> Problem:
    """One dataset row as a problem: its prompt (text or messages) and the row as the gold object."""
    prompt = row[PROMPT]
    columns = {k: v for k, v in row.items() if k != PROMPT}
    if isinstance(prompt, str):
        return Problem(task=task, id=f"{task}-{split}-{index}", messages=(), gold=Row(prompt, columns), text=prompt)
    messages = tuple({"role": str(m["role"]), "content": str(m["content"])} for m in prompt)
    return Problem(task=task, id=f"{task}-{split}-{index}", messages=messages,
                   gold=Row([dict(m) for m in messages], columns))


def reward_task(name: str, reward_funcs: Any, splits: Mapping[str, Any], *,
                reward_weights: Sequence[float] | None = None, pass_threshold: float = 1.0,
                answer_fn: Callable[[str], Hashable | None] | None = None, description: str = "") -> Task:
    """A task over in-memory datasets (``splits``: split name -> dataset) scored by ``reward_funcs``.

    The reward functions are checked now (callables, weights) so a mistake fails before a model loads.
    """
    RewardFunctions(reward_funcs, weights=reward_weights, pass_threshold=pass_threshold, answer_fn=answer_fn)
    rows = {split: dataset_rows(ds, "train_dataset" if split == "train" else "eval_dataset")
            for split, ds in splits.items() if ds is not None}
    problems = {split: [row_problem(name, split, i, r) for i, r in enumerate(rs)] for split, rs in rows.items()}

    def loader(split: str, data_path: Path | None) -> list[Problem]:
        if data_path is not None:
            raise UserError(f"task {name!r} comes from an in-memory dataset; it takes no data path ({data_path})")
        return list(problems[split])

    def factory(format_reward: float, tokenizer: Any = None) -> RewardFunctions:
        return RewardFunctions(reward_funcs, weights=reward_weights, pass_threshold=pass_threshold,
                               answer_fn=answer_fn, tokenizer=tokenizer)

    return Task(name=name, verifier="reward", loader=loader, splits=tuple(problems),
                vote_key=lambda a: None if a is None else a.strip() or None,
                description=description or f"{API_SOURCE}: {', '.join(f'{s} {len(p)}' for s, p in problems.items())}",
                scorer_factory=factory, votes=answer_fn is not None)


def register_api_task(task: Task) -> Task:
    """Register ``task``; a task of the same name from the API (an earlier call in this process) is
    replaced, any other (a built-in, a task file) is kept and the call refused."""
    from esreason.tasks import registry

    try:
        known = registry.source(task.name)
    except UserError:
        known = None
    return registry.register(task, override=known == API_SOURCE, source=API_SOURCE)


__all__ = ["API_SOURCE", "dataset_rows", "register_api_task", "reward_task", "row_problem"]
