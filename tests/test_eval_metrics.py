"""Pass@k (unbiased estimator, product form) and pooled entropy."""

from __future__ import annotations

from fractions import Fraction
from math import comb

import pytest

from esreason.eval import pass_at_k, pooled_entropy


def exact_pass_at_k(n: int, c: int, k: int) -> Fraction:
    return 1 - Fraction(comb(n - c, k), comb(n, k))


def test_pass_at_k_matches_exact_definition_for_all_n_up_to_64():
    worst = 0.0
    for n in range(1, 65):
        for c in range(n + 1):
            for k in range(1, n + 1):
                worst = max(worst, abs(pass_at_k(n, c, k) - float(exact_pass_at_k(n, c, k))))
    assert worst < 1e-12


def test_pass_at_k_exact_values():
    assert pass_at_k(32, 0, 32) == 0.0
    assert pass_at_k(32, 1, 32) == 1.0  # n - c < k: every 32-subset holds the correct sample
    assert pass_at_k(10, 3, 8) == 1.0   # n - c = 7 < 8
    assert pass_at_k(32, 8, 1) == pytest.approx(8 / 32, abs=1e-15)
    assert pass_at_k(4, 2, 2) == pytest.approx(1 - 1 / 6, abs=1e-15)  # 1 - C(2,2)/C(4,2)


@pytest.mark.parametrize("n,c,k", [(4, 1, 5), (4, 5, 2), (4, 1, 0), (-1, 0, 1), (4, -1, 1), (4, 1, -2),
                                   (4.0, 1, 1), (4, True, 1), (0, 0, 1)])
def test_pass_at_k_rejects_bad_arguments(n, c, k):
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)


def test_pass_at_m_is_fraction_of_problems_with_a_correct_sample():
    counts = [0, 1, 5, 32, 0, 2, 31, 0]
    scores = [pass_at_k(32, c, 32) for c in counts]
    assert scores == [float(c > 0) for c in counts]
    assert sum(scores) / len(scores) == 5 / 8


def test_pass_at_k_is_monotone_in_k_and_c():
    for c in range(33):
        row = [pass_at_k(32, c, k) for k in range(1, 33)]
        assert all(a <= b + 1e-15 for a, b in zip(row, row[1:]))
    for k in (1, 16):
        col = [pass_at_k(32, c, k) for c in range(33)]
        assert all(a <= b + 1e-15 for a, b in zip(col, col[1:]))


def test_pooled_entropy_weights_tokens_not_responses():
    # Two responses: 1 token with entropy 3.0, 3 tokens with entropy sum 3.0 (1.0 each).
    assert pooled_entropy([3.0, 3.0], [1, 3]) == pytest.approx(6.0 / 4)
    # The per-response mean would be (3.0 + 1.0) / 2 = 2.0: the pooled value differs on purpose.
    assert pooled_entropy([3.0, 3.0], [1, 3]) != pytest.approx(2.0)
    assert pooled_entropy([0.0, 0.0], [0, 0]) is None
    assert pooled_entropy(None, [1, 2]) is None
    with pytest.raises(ValueError):
        pooled_entropy([1.0], [1, 2])
