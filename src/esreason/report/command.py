"""``esreason report EXP``: the experiment report (tables, figures, findings) of a method comparison.

    esreason report EXP [--out DIR] [--pareto-k K] [--large-k 16,32] [--no-figures]

Parsing only (:func:`esreason.report.build.build_report` does the work); bad input
raises :class:`esreason.errors.UserError` (one line, exit 2).
"""

from __future__ import annotations

import argparse

from esreason.eval.command import parse_ks


def _large_ks(text: str | None) -> list[int] | None:
    ks = parse_ks(text, "--large-k")
    return None if ks is None else list(ks)


def _cmd_report(args: argparse.Namespace) -> int:
    from esreason.report.build import build_report

    result = build_report(args.experiment, args.out, pareto_k=args.pareto_k, large_ks=_large_ks(args.large_k),
                          figures=not args.no_figures)
    for f in result.findings:
        print(f"[{f.verdict}] {f.claim}: {f.evidence} (interval covers: {f.variance})")
    if result.notes:
        print(f"{len(result.notes)} note(s) in the report (missing methods, tasks or files)")
    print(f"report: {result.files['markdown']}")
    return 0


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the ``report`` subcommand to the top-level CLI."""
    p = subparsers.add_parser(
        "report", help="tables, figures and findings of an experiment directory (esreason experiment run)",
        description="Write report.md, report.json, one .tex per table and the PNG figures of an experiment: "
                    "Pass@K and Maj@K tables, train->test bars, Pass@K profiles, Pareto fronts, training curves, "
                    "held-out change and the below-base count (paper section RQ1).")
    p.add_argument("experiment", metavar="EXP", help="experiment directory (holds experiment.json)")
    p.add_argument("--out", default=None, help="output directory (default: EXP/report)")
    p.add_argument("--pareto-k", type=int, default=None,
                   help="K of the Pareto fronts' Pass@K axis (default: the largest protocol K)")
    p.add_argument("--large-k", default=None,
                   help="comma-separated Ks of the below-base count (default: protocol Ks above 1)")
    p.add_argument("--no-figures", action="store_true", help="tables, findings and JSON only (no PNGs)")
    p.set_defaults(func=_cmd_report)
    return p
