"""Math verifier: extraction, fast path, math-verify pool (deadline, restart, threads), vote keys."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
from bounds import TERMINATES_WITHIN_S

from esreason.errors import UserError
from esreason.verifiers import get
from esreason.verifiers.math import (compare, make_scorer, math_equivalent, normalize_math_answer,
                                     numbers_equal, plain_number)
from esreason.verifiers.mathpool import MathVerifyPool

FR = 0.1


@pytest.mark.parametrize("response, gold, correct, formatted, path", [
    ("... so \\boxed{1000}.", "1000", True, True, "fast"),
    ("\\boxed{1,000}", "1000", True, True, "fast"),                       # thousands comma
    ("\\boxed{1000}", "1,000", True, True, "fast"),
    ("\\boxed{1{,}000}", "1000", True, True, "fast"),
    ("first \\boxed{7}, no wait: \\boxed{8}", "8", True, True, "fast"),    # two boxes: last wins
    ("first \\boxed{8}, no wait: \\boxed{7}", "8", False, True, "fast"),
    ("\\boxed{\\$18.00}", "18", True, True, "fast"),
    ("\\boxed{-3}", "3", False, True, "fast"),
    ("\\boxed{72\\%}", "72", True, True, "fast"),
    ("\\boxed{50\\%}", "0.5", True, True, "fast"),                        # math-verify's percent rule
    ("\\boxed{\\text{5}}", "5", True, True, "fast"),
    ("\\boxed{2.50}", "2.5", True, True, "fast"),
    ("\\boxed{123456789012345678}", "123456789012345679", False, True, "fast"),  # exact integers
    ("The answer is 42.", "42", False, False, None),                      # only in the reasoning
    ("I think 42 but \\boxed{}", "42", False, False, None),               # empty box
    ("\\boxed{\\dfrac{1}{2}}", "\\frac{1}{2}", True, True, "text"),
    ("\\boxed{\\frac{1}{2}}", "0.5", True, True, "math-verify"),          # fraction vs decimal
    ("\\boxed{\\frac{\\sqrt{8}}{2}}", "\\sqrt{2}", True, True, "math-verify"),  # nested braces
    ("\\boxed{x^2+1}", "1+x^2", True, True, "math-verify"),
    ("\\boxed{\\frac{1}{3}}", "0.5", False, True, "math-verify"),
    ("\\boxed{\\text{(B)}}", "B", True, True, "math-verify"),
])
def test_math_scoring_table(response, gold, correct, formatted, path):
    v = make_scorer(FR)(response, gold)
    assert (v.correct, v.formatted) == (correct, formatted)
    assert v.reward == (1.0 if correct else FR if formatted else 0.0)
    assert v.extra.get("path") == path
    if not formatted:
        assert v.extracted is None


def test_reward_levels_follow_format_reward():
    s = get("math", format_reward=0.25)
    assert [s(r, "3").reward for r in ("\\boxed{3}", "\\boxed{4}", "3")] == [1.0, 0.25, 0.0]


@pytest.mark.parametrize("gold", [None, 1.5, ["3"], "", "   ", True])
def test_bad_gold_is_a_user_error(gold):
    with pytest.raises(UserError):
        make_scorer()("\\boxed{3}", gold)


@pytest.mark.parametrize("text, value", [
    ("42", (42, False)), ("-7", (-7, False)), ("1,234,567", (1234567, False)), ("3.25", ("13/4", False)),
    (".5", ("1/2", False)), ("\\$5", (5, False)), ("12\\%", (12, True)), ("7.", (7, False)),
    ("1,2", None), ("12,34", None), ("1e5", None), ("x", None), ("\\frac{1}{2}", None), ("", None),
])
def test_plain_number(text, value):
    got = plain_number(text)
    if value is None:
        assert got is None
    else:
        from fractions import Fraction
        assert got == (Fraction(value[0]), value[1])


def test_fast_path_skips_long_decimals():
    assert plain_number("0.1234567", max_decimals=6) is None
    assert plain_number("0.123456", max_decimals=6) is not None


def test_numbers_equal_percent_rule():
    from fractions import Fraction as F
    assert numbers_equal((F(50), True), (F(1, 2), False))
    assert numbers_equal((F(50), True), (F(50), False))
    assert not numbers_equal((F(50), True), (F(1, 2), True))


def test_fast_path_agrees_with_math_verify():
    """Every fast-path verdict on plain numbers matches what math-verify itself says."""
    pool = MathVerifyPool(size=1)
    pairs = [("1000", "1,000"), ("3", "3.0"), ("2.5", "2.50"), ("72", "72\\%"), ("0.5", "50\\%"), ("5", "\\$5"),
             ("7", "8"), ("-3", "3"), ("0.25", "0.250"), ("100", "10")]
    try:
        for gold, pred in pairs:
            out, path = compare(gold, pred)
            assert path == "fast"
            assert out.equal == pool.compare(gold, pred).equal, (gold, pred)
    finally:
        pool.close()


def test_fast_path_is_fast_and_never_touches_the_pool(monkeypatch):
    import esreason.verifiers.math as m

    def no_pool():
        raise AssertionError("the fast path must not use the pool")

    monkeypatch.setattr(m, "shared_pool", no_pool)
    s = make_scorer()
    for i in range(2000):  # its speed (~0.03 ms per call) is benchmarks/eval_throughput.py's, not a test's
        assert s(f"steps... \\boxed{{{i}}}", str(i)).correct


def test_pool_deadline_kills_and_replaces_a_hung_worker():
    pool = MathVerifyPool(size=1)
    try:
        assert pool.compare("0.5", "\\frac{1}{2}").equal
        first_pid = pool.worker_pids()[0]
        start = time.monotonic()
        out = pool.compare("10^{10^{10}}", "5", timeout_s=0.5)   # sympy needs seconds here
        assert out.status == "timeout"
        assert time.monotonic() - start < TERMINATES_WITHIN_S  # abandoned, not awaited (tests/bounds.py)
        assert pool.restarts == 1
        assert first_pid not in pool.worker_pids()
        with pytest.raises(ProcessLookupError):
            os.kill(first_pid, 0)                                  # really gone, not leaked
        assert pool.compare("\\sqrt{4}", "2").equal                 # a fresh worker answers
    finally:
        pool.close()


def test_pool_survives_a_worker_that_dies():
    pool = MathVerifyPool(size=1)
    try:
        assert pool.compare("x+1", "1+x").equal
        os.kill(pool.worker_pids()[0], signal.SIGKILL)
        assert pool.compare("2x", "x+x").equal     # retried on a new worker
        assert pool.restarts == 1
    finally:
        pool.close()


def test_scorer_reports_verify_timeout():
    v = make_scorer(FR, timeout_s=0.5)("\\boxed{10^{10^{10}}}", "5")
    assert (v.correct, v.formatted, v.reward, v.reason) == (False, True, FR, "verify timeout")


def test_math_verify_from_a_non_main_thread():
    results: list = []

    def work():
        results.append(make_scorer()("\\boxed{\\frac{2}{4}}", "0.5"))
        results.append(math_equivalent("\\frac{3}{6}", "0.5"))

    t = threading.Thread(target=work)
    t.start()
    t.join(timeout=60)
    assert not t.is_alive()
    assert results[0].correct and results[0].extra["path"] == "math-verify"
    assert results[1] is True


@pytest.mark.parametrize("answer, key", [
    ("1,000", "1000"), ("\\$1,000.50", "1000.5"), ("0.50", "0.5"), ("  42 .", "42"),
    ("\\text{ 5 }", "5"), ("\\dfrac{1}{2}", "\\frac{1}{2}"), ("\\left( 1, 2 \\right)", "(1,2)"),
    ("72\\%", "72%"), ("30^\\circ", "30"), ("\\boxed{3}", "3"), ("$x + 1$", "x+1"), ("1{,}234", "1234"),
])
def test_normalize_math_answer(answer, key):
    assert normalize_math_answer(answer) == key


def test_math_equivalent_groups_forms():
    assert math_equivalent("1,000", "1000")
    assert math_equivalent("\\frac12", "0.5")
    assert not math_equivalent("\\frac13", "0.5")
