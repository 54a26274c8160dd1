"""``esreason experiment plan``: the command line of :mod:`esreason.experiments.plan` (the table
plan) and :mod:`esreason.experiments.calibrate` (``--calibrate``: this machine's plan)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from esreason.errors import UserError
from esreason.experiments import plan_table as tab
from esreason.experiments.plan import build_plan, hf_only
from esreason.experiments.plan_render import render


def _cmd_plan(args: argparse.Namespace) -> int:
    from esreason.experiments.spec import load_spec

    spec = load_spec(args.file, args.set or [])
    if args.calibrate:  # this machine's constants, measured by a short run (experiments.calibrate)
        if not args.max_spread > 0:  # refused before the calibration run, not after it
            raise UserError(f"--max-spread: expected a number > 0, got {args.max_spread!r}")
        from esreason.experiments.calibrate import calibrate_and_print

        calibrate_and_print(spec, args.json, args.max_spread)
        return 0
    if args.gpus is None:
        raise UserError("--gpus: required (the node's GPUs), unless --calibrate plans this machine")
    if args.hf_only:
        spec = hf_only(spec)
    lengths = None
    if args.lengths:
        from esreason.experiments.lengths import read_lengths

        lengths = read_lengths(args.lengths)
    plan = build_plan(spec, args.gpus, args.gpu_type, lengths, nodes=args.nodes)
    print(json.dumps(plan, indent=2) if args.json else render(plan))
    return 0


def register(actions: Any) -> argparse.ArgumentParser:
    p = actions.add_parser("plan", help="what each stage of `experiment run` runs where, its tokens, wall time, "
                                        "GPU-hours and memory per GPU (nothing is run)")
    p.add_argument("file", help="experiment YAML (e.g. configs/experiments/easy.yaml)")
    p.add_argument("--gpus", type=int, help="GPUs of the node (required without --calibrate)")
    p.add_argument("--nodes", type=int, default=1, metavar="N",
                   help="plan GRPO training on N nodes of --gpus GPUs each (accelerate's multi-node launch, "
                        "docs/cluster.md); ES and evaluation stay on one node (default 1)")
    p.add_argument("--calibrate", action="store_true", help="measure this machine's constants in a short run of "
                   "the experiment on this machine (its own backends: HF, vLLM, Ray, accelerate) and plan it with them")
    from esreason.experiments.calibrate_check import MAX_SPREAD

    p.add_argument("--max-spread", type=float, default=MAX_SPREAD, metavar="X",
                   help="with --calibrate: refuse the plan when a constant's (max - min) / median over its samples "
                        f"exceeds X (default {MAX_SPREAD}; esreason.experiments.calibrate_check)")
    p.add_argument("--gpu-type", default="h100", choices=sorted(tab.GPUS), help="GPU type (default: h100)")
    p.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    p.add_argument("--hf-only", action="store_true",
                   help="project the same experiment with every generation on the HF sampler")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a key, as `experiment run --set`")
    p.add_argument("--lengths", metavar="DIR", help="plan decode and tails with the response lengths recorded under "
                                                    "DIR (an eval or experiment directory) instead of the table's")
    p.set_defaults(func=_cmd_plan)
    return p
