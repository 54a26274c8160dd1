"""Everything a report shows, computed from a loaded experiment (no files written).

:func:`compute` gathers the Pass@K and Maj@K tables, the held-out change table, the
below-base count, the Pareto panels, the training curves, the findings and the notes
about missing pieces into one :class:`Parts`, which the renderers (Markdown, LaTeX, JSON,
figures) read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from esreason.report.curves import Curves, training_curves
from esreason.report.drift import DriftTable, drift_table
from esreason.report.findings import Finding, all_findings
from esreason.report.load import Experiment
from esreason.report.pareto import ParetoPanel, pareto_panels
from esreason.report.passk_profiles import Profile, passk_profiles
from esreason.report.cells import Cell
from esreason.report.power import TaskMDD, task_changes, task_mdds
from esreason.report.tables import BelowBase, Table, below_base, heldout_change_table, metric_table
from esreason.report.variants import variant_findings


@dataclass
class Parts:
    """Everything computed, before rendering."""

    pass_table: Table | None
    maj_table: Table | None
    change: Table | None
    below: BelowBase | None
    panels: list[ParetoPanel]
    curves: Curves | None
    findings: list[Finding]
    notes: list[str]
    mdd: list[TaskMDD] = field(default_factory=list)
    changes: dict[str, dict[str, Cell]] = field(default_factory=dict)
    profiles: dict[str, dict[str, Profile]] = field(default_factory=dict)
    """Pass@K over every K = 1..M per panel and method (:mod:`esreason.report.passk_profiles`)."""
    drift: DriftTable | None = None
    """Gain vs forgetting (section 9: :mod:`esreason.report.drift`)."""


def compute(exp: Experiment, pareto_k: int | None = None, large_ks: Sequence[int] | None = None) -> Parts:
    """Every table, front, curve and finding (no files)."""
    pass_table, maj_table = metric_table(exp, "pass"), metric_table(exp, "maj")
    change, below = heldout_change_table(exp), below_base(exp, large_ks)
    panels, pnotes = pareto_panels(exp, pareto_k)
    profiles, prof_notes = passk_profiles(exp)
    curves = training_curves(exp)  # reading the training files may add to exp.notes
    findings = all_findings(exp, below, change, panels, curves, variant_findings(exp))
    notes = list(exp.notes)
    for t in (pass_table, maj_table, change):
        notes += t.notes if t is not None else []
    notes += (below.notes if below else []) + pnotes + prof_notes + (curves.notes if curves else [])
    drift = drift_table(exp)
    notes += drift.notes if drift else []
    return Parts(pass_table, maj_table, change, below, panels, curves, findings, list(dict.fromkeys(notes)),
                 task_mdds(exp), task_changes(exp), profiles, drift)
