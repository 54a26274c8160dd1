"""Experiment reports: the paper's RQ1 tables and figures from an ``esreason experiment run`` directory.

Python API::

    from esreason.report import load_experiment, build_report

    exp = load_experiment("runs/exp")            # Experiment: tasks, held_out, in_domain, value(), ci()
    exp.value("es", "demo-sub", "pass@16")       # fraction, or None when absent
    result = build_report("runs/exp")            # writes runs/exp/report/{report.md, report.json, *.tex, *.png}
    result.finding("es_beats_grpo_passk").holds

Modules: ``load`` (experiment.json + summaries -> :class:`Experiment`), ``stats`` (averages and
paired bootstrap intervals), ``resample`` (the 50,000-resample problem bootstrap),
``components`` (seed-level variance-components t-intervals), ``tdist`` (t quantiles, no scipy),
``family`` (the family of claims, Holm), ``coverage`` (the coverage simulator), ``hierarchical``
(the crossed bootstrap over training seeds and problems, probability of improvement), ``seeds`` (a method trained with several seeds as one
row; per-seed views), ``tables`` (Pass@K/Maj@K tables with marks, held-out change,
below-base count), ``pareto`` (dominance, fronts), ``curves`` (training curves), ``findings``
(the paper's claims checked), ``compute`` (all of it), ``latex`` / ``markdown`` / ``document``
(rendering), ``plots`` / ``figures`` (PNGs), ``build`` (:func:`build_report`), ``command`` (CLI).
See docs/report.md for what each table and figure is and the conventions.
"""

from esreason.report.build import ReportResult, build_report
from esreason.report.findings import Finding
from esreason.report.load import Cell, Experiment, load_experiment

__all__ = ["Cell", "Experiment", "Finding", "ReportResult", "build_report", "load_experiment"]
