"""Mathematical benchmarks: row -> :class:`Problem` for GSM8K, MATH-500, AIME 2024/2025,
AMC 2023 and DeepScaleR (paper tables "Datasets and splits" and "Licenses").

All use the paper's "Prompt for Mathematical Reasoning" with the problem text as the
user message, and the ``math`` verifier with a string gold answer.

Schemas read (one converter each; every field is validated by :class:`RowReader`):

- ``openai/gsm8k`` (config ``main``): ``question``, ``answer`` = worked solution ending
  ``#### <number>``; gold = the text after the last ``####``, stripped, commas removed
  (``#### 1,250`` -> ``1250``). No id field: ids are ``gsm8k-<split>-<index>``.
- ``HuggingFaceH4/MATH-500``: ``problem``, ``answer``, ``unique_id`` (id), ``subject``,
  ``level``, ``solution`` (kept in meta when present).
- ``math-ai/aime24``: ``id``, ``problem``, ``solution``, ``url``. The release has no
  separate answer column; gold = an ``answer`` field when a copy has one, else the
  last ``\\boxed{}`` of ``solution``, else ``solution`` itself when it is a bare integer.
- ``math-ai/aime25``: ``id``, ``problem``, ``answer``.
- ``math-ai/amc23``: ``id``, ``question``, ``answer`` (stored as a number; ``27.0`` -> ``"27"``).
- ``agentica-org/DeepScaleR-Preview-Dataset``: ``problem``, ``answer``, ``solution``;
  no id field: ids are ``deepscaler-<split>-<index>``.
"""

from __future__ import annotations

import re

from esreason.tasks.base import Problem
from esreason.tasks.prompts import math_messages
from esreason.tasks.sources import RowReader

_PLAIN_INT = re.compile(r"^[+-]?\d+$")


def _index_id(task: str, split: str, reader: RowReader) -> str:
    return f"{task}-{split}-{reader.row.index}"


def gsm8k(reader: RowReader, task: str, split: str) -> Problem:
    question = reader.text("question")
    solution = reader.text("answer")
    if "####" not in solution:
        raise reader.error("answer", "has no '#### <answer>' line (GSM8K format)")
    gold = solution.rsplit("####", 1)[1].strip().replace(",", "")
    if not gold:
        raise reader.error("answer", "has an empty final answer after '####'")
    return Problem(task=task, id=_index_id(task, split, reader), messages=math_messages(question), gold=gold,
                   meta={"solution": solution})


def math500(reader: RowReader, task: str, split: str) -> Problem:
    problem = reader.text("problem")
    gold = reader.answer_text("answer")
    pid = reader.row_id("unique_id", _index_id(task, split, reader))
    meta = {k: reader.row.data[k] for k in ("subject", "level") if reader.has(k)}
    return Problem(task=task, id=pid, messages=math_messages(problem), gold=gold, meta=meta)


def aime24(reader: RowReader, task: str, split: str) -> Problem:
    problem = reader.text("problem")
    if reader.has("answer"):
        gold = reader.answer_text("answer")
    else:
        from esreason.verifiers.extract import last_boxed

        solution = reader.answer_text("solution")
        boxed = last_boxed(solution)
        if boxed is not None and boxed.strip():
            gold = boxed.strip()
        elif _PLAIN_INT.match(solution):
            gold = solution
        else:
            raise reader.error("solution", "holds no \\boxed{} answer and is not a bare integer "
                                           "(and the row has no 'answer' field)")
    pid = reader.row_id("id", _index_id(task, split, reader))
    meta = {"url": reader.row.data["url"]} if reader.has("url") else {}
    return Problem(task=task, id=pid, messages=math_messages(problem), gold=gold, meta=meta)


def aime25(reader: RowReader, task: str, split: str) -> Problem:
    problem = reader.text("problem")
    gold = reader.answer_text("answer")
    pid = reader.row_id("id", _index_id(task, split, reader))
    return Problem(task=task, id=pid, messages=math_messages(problem), gold=gold)


def amc23(reader: RowReader, task: str, split: str) -> Problem:
    question = reader.text("question")
    gold = reader.answer_text("answer")
    pid = reader.row_id("id", _index_id(task, split, reader))
    meta = {"url": reader.row.data["url"]} if reader.has("url") else {}
    return Problem(task=task, id=pid, messages=math_messages(question), gold=gold, meta=meta)


def deepscaler(reader: RowReader, task: str, split: str) -> Problem:
    problem = reader.text("problem")
    gold = reader.answer_text("answer")
    return Problem(task=task, id=_index_id(task, split, reader), messages=math_messages(problem), gold=gold)
