"""TRL-style reward functions as scorers: TRL's contract, TRL's combination, one call per batch, clear errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from esreason.errors import UserError
from esreason.verifiers.batch import score_texts
from esreason.verifiers.reward_functions import RewardFunctionError, RewardFunctions, Row


def rows(n: int, conversational: bool = False) -> list[Row]:
    prompt = (lambda i: [{"role": "user", "content": f"q{i}"}]) if conversational else (lambda i: f"q{i}")
    return [Row(prompt(i), {"answer": str(i), "weight": i}) for i in range(n)]


def test_columns_arrive_as_keyword_lists_with_trls_arguments():
    seen = {}

    def reward(prompts, completions, completion_ids, answer, weight, **kwargs):
        seen.update(prompts=prompts, completions=completions, completion_ids=completion_ids, answer=answer,
                    weight=weight, extra=sorted(kwargs))
        return [float(c == a) for c, a in zip(completions, answer)]

    verdicts = RewardFunctions(reward).score_batch(["0", "x", "2"], rows(3))
    assert seen["prompts"] == ["q0", "q1", "q2"] and seen["completions"] == ["0", "x", "2"]
    assert seen["answer"] == ["0", "1", "2"] and seen["weight"] == [0, 1, 2]
    assert seen["extra"] == ["log_extra", "log_metric", "trainer_state"]
    assert seen["completion_ids"] == [[], [], []]  # no tokenizer given
    assert [v.reward for v in verdicts] == [1.0, 0.0, 1.0] and [v.correct for v in verdicts] == [True, False, True]


def test_conversational_prompts_get_completions_as_messages_as_in_trl():
    got = []

    def reward(completions, **_):
        got.extend(completions)
        return [1.0] * len(completions)

    RewardFunctions(reward).score_batch(["a", "b"], rows(2, conversational=True))
    assert got == [[{"role": "assistant", "content": "a"}], [{"role": "assistant", "content": "b"}]]


def test_completion_ids_are_the_texts_tokenised():
    from esreason.backends.hf import load_model

    _, tok = load_model("demo", "float32", "cpu")
    got = []

    def reward(completion_ids, **_):
        got.extend(completion_ids)
        return [0.0] * len(completion_ids)

    RewardFunctions(reward, tokenizer=tok).score_batch(["12+3", "7"], rows(2))
    assert got == [tok("12+3", add_special_tokens=False)["input_ids"], tok("7", add_special_tokens=False)["input_ids"]]


def test_weights_and_none_combine_as_trls_sum_then_normalize():
    """TRL 1.16: rewards_per_func (None -> NaN) times weights, nansum over functions; all-None rows NaN."""
    a = [1.0, None, 0.5, None]
    b = [0.0, 2.0, None, None]
    scorer = RewardFunctions([lambda **_: a, lambda **_: b], weights=[2.0, 0.5])
    got = scorer.rewards(["x"] * 4, rows(4))
    per_func = torch.tensor([[math.nan if v is None else v for v in col] for col in (a, b)], dtype=torch.float32).T
    trl = (per_func * torch.tensor([2.0, 0.5]).unsqueeze(0)).nansum(dim=1)  # TRL's formula
    trl[torch.isnan(per_func).all(dim=1)] = torch.nan
    assert np.allclose(got[:3], trl.numpy()[:3]) and math.isnan(got[3]) and bool(torch.isnan(trl[3]))
    verdicts = scorer.score_batch(["x"] * 4, rows(4))
    assert verdicts[3].correct is False and verdicts[3].reason == "no reward function scored it"


def test_pass_threshold_decides_correct_and_answer_fn_gives_the_vote_key():
    scorer = RewardFunctions(lambda completions, **_: [0.5, 0.8, 1.0], pass_threshold=0.8,
                             answer_fn=lambda text: None if text == "?" else int(text))
    verdicts = scorer.score_batch(["1", "?", "3"], rows(3))
    assert [v.correct for v in verdicts] == [False, True, True]
    assert [v.extracted for v in verdicts] == ["1", None, "3"]
    assert [v.formatted for v in verdicts] == [True, False, True] and scorer.votes


def test_one_call_per_function_per_batch():
    calls = []
    scorer = RewardFunctions([lambda completions, **_: calls.append(len(completions)) or [1.0] * len(completions)])
    score_texts(scorer, ["a"] * 16, rows(16))
    assert calls == [16]


@pytest.mark.parametrize("returned, message", [
    ([1.0], r"reward function 'bad' returned 1 rewards for 3 completions \(row 1 is the first without one\)"),
    ([1.0, float("nan"), 0.0], r"reward function 'bad' returned nan for row 1: rewards must be finite"),
    ([1.0, 0.0, float("inf")], r"reward function 'bad' returned inf for row 2"),
    ([1.0, "high", 0.0], r"reward function 'bad' returned 'high' \(str\) for row 1: expected a number or None"),
    (0.5, r"reward function 'bad' returned float, expected a list of 3 rewards"),
])
def test_bad_outputs_name_the_function_and_the_first_bad_row(returned, message):
    def bad(**_):
        return returned

    with pytest.raises(RewardFunctionError, match=message):
        RewardFunctions(bad).score_batch(["a", "b", "c"], rows(3))


def test_a_raising_function_is_named_with_its_error():
    def broken(completions, **_):
        raise KeyError("total")

    with pytest.raises(RewardFunctionError, match=r"reward function 'broken' raised KeyError: 'total'"):
        RewardFunctions(broken).score_batch(["a"], rows(1))


def test_bad_arguments_are_refused_before_anything_runs():
    with pytest.raises(UserError, match="2 weights for 1 reward functions"):
        RewardFunctions(lambda **_: [], weights=[1.0, 2.0])
    with pytest.raises(UserError, match="3 is not callable"):
        RewardFunctions([3])
    for hub_id in ("org/some-reward-model", ["org/some-reward-model"]):  # TRL's reward-model habit
        with pytest.raises(UserError, match=r"reward_funcs: 'org/some-reward-model' is a string; TRL loads a string "
                                            r"as a reward model .* which esreason does not support: give a reward "
                                            r"function"):
            RewardFunctions(hub_id)

    async def later(**_):
        return []

    with pytest.raises(UserError, match="is async"):
        RewardFunctions(later)


def test_a_member_without_any_scored_completion_is_an_error_and_nan_is_left_out_of_the_mean():
    from esreason.backends.base import PopulationResult

    r = np.array([[1.0, np.nan, 0.0], [0.5, 0.5, 0.5]])
    res = PopulationResult(r, r == 1, r > 0, 0)
    assert np.allclose(res.member_rewards, [0.5, 0.5])
    r2 = np.array([[np.nan, np.nan], [1.0, 0.0]])
    with pytest.raises(UserError, match="population member 0"):
        PopulationResult(r2, r2 == 1, r2 > 0, 0).member_rewards
