"""Per-problem sampled-evaluation metrics: Pass@K and token-level entropy.

Paper, appendix "Evaluation Metrics": for a problem with ``M`` retained responses of
which ``c`` are verifier-correct, Pass@1 = c / M and, for K <= M, Pass@K is the
without-replacement estimator

    Pass@K = 1 - C(M - c, K) / C(M, K),

so Pass@M is 1 exactly when at least one response is correct. We evaluate the ratio
of binomials in the product form of Chen et al. (2021),

    C(M - c, K) / C(M, K) = prod_{i = M - c + 1}^{M} (1 - K / i),

which never forms a large binomial coefficient (C(64, 32) ~ 1.8e18 overflows float
precision). Maj@K lives in :mod:`esreason.eval.voting`.
"""

from __future__ import annotations

from typing import Sequence


def _check_int(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased Pass@k from ``n`` samples with ``c`` correct (paper, appendix "Evaluation Metrics").

    Returns ``1 - prod_{i=n-c+1}^{n} (1 - k/i)``; exactly 1.0 when ``n - c < k`` (every
    k-subset contains a correct sample) and exactly 0.0 when ``c == 0``.
    Raises ValueError when an argument is negative or not an integer, ``k < 1``,
    ``k > n`` or ``c > n``.
    """
    _check_int("n", n)
    _check_int("c", c)
    _check_int("k", k)
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if k > n:
        raise ValueError(f"k={k} exceeds the number of samples n={n}")
    if c > n:
        raise ValueError(f"c={c} correct samples exceed n={n}")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def pooled_entropy(entropy_sums: Sequence[float] | None, num_tokens: Sequence[int]) -> float | None:
    """Mean token-level entropy (nats) of one problem's responses, pooled over tokens.

    ``sum_j entropy_sum_j / sum_j num_tokens_j`` over the problem's sampled responses:
    every generated token weighs the same, so a long response counts more than a short
    one (the per-response alternative, mean_j(entropy_sum_j / num_tokens_j), weighs
    responses equally). None when no entropy was measured or no token was generated.
    """
    if entropy_sums is None:
        return None
    if len(entropy_sums) != len(num_tokens):
        raise ValueError(f"{len(entropy_sums)} entropy sums for {len(num_tokens)} responses")
    tokens = sum(num_tokens)
    if tokens == 0:
        return None
    return float(sum(entropy_sums)) / tokens
