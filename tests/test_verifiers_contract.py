"""The verifier contract across families: registry, three reward levels, picklable scorers."""

from __future__ import annotations

import pickle

import pytest

from esreason.errors import UserError
from esreason.verifiers import NAMES, get

# (correct response, formatted-but-wrong response, unformatted response, gold) per family
CASES = {
    "math": ("\\boxed{12}", "\\boxed{13}", "12", "12"),
    "choice": ("\\boxed{C}", "\\boxed{A}", "C", "C"),
    "hotpotqa": ("<answer>Paris</answer>", "<answer>Rome</answer>", "Paris", "Paris"),
    "countdown": ("<answer>(2+3)*4</answer>", "<answer>2+3+4</answer>", "(2+3)*4",
                  {"target": 20, "numbers": [2, 3, 4]}),
    "mbpp": ("```python\ndef sq(x):\n    return x * x\n```", "```python\ndef sq(x):\n    return x\n```",
             "def sq(x):\n    return x * x", {"tests": ["assert sq(3) == 9"]}),
}


def test_every_registered_verifier_has_cases():
    assert set(NAMES) == set(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_three_reward_levels(name):
    good, wrong, unformatted, gold = CASES[name]
    scorer = get(name, format_reward=0.2)
    verdicts = [scorer(r, gold) for r in (good, wrong, unformatted)]
    assert [v.reward for v in verdicts] == [1.0, 0.2, 0.0]
    assert [v.correct for v in verdicts] == [True, False, False]
    assert [v.formatted for v in verdicts] == [True, True, False]
    assert verdicts[2].extracted is None
    assert all(isinstance(v.reason, str) and v.reason for v in verdicts)


@pytest.mark.parametrize("name", sorted(CASES))
def test_scorers_pickle_and_still_score(name):
    good, _, _, gold = CASES[name]
    scorer = pickle.loads(pickle.dumps(get(name, format_reward=0.3)))
    assert scorer(good, gold).correct
    assert scorer.format_reward == 0.3


def test_unknown_verifier_is_a_user_error():
    with pytest.raises(UserError, match="unknown verifier"):
        get("nope")
