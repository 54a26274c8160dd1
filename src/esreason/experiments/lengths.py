"""Response lengths measured in a run's own records, for the plan's decode and tail terms.

``esreason experiment plan X --lengths DIR`` plans with the lengths recorded under DIR instead of the
table's assumed lognormal with a runaway share:

- **training**: every ES run's per-update ``length/responses`` (RUN/metrics.jsonl; every response of
  every member, :mod:`esreason.es_loop.lengths`), under DIR or in DIR itself (an ES run directory);
- **evaluation**: every sampled row's ``num_tokens`` in the ``responses.jsonl`` files under DIR (an
  ``esreason eval`` output directory, or an experiment directory with its ``eval/<method>/``
  subdirectories); greedy rows are left out (the plan's calls are sampled ones, and greedy calls are few).

ES stages plan with the training lengths (evaluation lengths where DIR has none), GRPO and evaluation
stages with the evaluation lengths (training lengths where DIR has none): GRPO samples like the
evaluation, while the Easy ES trains greedily. The mean-length share of decoding uses the empirical
mean (each length capped at the planned ``max_new_tokens``), and the tail uses the empirical expected
longest of n draws (with replacement; order statistics):

    E[min(cap, max of n)] = sum_k x_(k) [(k / N)^n - ((k - 1) / N)^n]

over the sorted capped lengths x_(1) <= ... <= x_(N).

Without ``--lengths`` the plan uses :class:`LengthModel`: a share ``runaway`` of the
responses never ends and stops at the cap (greedy and sampled repetition loops land at
``max_new_tokens``), the rest is lognormal with the family's mean and spread (plan_table), so

    P(length <= x) = (1 - runaway) F(x)  for x < cap,   and 1 at the cap,

and the expected longest of n draws is the same order statistic in integral form:
E[min(cap, max of n)] = integral over [0, cap] of 1 - ((1 - runaway) F(x))^n dx.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from esreason.errors import UserError


@dataclass(frozen=True)
class MeasuredLengths:
    """Sorted response lengths in tokens and where they were read."""

    lengths: tuple[int, ...]
    """Every sampled response's ``num_tokens``, ascending."""
    source: str
    """The directory and the number of files read, for the plan's assumptions."""

    def mean(self, cap: float) -> float:
        """Mean of min(length, cap)."""
        return sum(min(x, cap) for x in self.lengths) / len(self.lengths)

    def longest(self, n: int, cap: float) -> float:
        """Expected min(cap, max of n draws with replacement)."""
        total, size = 0.0, len(self.lengths)
        for k, x in enumerate(self.lengths, start=1):
            total += min(x, cap) * ((k / size) ** n - ((k - 1) / size) ** n)
        return total

    def survival(self, t: float, cap: float) -> float:
        """P(min(length, cap) > t): the share of a call's rows still decoding after t steps."""
        if t >= cap:
            return 0.0
        return sum(1 for x in self.lengths if x > t) / len(self.lengths)


#: Midpoint steps of the integrals below (error far below the plan's other uncertainties: the
#: simulation test in tests/test_plan_terms.py holds them to 2 %).
_STEPS = 4000


@dataclass(frozen=True)
class LengthModel:
    """Response lengths when none were measured: a ``runaway`` share at the cap, the rest lognormal
    with mean ``mean`` and standard deviation ``cv * mean`` (module docstring)."""

    mean_tokens: float
    """Mean of the lognormal part (tokens): plan_table.RESPONSE_TOKENS of the family."""
    cv: float
    """std / mean of the lognormal part: plan_table.RESPONSE_CV of the family."""
    runaway: float = 0.0
    """Share of responses that run to the cap (experiment key ``plan.runaway_share``)."""

    def _lognormal(self) -> tuple[float, float]:
        s2 = math.log(1.0 + self.cv * self.cv)
        return math.log(self.mean_tokens) - s2 / 2, math.sqrt(s2)

    def cdf(self, x: float) -> float:
        """P(length <= x) for x below the cap: (1 - runaway) F(x)."""
        if x <= 0:
            return 0.0
        mu, s = self._lognormal()
        return (1.0 - self.runaway) * 0.5 * (1.0 + math.erf((math.log(x) - mu) / (s * math.sqrt(2.0))))

    def survival(self, t: float, cap: float) -> float:
        """P(min(length, cap) > t)."""
        return 0.0 if t >= cap else 1.0 - self.cdf(t)

    def mean(self, cap: float) -> float:
        """E[min(length, cap)] = (1 - runaway) E[min(lognormal, cap)] + runaway * cap; the lognormal part
        in closed form, E[min(L, c)] = e^(mu + s^2/2) Phi((ln c - mu - s^2) / s) + c (1 - Phi((ln c - mu) / s))."""
        if self.mean_tokens <= 0 or cap <= 0:
            return 0.0
        mu, s = self._lognormal()
        phi = lambda z: 0.5 * (1.0 + math.erf(z / math.sqrt(2.0)))  # noqa: E731
        c = math.log(cap)
        body = math.exp(mu + s * s / 2) * phi((c - mu - s * s) / s) + cap * (1.0 - phi((c - mu) / s))
        return (1.0 - self.runaway) * body + self.runaway * cap

    def longest(self, n: int, cap: float) -> float:
        """E[min(cap, max of n lengths)] = integral over [0, cap] of 1 - P(length <= x)^n dx (midpoint rule)."""
        if n < 1 or self.mean_tokens <= 0 or cap <= 0:
            return 0.0
        dx = cap / _STEPS
        return dx * sum(1.0 - self.cdf((i + 0.5) * dx) ** n for i in range(_STEPS))


@dataclass(frozen=True)
class RecordedLengths:
    """What ``--lengths DIR`` found: training and evaluation lengths (either may be absent, not both)."""

    train: MeasuredLengths | None
    """ES training responses (RUN/metrics.jsonl ``length/responses``)."""
    eval: MeasuredLengths | None
    """Sampled evaluation responses (``responses.jsonl``)."""

    def for_stage(self, kind: str) -> tuple[str, MeasuredLengths]:
        """(which, lengths) a stage of ``kind`` (es, grpo, eval) plans with (module docstring)."""
        first, second = (("train", "eval") if kind == "es" else ("eval", "train"))
        got = getattr(self, first)
        return (first, got) if got is not None else (second, getattr(self, second))


def _eval_lengths(root: Path) -> MeasuredLengths | None:
    files = sorted(root.rglob("responses.jsonl"))
    lengths: list[int] = []
    for f in files:
        for i, line in enumerate(f.read_text().splitlines(), start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                n = row["num_tokens"]
            except (json.JSONDecodeError, KeyError, TypeError):
                raise UserError(f"--lengths: {f} row {i}: not a response record with 'num_tokens'") from None
            if not isinstance(n, int) or n < 0:
                raise UserError(f"--lengths: {f} row {i}: num_tokens must be an integer >= 0, got {n!r}")
            if not row.get("greedy", False):
                lengths.append(n)
    if not lengths:
        return None
    return MeasuredLengths(tuple(sorted(lengths)), f"measured: {len(lengths):,} sampled evaluation responses in "
                                                   f"{len(files)} responses.jsonl under {root}")


def _train_lengths(root: Path) -> MeasuredLengths | None:
    from esreason.es_loop.lengths import RESPONSES_KEY
    from esreason.io.metrics import read_metrics

    files = sorted(root.rglob("metrics.jsonl"))
    lengths: list[int] = []
    runs = 0
    for f in files:
        found = False
        for row in read_metrics(f):  # a damaged line is a UserError naming the file and line
            value = row.get(RESPONSES_KEY)
            if value is None:
                continue
            try:
                flat = [int(x) for member in value for x in member if not isinstance(x, bool) and int(x) == x >= 0]
            except (TypeError, ValueError):
                flat = []
            if not flat or len(flat) != sum(len(m) for m in value):
                raise UserError(f"--lengths: {f} update {row['step']}: {RESPONSES_KEY} must be lists of "
                                "integers >= 0 per member")
            lengths += flat
            found = True
        runs += found
    if not lengths:
        return None
    return MeasuredLengths(tuple(sorted(lengths)), f"measured: {len(lengths):,} ES training responses in {runs} "
                                                   f"run{'s' if runs != 1 else ''} under {root}")


def read_lengths(path: str | Path) -> RecordedLengths:
    """The lengths recorded under ``path``: ES training and sampled evaluation responses; UserError
    naming the file, row or path."""
    root = Path(path)
    if not root.is_dir():
        raise UserError(f"--lengths: {root} is not a directory (give an ES run, an `esreason eval` output or an "
                        "experiment directory)")
    found = RecordedLengths(_train_lengths(root), _eval_lengths(root))
    if found.train is None and found.eval is None:
        raise UserError(f"--lengths: no recorded lengths under {root} (no ES run's metrics.jsonl with "
                        "length/responses, no responses.jsonl with sampled rows)")
    return found
