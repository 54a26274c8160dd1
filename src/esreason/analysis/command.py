"""``esreason analyze``: the top-level parser; each analysis package adds its own sub-commands.

- :mod:`esreason.analysis.weights.command`: ``drift``, ``threshold``, ``localize``,
  ``rounding``, ``restore-ablation`` (checkpoint pairs, paper §RQ2; docs/analysis.md);
- :mod:`esreason.analysis.estimator.command`: ``estimator`` (one- vs two-point diagnostic;
  docs/estimator.md);
- :mod:`esreason.analysis.coverage.command`: ``coverage RUN`` and ``lemma1`` (docs/coverage.md).

Sub-command modules are imported here only; none imports this module (no cycle), and what
they print is shared through :mod:`esreason.analysis.output`.
"""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> argparse._SubParsersAction:
    """Add ``analyze`` with its sub-commands to the top-level ``subparsers``.

    Returns the ``analyze`` sub-command action, so further analyses can add their own
    sub-commands to it.
    """
    from esreason.analysis.coverage.command import add_parsers as add_coverage_parsers
    from esreason.analysis.estimator.command import add_parsers as add_estimator_parsers
    from esreason.analysis.weights.command import add_parsers as add_weight_parsers

    analyze = subparsers.add_parser("analyze", help="weight analyses of checkpoint pairs (drift, thresholding, ...)")
    sub = analyze.add_subparsers(dest="analysis", metavar="ANALYSIS", required=True)
    add_weight_parsers(sub)  # drift, threshold, localize, rounding, restore-ablation (docs/analysis.md)
    add_estimator_parsers(sub)  # estimator (docs/estimator.md)
    add_coverage_parsers(sub)  # coverage RUN, lemma1 (docs/coverage.md)
    return sub


__all__ = ["register"]
