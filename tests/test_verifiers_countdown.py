"""Countdown verifier: AST walker over Fractions, multiset rule, hostile expressions rejected instantly."""

from __future__ import annotations

import time
from fractions import Fraction

import pytest
from bounds import TERMINATES_WITHIN_S

from esreason.errors import UserError
from esreason.verifiers.countdown import Rejected, countdown_value, evaluate, make_scorer

FR = 0.1
GOLD = {"target": 24, "numbers": [4, 6, 1]}


def ans(expr: str) -> str:
    return f"<think>...</think> <answer>{expr}</answer>"


@pytest.mark.parametrize("response, correct, formatted, reason_part", [
    (ans("4 * 6 * 1"), True, True, "correct"),
    (ans("(6 - 1 - 1) * 4 + 8"), False, True, "numbers must be"),
    (ans("(4 * 6) / 1"), True, True, "correct"),
    (ans("4 * (6 / 1)"), True, True, "correct"),
    (ans("4 + 6 + 1"), False, True, "evaluates to 11"),
    (ans("4 * 6"), False, True, "missing [1]"),                          # a number missing
    (ans("4 * 6 * 1 * 1"), False, True, "reused [1]"),                   # a number reused
    (ans("4 * 6 * 1 + 6 - 6"), False, True, "reused [6, 6]"),
    (ans("24"), False, True, "numbers must be"),
    (ans("4 * 6 / (1 - 1)"), False, True, "division by zero"),          # formatted, wrong
    (ans("99**98**97"), False, True, "Pow"),                             # rejected instantly
    (ans("4 ^ 6 ^ 1"), False, True, "BitXor"),
    (ans("4 * 6 // 1"), False, True, "FloorDiv"),
    (ans("-4 * -6 * 1"), False, True, "unary"),
    (ans("4.0 * 6 * 1"), False, True, "integer literals"),
    (ans("True * 24"), False, True, "integer literals"),
    (ans("__import__('os').system('echo pwned')"), False, True, "Call"),
    (ans("(lambda: 24)()"), False, True, "Call"),
    (ans("x * 6 * 1"), False, True, "Name"),
    (ans("4 * 6 * 1 = 24"), False, True, "not an arithmetic expression"),
    (ans("[4, 6, 1]"), False, True, "List"),
    (ans("9" * 400 + " * 4 * 6 * 1"), False, True, "literal larger"),    # huge literal
    (ans("1" + "+1" * 300), False, True, "longer than"),
    (ans("(" * 150 + "4*6*1" + ")" * 150), True, True, "correct"),                # deep but valid
    (ans("(" * 250 + "4*6*1" + ")" * 250), False, True, "not an arithmetic expression"),  # parser limit
    (ans("4" + "+4" * 100), False, True, "syntax nodes"),
    (ans(""), False, False, "empty"),
    ("4 * 6 * 1 = 24", False, False, "no <answer>"),                      # right answer, no tags
    (ans("4 + 6 + 1") + " wait " + ans("4 * 6 * 1"), True, True, "correct"),  # last block wins
])
def test_countdown_table(response, correct, formatted, reason_part):
    start = time.perf_counter()
    v = make_scorer(FR)(response, GOLD)
    assert time.perf_counter() - start < TERMINATES_WITHIN_S  # bounded, not a speed claim (tests/bounds.py)
    assert (v.correct, v.formatted) == (correct, formatted)
    assert v.reward == (1.0 if correct else FR if formatted else 0.0)
    assert reason_part in v.reason


def test_exact_fraction_arithmetic():
    # 8 / (3 - 8/3) = 24 needs exact rational arithmetic (floats give 23.999999999999993)
    v = make_scorer()(ans("8 / (3 - 8 / 3)"), {"target": 24, "numbers": [8, 3, 8, 3]})
    assert v.correct


def test_huge_power_is_rejected_without_evaluating():
    start = time.perf_counter()
    with pytest.raises(Rejected):
        evaluate("99**98**97")
    with pytest.raises(Rejected):
        evaluate("9" * 5000)
    assert time.perf_counter() - start < TERMINATES_WITHIN_S  # evaluating would never end (tests/bounds.py)


def test_countdown_value_is_the_vote_key():
    assert countdown_value("6 * 4 * 1", [4, 6, 1]) == Fraction(24)
    assert countdown_value("(6 - 4) / 4", [4, 4, 6]) == Fraction(1, 2)
    assert countdown_value("6 * 4", [4, 6, 1]) is None          # invalid use of numbers abstains
    assert countdown_value("6 / 0", None) is None
    assert countdown_value(None, [1]) is None
    assert countdown_value("6 * 4") == Fraction(24)             # no multiset check without numbers


@pytest.mark.parametrize("gold", [None, {"target": 3}, {"target": "3", "numbers": [1, 2]},
                                  {"target": 3, "numbers": []}, {"target": 3, "numbers": [1, -2]},
                                  {"target": 3, "numbers": [1.5, 2]}, {"target": True, "numbers": [1]}])
def test_bad_gold_is_a_user_error(gold):
    with pytest.raises(UserError):
        make_scorer()(ans("1+2"), gold)
