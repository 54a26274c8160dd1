"""MBPP verifier — one Python code block, run against the tests in the sandbox.

Paper, appendix "Prompt Templates" (MBPP code generation): "Output exactly one
Python markdown code block containing only the final solution code"; scoring uses
"one Python code block for MBPP". The dataset is ``google-research-datasets/mbpp``
(sanitized test split).

Gold format: a mapping with

- ``"tests"``: non-empty list of test statements (usually ``assert f(x) == y``);
  the MBPP field name ``"test_list"`` is accepted too;
- ``"setup"`` (optional): code run after the solution and before the tests (MBPP's
  ``test_setup_code``; a list of lines is joined); ``"test_setup_code"`` and
  ``"test_imports"`` (MBPP sanitized, a list of import lines) are accepted too.

Extraction: the last closed Markdown fence labelled ``python``/``py``/``python3``
or unlabelled (:func:`esreason.verifiers.extract.last_python_block`). The prompt
asks for exactly one block; when a response has several, the last one is taken (a
model that drafts and then corrects ends with its final code). Blocks in other
languages are ignored. ``formatted`` = such a block exists and is not blank.

Execution (:mod:`esreason.verifiers.sandbox`): program, then setup, then each test
separately in one fresh sandboxed interpreter, each under its own timer, so
``extra["passed"]`` is the per-test pass/fail vector. ``correct`` = the program
loaded and every test passed. The Maj@K vote key is that vector
(:func:`mbpp_vote_key`); an unformatted response abstains.
"""

from __future__ import annotations

from typing import Any

from esreason.errors import UserError
from esreason.verifiers.base import Verdict, reward_for
from esreason.verifiers.extract import last_python_block
from esreason.verifiers.sandbox import SandboxConfig, SandboxLimits, run_tests

_KEPT_OUTPUT = 2000  # characters of stdout/stderr kept in Verdict.extra


def parse_gold(gold: Any) -> tuple[list[str], str]:
    """``(tests, setup)`` from an MBPP gold mapping; UserError naming the problem otherwise."""
    if not isinstance(gold, dict):
        raise UserError(f"mbpp gold must be a mapping with 'tests', got {type(gold).__name__}")
    tests = gold.get("tests", gold.get("test_list"))
    if not isinstance(tests, (list, tuple)) or not tests or not all(isinstance(t, str) and t.strip() for t in tests):
        raise UserError(f"mbpp gold 'tests' must be a non-empty list of test statements, got {tests!r}"[:300])
    parts: list[str] = []
    for key in ("test_imports", "setup", "test_setup_code"):
        value = gold.get(key)
        if value is None:
            continue
        if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
            value = "\n".join(value)
        if not isinstance(value, str):
            raise UserError(f"mbpp gold {key!r} must be a string or a list of strings, got {value!r}"[:300])
        parts.append(value)
    return list(tests), "\n".join(p for p in parts if p.strip())


def _reason(passed: list[bool], errors: list[str | None], loaded: bool, load_error: str | None,
            timed_out: bool) -> str:
    n, k = len(passed), sum(passed)
    if k == n and loaded:
        return f"all {n} tests passed"
    if not loaded:
        what = "timed out" if timed_out and load_error == "NoResult" else f"failed ({load_error})"
        return f"program {what}"
    first = next(i for i, ok in enumerate(passed) if not ok)
    tail = " (wall-clock timeout)" if timed_out else ""
    return f"{k}/{n} tests passed; test {first}: {errors[first]}{tail}"


class MbppScorer:
    """``score(response, gold) -> Verdict`` running the code in the sandbox (picklable)."""

    def __init__(self, format_reward: float = 0.1, config: SandboxConfig | None = None) -> None:
        self.format_reward = float(format_reward)
        self.config = config or SandboxConfig()

    def __call__(self, response: str, gold: Any) -> Verdict:
        tests, setup = parse_gold(gold)
        code = last_python_block(response)
        if code is None or not code.strip():
            return Verdict(0.0, False, None, "no python code block" if code is None else "empty code block",
                           formatted=False, extra={"passed": [False] * len(tests)})
        result = run_tests(code, tests, setup, self.config)
        ok = result.all_passed
        extra = {"passed": list(result.passed), "errors": list(result.errors), "loaded": result.loaded,
                 "timed_out": result.timed_out, "duration_s": round(result.duration_s, 4),
                 "stdout": result.stdout[:_KEPT_OUTPUT], "stderr": result.stderr[-_KEPT_OUTPUT:],
                 "sandbox": result.layers}
        return Verdict(reward_for(ok, True, self.format_reward), ok, code,
                       _reason(result.passed, result.errors, result.loaded, result.load_error, result.timed_out),
                       formatted=True, extra=extra)


def mbpp_vote_key(verdict: Verdict) -> tuple[bool, ...] | None:
    """Maj@K vote key: the per-test pass/fail vector; None (abstain) when the response was unformatted."""
    if not verdict.formatted:
        return None
    return tuple(bool(x) for x in verdict.extra.get("passed", ()))


def make_scorer(format_reward: float = 0.1, *, timeout_s: float = 10.0, test_timeout_s: float = 3.0,
                memory_bytes: int = 1 << 30) -> MbppScorer:
    """The MBPP scorer; the keyword arguments set the sandbox limits (see SandboxLimits)."""
    limits = SandboxLimits(timeout_s=timeout_s, test_timeout_s=test_timeout_s, memory_bytes=memory_bytes)
    return MbppScorer(format_reward, SandboxConfig(limits=limits))
