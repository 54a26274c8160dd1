"""Maj@k: tie rule, abstentions, equivalence grouping, group scoring, expected mode, task vote keys."""

from __future__ import annotations

import itertools
import random
from fractions import Fraction

import pytest

from esreason.eval import maj_at_k
from esreason.eval.answers import equivalence, vote_key
from esreason.eval.voting import expected_majority, group_answers, group_correctness, majority_winner
from esreason.tasks.base import Task
from esreason.verifiers.base import Verdict


def test_plurality_over_first_k_only():
    answers = ["7", "7", "3", "3", "3", "3"]
    correct = [True, True, False, False, False, False]
    assert maj_at_k(answers, correct, 2) == 1.0   # first two: "7" twice
    assert maj_at_k(answers, correct, 5) == 0.0   # "3" x3 beats "7" x2
    assert maj_at_k(answers, correct, 6) == 0.0


def test_tie_goes_to_the_answer_that_appears_first():
    assert maj_at_k(["5", "9", "9", "5"], [True, False, False, True], 4) == 1.0   # 2-2, "5" first
    assert maj_at_k(["9", "5", "5", "9"], [False, True, True, False], 4) == 0.0   # 2-2, "9" first
    assert maj_at_k(["9", "5"], [False, True], 2) == 0.0


def test_abstentions_do_not_vote_and_all_abstain_scores_zero():
    # Three abstentions would "win" if None voted; the single real answer wins instead.
    assert maj_at_k([None, None, None, "4"], [False, False, False, True], 4) == 1.0
    assert maj_at_k([None, None, "1", "2", "2"], [False, False, True, False, False], 3) == 1.0
    assert maj_at_k([None, None, None], [False, False, False], 3) == 0.0
    assert maj_at_k([None, "4"], [False, True], 1) == 0.0  # the only voted sample abstains


def test_equivalence_groups_answers_by_first_representative():
    def same_number(a, b):
        return float(a) == float(b)

    answers = ["0.5", "1/2x", "3", "0.50", "3", ".5"]
    correct = [True, False, False, True, False, True]
    # Without equivalence: "3" (x2) beats each spelling of 0.5 (x1 each).
    assert maj_at_k(answers[:5], correct[:5], 5) == 0.0
    ids = group_answers(["0.5", "3", "0.50", ".5"], same_number)
    assert ids == [0, 1, 0, 0]
    assert maj_at_k(["0.5", "3", "0.50", "3", ".5"], [True, False, True, False, True], 5,
                    equivalent=same_number) == 1.0
    calls = []

    def counting(a, b):
        calls.append((a, b))
        return a == b.strip()

    group_answers(["x", " x", " x", "y"], counting)
    assert calls == [("x", " x"), ("x", "y")]  # representative first; each new key checked once


def test_group_with_disagreeing_verdicts_is_scored_by_majority_then_first():
    ids = [0, 0, 0, 1, 1]
    assert group_correctness(ids, [True, False, True, False, False]) == [True, False]   # 2 of 3
    assert group_correctness(ids, [False, True, True, True, False]) == [True, True]     # 2 of 3; 1-1 -> first
    assert group_correctness([0, 0], [True, False]) == [True]     # tie: first sample's verdict
    assert group_correctness([0, 0], [False, True]) == [False]
    assert maj_at_k(["a", "a", "b"], [False, True, True], 3) == 0.0   # group "a" tie -> its first: wrong


def test_majority_winner():
    assert majority_winner([None, 2, 1, 1, 2]) == 2  # tie 2-2, group 2 seen first in this slice
    assert majority_winner([None, None]) is None
    assert majority_winner([3]) == 3


def _brute_force_expected(answers, correct, k):
    n = len(answers)
    ids = group_answers(answers)
    ok = group_correctness(ids, correct)
    total = Fraction(0)
    subsets = list(itertools.combinations(range(n), k))
    for subset in subsets:
        w = majority_winner([ids[i] for i in subset])
        total += w is not None and ok[w]
    return total / len(subsets)


def test_expected_mode_equals_brute_force_over_all_subsets():
    rng = random.Random(1)
    for _ in range(250):
        n = rng.randint(1, 10)
        vocabulary = ["a", "b", "c", "d"][:rng.randint(1, 4)]
        answers = [rng.choice(vocabulary + [None]) for _ in range(n)]
        correct = [a in ("a", "c") if rng.random() < 0.9 else rng.random() < 0.5 for a in answers]
        k = rng.randint(1, n)
        ids = group_answers(answers)
        exact = expected_majority(ids, group_correctness(ids, correct), k)
        assert exact == _brute_force_expected(answers, correct, k)
        assert maj_at_k(answers, correct, k, mode="expected") == pytest.approx(float(exact), abs=1e-15)


def test_expected_mode_special_cases():
    answers = ["1", "2", None, "1", "3", "1", "2", None]
    correct = [a == "1" for a in answers]
    # k = n: one subset, the first-k vote.
    assert maj_at_k(answers, correct, 8, mode="expected") == maj_at_k(answers, correct, 8)
    # k = 1: a random single sample; abstentions score 0.
    assert maj_at_k(answers, correct, 1, mode="expected") == pytest.approx(3 / 8)
    # Large n runs exactly and fast (32 samples, K = 16).
    rng = random.Random(0)
    big = [rng.choice(["x", "y", "z", None]) for _ in range(32)]
    value = maj_at_k(big, [a == "x" for a in big], 16, mode="expected")
    assert 0.0 <= value <= 1.0


def test_maj_at_k_rejects_bad_arguments():
    with pytest.raises(ValueError):
        maj_at_k(["a"], [True, False], 1)
    with pytest.raises(ValueError):
        maj_at_k(["a", "b"], [True, False], 3)
    with pytest.raises(ValueError):
        maj_at_k(["a", "b"], [True, False], 0)
    with pytest.raises(ValueError):
        maj_at_k(["a", "b"], [True, False], 1, mode="random")


def _task(verifier: str, **kw) -> Task:
    return Task(name=f"t-{verifier}", verifier=verifier, loader=lambda split, path: [], **kw)


def test_countdown_votes_by_value_of_valid_expressions():
    task = _task("countdown", vote_key=lambda a: None if a is None else a.strip())
    gold = {"target": 13, "numbers": [3, 4, 1]}

    def verdict(expr):
        return Verdict(0.1, False, expr, "", formatted=expr is not None)

    k1 = vote_key(task, verdict("3*4+1"), gold)
    k2 = vote_key(task, verdict("1+4*3"), gold)
    k3 = vote_key(task, verdict("3*4-1"), gold)
    assert k1 == k2 == "value:13" and k3 == "value:11"
    assert vote_key(task, verdict("3*4"), gold) == "expr:3*4"       # invalid (1 unused): votes as text
    assert vote_key(task, verdict(None), gold) is None               # no <answer>: abstains


def test_mbpp_votes_by_pass_fail_vector():
    task = _task("mbpp")
    gold = {"tests": ["assert f(1) == 1", "assert f(2) == 4", "assert f(3) == 9"]}
    a = Verdict(0.1, False, "def f(x): return x", "", formatted=True, extra={"passed": [True, False, False]})
    b = Verdict(0.1, False, "def f(x):\n    return x", "", formatted=True, extra={"passed": [True, False, False]})
    c = Verdict(1.0, True, "def f(x): return x*x", "", formatted=True, extra={"passed": [True, True, True]})
    none = Verdict(0.0, False, None, "", formatted=False, extra={"passed": [False, False, False]})
    assert vote_key(task, a, gold) == vote_key(task, b, gold) == "tests:100"
    assert vote_key(task, c, gold) == "tests:111"
    assert vote_key(task, none, gold) is None


def test_math_groups_by_equivalence_and_other_tasks_by_key():
    math_task = _task("math", vote_key=lambda a: a)
    same = equivalence(math_task)
    assert same is not None and same("1,000", "1000") and not same("1000", "1001")
    custom = _task("math", equivalent=lambda a, b: True)
    assert equivalence(custom)("1", "2") is True
    assert equivalence(_task("choice")) is None
    choice = _task("choice", vote_key=lambda a: None if a is None else a.upper())
    assert vote_key(choice, Verdict(0.1, False, "b", "", formatted=True), "A") == "B"
    assert vote_key(choice, Verdict(0.0, False, None, "", formatted=False), "A") is None
