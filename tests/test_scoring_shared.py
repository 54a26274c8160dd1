"""The entropy scorer's shared-prompt path: rows behind one prompt forward the
prompt once; the numbers equal scoring every row by itself up to float32 summation order."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from esreason.backends.scoring import EntropyScorer


@pytest.fixture(scope="module")
def demo():
    from esreason.backends.hf import load_model

    return load_model("demo")


def _rows(tok):
    prompts = [tok(text, add_special_tokens=False)["input_ids"] for text in
               ("What is 12+34? Answer:", "Compute 7-3.", "Add 101 and 202, then box it.", "Alone.", "Also alone")]
    responses = ["46, boxed {46}", "4", "303", "", "1+1=2 so \\boxed{2}", "4 because 7-3=4", "x", "303!!",
                 "the sum is 303"]
    groups = [0, 1, 2, 0, 0, 1, 1, 2, 2]  # prompt of each of the first nine rows: three shared groups
    rows_p = [prompts[g] for g in groups] + [prompts[3], prompts[4]]
    rows_r = [tok(r, add_special_tokens=False)["input_ids"] for r in responses] + [
        tok("just one row", add_special_tokens=False)["input_ids"], tok("z", add_special_tokens=False)["input_ids"]]
    return rows_p, rows_r


@pytest.mark.parametrize("tokens_per_forward", [16384, 40])
def test_shared_prompts_equal_scoring_each_row_alone(demo, tokens_per_forward):
    model, tok = demo
    prompts, responses = _rows(tok)
    scorer = EntropyScorer(model, tokens_per_forward=tokens_per_forward, slice_tokens=5)
    got = scorer.entropy_sums(prompts, responses, 0.7)
    alone = EntropyScorer(model, slice_tokens=5)
    with torch.inference_mode():  # every row by itself: one full forward of its prompt + response
        want = [alone._score_batch([p], [r], 0.7)[0] if r else 0.0 for p, r in zip(prompts, responses)]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)  # float32 summation order only
    unshared = EntropyScorer(model, tokens_per_forward=tokens_per_forward, slice_tokens=5, share_prompts=False)
    np.testing.assert_allclose(unshared.entropy_sums(prompts, responses, 0.7), want, rtol=1e-5, atol=1e-6)
    assert unshared.shared_forwards == 0
    assert got[3] == 0.0 and got[2] > 0  # an empty response scores 0; a one-token response its first step
    # three groups share a prompt; a small budget splits them into more prompt forwards
    assert scorer.shared_forwards == 3 if tokens_per_forward == 16384 else scorer.shared_forwards > 3


def test_a_one_token_response_is_the_prompts_last_position(demo):
    model, tok = demo
    p = tok("What is 2+2?", add_special_tokens=False)["input_ids"]
    r = tok("4", add_special_tokens=False)["input_ids"]
    scorer = EntropyScorer(model)
    shared = scorer.entropy_sums([p, p], [r, r], 1.0)
    assert scorer.shared_forwards == 1 and shared[0] == shared[1]
    with torch.inference_mode():
        assert shared[0] == pytest.approx(scorer._score_batch([p], [r], 1.0)[0], rel=1e-5)
