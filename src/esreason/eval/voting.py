"""Maj@K: plurality voting over normalised answers (paper, appendix "Evaluation Metrics").

"Maj@K normalizes task-specific answers, takes a deterministic plurality vote over the
first K retained responses, treats failed extraction as abstention, and scores the
selected answer against the gold answer."

Rules implemented here (the paper leaves the last three implicit):

- **Grouping.** ``answers[i]`` is sample i's normalised answer (its vote key, see
  :mod:`esreason.eval.answers`) or None (abstention). String-equal keys form one group.
  With ``equivalent(a, b)`` (math-verify equivalence for math), a new key joins the
  first existing group whose *representative* (the group's first key) is equivalent to
  it, representative in the first argument (math-verify's gold position), else it opens
  a new group. Groups are formed once over all M samples in sample order and numbered by
  first appearance.
- **Tie rule.** Among groups with the highest count, the one whose first sample (among
  the voted samples) comes earliest wins. Deterministic, and it favours the answer the
  model produced first.
- **Abstentions** take no part in the vote; when every voted sample abstains the score
  is 0.
- **Scoring the winner.** The verdict is a function of the normalised answer, so all
  samples of a group normally agree. When they do not (a non-transitive equivalence, a
  verifier timeout on one sample), a group counts as correct when the strict majority of
  *all* its samples are correct, and a tie goes to the verdict of its first sample. The
  group's correctness is therefore a property of the answer, not of which K samples
  were drawn.

Two modes:

- ``"first"`` (the paper's protocol): vote over samples 0..K-1.
- ``"expected"``: the exact expectation of the first-mode score over a uniformly random
  K-subset of the M samples (tie rule applied to the positions inside the subset). It is
  computed by counting, not by Monte Carlo: for a correct group g whose first selected
  sample sits at position p with t selected samples in all, every other group h must
  contribute fewer than t samples, or exactly t all after p; abstentions are free. With
  a(h) = #h samples after p, n_h = |h| and A the number of abstentions, the number of
  such subsets is

      C(r_p, t - 1) * [x^(K - t)] (1 + x)^A * prod_{h != g} ( sum_{i < t} C(n_h, i) x^i + C(a(h), t) x^t ),

  r_p being the number of g's samples after p; summing over correct g, p and t and
  dividing by C(M, K) gives the expectation exactly (integer arithmetic).
"""

from __future__ import annotations

from collections import Counter
from fractions import Fraction
from math import comb
from typing import Callable, Hashable, Sequence

MODES = ("first", "expected")

Equivalence = Callable[[Hashable, Hashable], bool]


def group_answers(answers: Sequence[Hashable | None],
                  equivalent: Equivalence | None = None) -> list[int | None]:
    """Group id per sample (ids numbered by first appearance), None for abstentions.

    Equal keys share a group; with ``equivalent``, a new key joins the first group whose
    representative ``rep`` satisfies ``equivalent(rep, key)``. ``equivalent`` is called
    once per (group, new distinct key) at most.
    """
    reps: list[Hashable] = []
    by_key: dict[Hashable, int] = {}
    ids: list[int | None] = []
    for a in answers:
        if a is None:
            ids.append(None)
            continue
        g = by_key.get(a)
        if g is None:
            if equivalent is not None:
                g = next((gi for gi, rep in enumerate(reps) if equivalent(rep, a)), None)
            if g is None:
                g = len(reps)
                reps.append(a)
            by_key[a] = g
        ids.append(g)
    return ids


def group_correctness(group_ids: Sequence[int | None], correct: Sequence[bool]) -> list[bool]:
    """Per group: strict majority of its samples correct; a tie takes its first sample's verdict."""
    if len(group_ids) != len(correct):
        raise ValueError(f"{len(group_ids)} answers but {len(correct)} verdicts")
    n_groups = 1 + max((g for g in group_ids if g is not None), default=-1)
    right = [0] * n_groups
    size = [0] * n_groups
    first: list[bool | None] = [None] * n_groups
    for g, ok in zip(group_ids, correct):
        if g is None:
            continue
        size[g] += 1
        right[g] += bool(ok)
        if first[g] is None:
            first[g] = bool(ok)
    return [2 * right[g] > size[g] or (2 * right[g] == size[g] and bool(first[g])) for g in range(n_groups)]


def majority_winner(group_ids: Sequence[int | None]) -> int | None:
    """Winning group of a vote over ``group_ids`` (in sample order); None if all abstain.

    Highest count wins; ties go to the group whose first sample comes earliest.
    """
    counts: Counter[int] = Counter()
    first_pos: dict[int, int] = {}
    for pos, g in enumerate(group_ids):
        if g is None:
            continue
        counts[g] += 1
        first_pos.setdefault(g, pos)
    if not counts:
        return None
    return min(counts, key=lambda g: (-counts[g], first_pos[g]))


def _poly_mul_trunc(a: list[int], b: list[int], degree: int) -> list[int]:
    """Product of two integer polynomials (coefficient lists), truncated at ``degree``."""
    out = [0] * (min(len(a) + len(b) - 2, degree) + 1)
    for i, ai in enumerate(a):
        if ai == 0 or i > degree:
            continue
        for j, bj in enumerate(b[:degree - i + 1]):
            out[i + j] += ai * bj
    return out


def expected_majority(group_ids: Sequence[int | None], group_ok: Sequence[bool], k: int) -> Fraction:
    """Exact E[first-mode Maj@k] over uniformly random k-subsets (formula in the module docstring)."""
    n = len(group_ids)
    positions: dict[int, list[int]] = {}
    for pos, g in enumerate(group_ids):
        if g is not None:
            positions.setdefault(g, []).append(pos)
    abstain = n - sum(len(p) for p in positions.values())
    favourable = 0
    for g, pos_g in positions.items():
        if not group_ok[g]:
            continue
        others = [p for h, p in positions.items() if h != g]
        for j, p in enumerate(pos_g):
            rest = len(pos_g) - j - 1  # g's samples after p
            sizes_after = [(len(ph), sum(1 for q in ph if q > p)) for ph in others]
            for t in range(1, min(k, rest + 1) + 1):
                need = k - t
                poly = [comb(abstain, i) for i in range(min(abstain, need) + 1)]
                for n_h, after_h in sizes_after:
                    factor = [comb(n_h, i) for i in range(min(t - 1, n_h, need) + 1)]
                    if t <= need and after_h >= t:
                        factor += [0] * (t - len(factor)) + [comb(after_h, t)]
                    poly = _poly_mul_trunc(poly, factor, need)
                if len(poly) > need:
                    favourable += comb(rest, t - 1) * poly[need]
    return Fraction(favourable, comb(n, k))


def maj_at_k(answers: Sequence[Hashable | None], correct: Sequence[bool], k: int, *, mode: str = "first",
             equivalent: Equivalence | None = None) -> float:
    """Maj@k of one problem (rules in the module docstring).

    answers: per sample, its normalised answer (vote key) or None (abstention).
    correct: per sample, the verifier's verdict.
    k: number of voted samples, 1 <= k <= len(answers).
    mode: "first" (vote over the first k samples, the paper's protocol) or "expected"
        (exact expectation over uniformly random k-subsets).
    equivalent: optional ``equivalent(a, b) -> bool`` grouping keys that are not equal.
    """
    n = len(answers)
    if len(correct) != n:
        raise ValueError(f"{n} answers but {len(correct)} verdicts")
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= n:
        raise ValueError(f"k must be an integer in [1, {n}], got {k!r}")
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    ids = group_answers(answers, equivalent)
    ok = group_correctness(ids, correct)
    if mode == "first" or k == n:
        winner = majority_winner(ids[:k])
        return float(winner is not None and ok[winner])
    return float(expected_majority(ids, ok, k))
