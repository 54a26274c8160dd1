"""Response lengths measured in a run's own records, for the plan's decode and tail terms (issue 24).

``esreason experiment plan X --lengths DIR`` reads every ``responses.jsonl`` under DIR (an
``esreason eval`` output directory, or an experiment directory with its ``eval/<method>/``
subdirectories) and plans with the empirical distribution of their ``num_tokens`` instead of the
table's assumed lognormal: the mean-length share of decoding uses the empirical mean (each length
capped at the planned ``max_new_tokens``), and the tail uses the empirical expected longest of n
draws (with replacement; order statistics):

    E[min(cap, max of n)] = sum_k x_(k) [(k / N)^n - ((k - 1) / N)^n]

over the sorted capped lengths x_(1) <= ... <= x_(N). Greedy rows are left out (the plan's calls
are sampled ones, and greedy calls are few).
"""

from __future__ import annotations

import json
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


def read_lengths(path: str | Path) -> MeasuredLengths:
    """The sampled responses' lengths under ``path``; UserError naming the file, row or path."""
    root = Path(path)
    if not root.is_dir():
        raise UserError(f"--lengths: {root} is not a directory (give an `esreason eval` output or an experiment "
                        "directory)")
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
        raise UserError(f"--lengths: no sampled responses under {root} (no responses.jsonl with non-greedy rows)")
    return MeasuredLengths(tuple(sorted(lengths)), f"measured: {len(lengths):,} sampled responses in {len(files)} "
                                                   f"responses.jsonl under {root}")
