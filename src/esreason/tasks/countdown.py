"""Countdown (held-out suites): reach ``target`` with ``nums``, each used once, and + - * /.

Source (paper table "Licenses"): ``HuggingFaceTB/Countdown-Task-GOLD``, config and
split ``test``; its fixed test construction corresponds to
``Jiayi-Pan/Countdown-Tasks-3to4`` (columns ``target``, ``nums``). The GOLD rows
also carry ``prompt``: the chat messages (``[{"role", "content"}, ...]``, a system
and a user turn) distributed with the dataset.

Prompt (paper appendix "Prompt Templates"): "Countdown uses the role/content
messages distributed with the dataset and renders them without rewriting the task
statement". So:

1. a ``prompt`` column (list of role/content messages) is used as is;
2. otherwise a ``messages`` column (the GOLD ``verified_*`` configs hold whole
   conversations) is used with its trailing assistant turns removed;
3. only rows with neither (``Jiayi-Pan/Countdown-Tasks-3to4`` style) get messages
   built here, in the TinyZero convention that dataset was made for —
   :data:`TINYZERO_SYSTEM` and :data:`TINYZERO_USER` with ``numbers`` written as a
   Python list (``[3, 7, 25]``). TinyZero also pre-fills the assistant turn with
   ``Let me solve this step by step.\\n<think>``; that prefix is not added (our
   prompts end at the generation prompt of the model's chat template).

Gold: ``{"target": int, "numbers": [int, ...]}`` for the ``countdown`` verifier. The
source has no id column: ids are ``countdown-<split>-<index>`` (an ``id`` column is
used when present).
"""

from __future__ import annotations

from typing import Any, Mapping

from esreason.tasks.base import Problem
from esreason.tasks.sources import RowReader

TINYZERO_SYSTEM = ("You are a helpful assistant. You first thinks about the reasoning process in the mind "
                   "and then provides the user with the answer.")
TINYZERO_USER = ("Using the numbers {numbers}, create an equation that equals {target}. You can use basic "
                 "arithmetic operations (+, -, *, /) and each number can only be used once. Show your work in "
                 "<think> </think> tags. And return the final answer in <answer> </answer> tags, for example "
                 "<answer> (1 + 2) / 3 </answer>.")

_ROLES = ("system", "user", "assistant")


def tinyzero_messages(numbers: list[int], target: int) -> tuple[dict[str, str], ...]:
    """Messages for a row that ships none (TinyZero's Countdown statement)."""
    return ({"role": "system", "content": TINYZERO_SYSTEM},
            {"role": "user", "content": TINYZERO_USER.format(numbers=list(numbers), target=target)})


def dataset_messages(reader: RowReader, key: str) -> tuple[dict[str, str], ...]:
    """The row's own role/content messages, validated, trailing assistant turns dropped."""
    value = reader.raw(key)
    if not isinstance(value, (list, tuple)) or not value:
        raise reader.error(key, "must be a non-empty list of {'role', 'content'} messages")
    messages: list[dict[str, str]] = []
    for i, m in enumerate(value):
        if not isinstance(m, Mapping):
            raise reader.error(key, f"message {i} must be an object with 'role' and 'content'")
        role, content = m.get("role"), m.get("content")
        if role not in _ROLES:
            raise reader.error(key, f"message {i} has role {role!r}; expected one of {', '.join(_ROLES)}")
        if not isinstance(content, str):
            raise reader.error(key, f"message {i} content must be a string")
        messages.append({"role": role, "content": content})
    while messages and messages[-1]["role"] == "assistant":
        messages.pop()
    if not any(m["role"] == "user" for m in messages):
        raise reader.error(key, "has no user message")
    return tuple(messages)


def countdown(reader: RowReader, task: str, split: str) -> Problem:
    target = reader.integer("target")
    numbers = reader.int_list("nums" if reader.has("nums") or not reader.has("numbers") else "numbers", min_len=2)
    meta: dict[str, Any] = {}
    if reader.has("prompt"):
        messages = dataset_messages(reader, "prompt")
        meta["prompt_source"] = "prompt"
    elif reader.has("messages"):
        messages = dataset_messages(reader, "messages")
        meta["prompt_source"] = "messages"
    else:
        messages = tinyzero_messages(numbers, target)
        meta["prompt_source"] = "tinyzero"
    pid = reader.row_id("id", f"{task}-{split}-{reader.row.index}")
    return Problem(task=task, id=pid, messages=messages, gold={"target": target, "numbers": numbers}, meta=meta)
