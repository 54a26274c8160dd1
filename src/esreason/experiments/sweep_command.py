"""``esreason experiment sweep``: the command line of :mod:`esreason.experiments.sweep`."""

from __future__ import annotations

import argparse
from pathlib import Path

from esreason.errors import UserError
from esreason.experiments.sweep import DEFAULT_BAND_WINDOW, load_sweep_config, make_spec, plan_sweep, run_sweep


def register(actions: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``sweep`` to the ``esreason experiment`` action group."""
    p = actions.add_parser(
        "sweep", help="one ES config key over several values: runs, smoothed-reward table and plot",
        description="Train one ES run per value of --param (resumable), then report the paper's debiased "
                    "smoothed mean reward: checkpoint table (markdown, LaTeX, JSON), trajectory plot and, "
                    "with --heldout-suite, held-out endpoint evaluation. See docs/sweeps.md.")
    p.add_argument("--config", required=True, help="ES config YAML, optionally with a 'sweep:' section")
    p.add_argument("--param", help="dotted config key to sweep, e.g. es.population_size (default: sweep.param)")
    p.add_argument("--values", help="comma-separated values, e.g. 8,16,32,64 (default: sweep.values)")
    p.add_argument("--output", help="sweep directory (default: runs/sweeps/<config name>)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a base config key (repeatable)")
    p.add_argument("--checkpoints", help="updates of the table, e.g. 100,200,300 (the paper's default)")
    p.add_argument("--reference", help="reference value (default: sweep.reference, else the last value)")
    p.add_argument("--heldout-suite", help="evaluate every endpoint on this suite (e.g. demo-heldout)")
    p.add_argument("--tolerance", type=float, help="'within' threshold (default 0.01, the paper's)")
    p.add_argument("--band-window", type=int, help=f"residual-band window in updates (default {DEFAULT_BAND_WINDOW})")
    p.add_argument("--seeds", help="training seeds, e.g. 0,1,2: every value once per seed (default: sweep.seeds, "
                                   "else one run with train.seed)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=run_command)
    return p


def run_command(args: argparse.Namespace) -> int:
    """Plan (validate everything), train, report; prints the checkpoint table."""
    sets = list(args.set or [])
    base, section = load_sweep_config(args.config, sets)
    spec = make_spec(section, param=args.param, values=args.values, reference=args.reference,
                     checkpoints=args.checkpoints, heldout_suite=args.heldout_suite, tolerance=args.tolerance,
                     band_window=args.band_window, seeds=args.seeds)
    for item in sets:
        if item.split("=", 1)[0].strip() == spec.param:
            raise UserError(f"--set {item}: {spec.param} is the swept key; use --values")
    output = Path(args.output) if args.output else Path("runs") / "sweeps" / Path(args.config).stem
    plan = plan_sweep(base, spec, output)
    result = run_sweep(plan, progress=not args.no_progress)
    print()
    print(result.files["table_md"].read_text())
    print(f"sweep directory: {output} (report.md, table.md/.tex, sweep.json, trajectories.png)")
    return 0
