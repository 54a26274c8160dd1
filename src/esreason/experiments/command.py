"""``esreason experiment``: multi-run orchestration.

- ``run FILE``    the paper's method comparison (Base / GRPO / ES / ES->GRPO / GRPO->ES):
  trains what is missing, evaluates everything, resumable (:mod:`esreason.experiments.runner`)
- ``sweep``       one config key over several values with the paper's smoothed reward
  trajectories (:mod:`esreason.experiments.sweep`)
- ``sweep-drift SWEEP --protocol FILE``  a sweep's endpoints against Base: in-domain gain, held-out
  change, off-task KL and relative L2 drift (:mod:`esreason.experiments.sweep_drift`)
- ``plan FILE --gpus N``  what ``run FILE`` would run where, its tokens, wall time, GPU-hours and
  memory per GPU, from a table of stated assumptions (:mod:`esreason.experiments.plan`)
"""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("experiment", help="run a method comparison or a sweep (many runs, one directory)")
    actions = parser.add_subparsers(dest="experiment_action", metavar="ACTION", required=True)
    from esreason.experiments.runner import register as register_run

    register_run(actions)
    # sweep: registered below by esreason.experiments.sweep_command.register(actions)
    from esreason.experiments.sweep_command import register as register_sweep

    register_sweep(actions)
    from esreason.experiments.sweep_drift import register as register_sweep_drift

    register_sweep_drift(actions)
    from esreason.experiments.plan_command import register as register_plan

    register_plan(actions)
    return parser
