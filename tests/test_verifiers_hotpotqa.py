"""HotpotQA verifier: last <answer> block, official normalisation, EM reward, F1 with the yes/no rule."""

from __future__ import annotations

import pytest

from esreason.errors import UserError
from esreason.verifiers.hotpotqa import f1_score, make_scorer, normalize_answer

FR = 0.1


@pytest.mark.parametrize("response, gold, correct, formatted, f1", [
    ("<answer>The Eiffel Tower.</answer>", "eiffel tower", True, True, 1.0),
    ("<answer> Paris </answer>", "Paris", True, True, 1.0),
    ("<answer>London</answer> no, <answer>Paris</answer>", "Paris", True, True, 1.0),   # last block
    ("<answer>Paris</answer> no, <answer>London</answer>", "Paris", False, True, 0.0),
    ("<answer>the city of Paris</answer>", "Paris", False, True, 0.5),
    ("<answer>yes</answer>", "no", False, True, 0.0),
    ("<answer>no</answer>", "no way", False, True, 0.0),      # yes/no rule: F1 0 although a token matches
    ("<answer>NO.</answer>", "no", True, True, 1.0),
    ("Paris", "Paris", False, False, 0.0),                    # no tags
    ("<answer>  </answer>", "Paris", False, False, 0.0),
    ("<answer>Barack Obama</answer>", ["Obama", "Barack Obama"], True, True, 1.0),   # aliases
])
def test_hotpotqa_table(response, gold, correct, formatted, f1):
    v = make_scorer(FR)(response, gold)
    assert (v.correct, v.formatted) == (correct, formatted)
    assert v.reward == (1.0 if correct else FR if formatted else 0.0)
    assert v.extra["f1"] == pytest.approx(f1)
    assert v.extra["em"] == float(correct)
    if formatted:
        assert f"F1 {f1:.3f}" in v.reason


@pytest.mark.parametrize("text, key", [
    ("The  Quick, brown fox!", "quick brown fox"), ("An apple a day", "apple day"),
    ("theater", "theater"), ("U.S.A.", "usa"), ("  ", ""),
])
def test_normalize_answer(text, key):
    assert normalize_answer(text) == key


def test_f1_partial_overlap():
    # pred tokens {new, york, city}, gold {new, york}: P 2/3, R 1 -> F1 0.8
    assert f1_score("New York City", "new york") == pytest.approx(0.8)
    assert f1_score("noanswer", "yes") == 0.0
    assert f1_score("yes", "yes") == 1.0


@pytest.mark.parametrize("gold", [None, 3, [], [""], "  ", {"answer": "x"}])
def test_bad_gold_is_a_user_error(gold):
    with pytest.raises(UserError):
        make_scorer()("<answer>x</answer>", gold)
