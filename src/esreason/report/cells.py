"""The report's shared types: :class:`Cell` (a number with its interval) and the read-only
view of an experiment that the statistics need (:class:`ExperimentView`).

Both :mod:`esreason.report.load` (which builds experiments) and :mod:`esreason.report.stats`
(which averages and differences their numbers) import from here, so neither imports the
other's module at import time: ``load -> stats -> cells`` and ``load -> cells``, no cycle.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class Cell:
    """One number with its confidence interval (fractions, not percent).

    n: problems behind a task value, tasks behind an average. estimate: the
    :class:`esreason.report.components.Estimate` the interval came from (p-value, intervals at
    other levels, what it covers), when the report computed it.
    """

    value: float | None
    low: float | None = None
    high: float | None = None
    n: int | None = None
    estimate: Any = field(default=None, compare=False, repr=False)

    def as_dict(self) -> dict[str, Any]:
        return {"value": self.value, "ci_low": self.low, "ci_high": self.high, "n": self.n}


class ExperimentView(Protocol):
    """What :mod:`esreason.report.stats` reads of an experiment (:class:`esreason.report.load.Experiment`)."""

    def cell(self, method: str, task: str, metric: str) -> Cell | None: ...

    def average_cell(self, method: str, metric: str) -> Cell | None: ...

    def summary_average_tasks(self, method: str) -> list[str]: ...

    def problems(self, method: str, task: str) -> dict[str, dict[str, Any]] | None: ...

    def bootstrap_settings(self) -> tuple[float, int, int]: ...

    def seed_keys(self, method: str) -> list[str]: ...

    def seed_problems(self, method: str, task: str) -> list[dict[str, dict[str, Any]]] | None: ...
