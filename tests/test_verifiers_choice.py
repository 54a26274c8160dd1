"""Multiple-choice verifier: last box, wrappers stripped, letter from the valid set."""

from __future__ import annotations

import pytest

from esreason.errors import UserError
from esreason.verifiers.choice import make_scorer, normalize_choice, parse_gold

FR = 0.1


@pytest.mark.parametrize("response, gold, correct, formatted, extracted", [
    ("\\boxed{B}", "B", True, True, "B"),
    ("\\boxed{\\text{(B)}}", "B", True, True, "B"),
    ("\\boxed{\\textbf{B}.}", "B", True, True, "B"),
    ("\\boxed{(b)}", "B", True, True, "B"),                         # case-insensitive
    ("\\boxed{B)}", "B", True, True, "B"),
    ("$\\boxed{[C]}$", "C", True, True, "C"),
    ("\\boxed{A} ... actually \\boxed{D}", "D", True, True, "D"),    # last box wins
    ("\\boxed{D} ... actually \\boxed{A}", "D", False, True, "A"),
    ("The answer is (B).", "B", False, False, None),                 # no box: not formatted
    ("\\boxed{}", "B", False, False, None),
    ("\\boxed{B and C}", "B", False, True, None),                    # not one letter
    ("\\boxed{(B) 42}", "B", False, True, None),
    ("\\boxed{F}", "B", False, True, None),                          # outside A-E
    ("\\boxed{E}", {"answer": "B", "choices": "ABCD"}, False, True, None),
    ("\\boxed{D}", {"answer": "D", "choices": ["A", "B", "C", "D"]}, True, True, "D"),
])
def test_choice_table(response, gold, correct, formatted, extracted):
    v = make_scorer(FR)(response, gold)
    assert (v.correct, v.formatted, v.extracted) == (correct, formatted, extracted)
    assert v.reward == (1.0 if correct else FR if formatted else 0.0)


@pytest.mark.parametrize("gold", ["Z", "AB", "", 3, {"choices": "ABC"}, {"answer": "D", "choices": "ABC"},
                                  {"answer": "A", "choices": "AAB"}, {"answer": "A", "choices": 5}])
def test_bad_gold_is_a_user_error(gold):
    with pytest.raises(UserError):
        parse_gold(gold)


def test_normalize_choice():
    assert normalize_choice(" \\text{ ( c ) } ") == "C"
    assert normalize_choice("**A**") == "A"
