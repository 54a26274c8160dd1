"""MBPP (sanitized test split) — Python code generation, held-out suites.

Source (paper table "Licenses"): ``google-research-datasets/mbpp``, config
``sanitized``, split ``test``: ``source_file``, ``task_id``, ``prompt``, ``code``,
``test_imports`` (list of import lines), ``test_list`` (assert statements). The
``full`` config's layout is accepted too (``text`` instead of ``prompt``,
``test_setup_code``, ``challenge_test_list`` ignored).

Prompt: the paper's "Prompt for MBPP Code Generation", user message
``Task: <prompt>`` newline ``Test Cases: <public tests>``. The paper does not say
which tests are public. Here the first ``PUBLIC_TESTS`` (= 1) test of ``test_list``
is shown: it fixes the function name and signature the system prompt asks the model
to match, and the other tests stay hidden so that passing them measures the
solution rather than copying expected values. Scoring runs all tests of
``test_list`` (the shown one included). Gold (``mbpp`` verifier):
``{"tests": test_list, "setup": test_imports + test_setup_code joined by newlines}``;
``meta["public_tests"]`` holds the shown tests, ``meta["reference_code"]`` the
dataset's solution.
"""

from __future__ import annotations

from esreason.tasks.base import Problem
from esreason.tasks.prompts import mbpp_messages
from esreason.tasks.sources import RowReader

PUBLIC_TESTS = 1


def split_tests(tests: list[str], public: int = PUBLIC_TESTS) -> tuple[list[str], list[str]]:
    """``(shown, scored)``: the first ``public`` tests, and all tests."""
    return list(tests[:public]), list(tests)


def mbpp(reader: RowReader, task: str, split: str) -> Problem:
    text = reader.text("prompt") if reader.has("prompt") or not reader.has("text") else reader.text("text")
    tests = reader.str_list("test_list")
    setup_parts: list[str] = []
    if reader.has("test_imports"):
        setup_parts.extend(reader.str_list("test_imports", min_len=0))
    if reader.has("test_setup_code"):
        setup_parts.append(reader.text("test_setup_code", allow_empty=True))
    shown, scored = split_tests(tests)
    pid = reader.row_id("task_id", f"{task}-{split}-{reader.row.index}")
    meta = {"public_tests": shown}
    if reader.has("code"):
        meta["reference_code"] = reader.text("code")
    return Problem(task=task, id=pid, messages=mbpp_messages(text, shown),
                   gold={"tests": scored, "setup": "\n".join(p for p in setup_parts if p.strip())}, meta=meta)
