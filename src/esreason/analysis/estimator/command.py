"""``esreason analyze estimator``: the paper's local perturbation diagnostic (ES–ZO appendix).

Writes ``<out>/estimator.md``, ``.tex``, ``.json``, ``estimator_kappa.png`` and
``estimator_observations.npz`` (every X+, X0, X- array); prints the Markdown tables or,
with ``--json``, one JSON object. Bad input is a :class:`~esreason.errors.UserError`
naming the flag (exit 2).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from esreason.analysis.estimator.diagnostic import (COUPLINGS, OBJECTIVES, PAPER_SIGMAS, PAPER_TABLE_SIGMA, EstimatorSettings,
                                         parse_choices, parse_sigmas)
from esreason.analysis.output import print_result
from esreason.errors import UserError

DEFAULT_OUT = Path("runs") / "analysis" / "estimator"


def settings_from_args(args: argparse.Namespace) -> EstimatorSettings:
    """Build and validate the settings (UserError naming the flag)."""
    sigmas = tuple(parse_sigmas(args.sigmas))
    if args.table_sigma is None:
        values = [v for _, v in sigmas]
        table_sigma = PAPER_TABLE_SIGMA if PAPER_TABLE_SIGMA in values else max(values)
    else:
        ((_, table_sigma),) = parse_sigmas(args.table_sigma, "--table-sigma")
    settings = EstimatorSettings(
        model=args.model, task=args.task, split=args.split, data_path=args.data_path, sigmas=sigmas,
        table_sigma=table_sigma, objectives=parse_choices(args.objectives, OBJECTIVES, "--objectives"),
        couplings=parse_choices(args.couplings, COUPLINGS, "--couplings"), directions=args.directions,
        direction_seed=args.direction_seed, reward_prompts=args.reward_prompts, reward_seeds=args.reward_seeds,
        rollout_prompts=args.rollout_prompts, rollout_seeds=args.rollout_seeds, ce_examples=args.ce_examples,
        supervised=args.supervised, sst2_split=args.sst2_split, sst2_path=args.sst2_path,
        temperature=args.temperature, top_p=args.top_p, max_new_tokens=args.max_new_tokens,
        format_reward=args.format_reward, grpo_epsilon=args.grpo_epsilon, seed=args.seed, dtype=args.dtype,
        device=args.device, batch_size=args.batch_size, score_batch_size=args.score_batch_size)
    settings.validate()
    return settings


def _cmd_estimator(args: argparse.Namespace) -> int:
    from esreason.analysis.estimator.run import run_diagnostic
    from esreason.analysis.estimator.report import estimator_report, plot_kappas, save_observations
    from esreason.analysis.tables import write_outputs

    settings = settings_from_args(args)
    if args.device not in (None, "cpu") and not args.device.startswith("cuda"):
        raise UserError(f"--device must be cpu or cuda[:N] (got {args.device!r})")
    result = run_diagnostic(settings, progress=not args.no_progress)
    tables, payload = estimator_report(result)
    out = Path(args.out) if args.out else DEFAULT_OUT
    from esreason.io.lock import directory_lock

    with directory_lock(out, what="analysis output"):  # one writer per output directory
        paths = list(write_outputs(out, "estimator", tables, payload).values())
        paths.append(plot_kappas(result, out / "estimator_kappa.png"))
        paths.append(save_observations(result, out / "estimator_observations.npz"))
    print_result(args, tables, payload, paths)
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``estimator`` to the ``analyze`` sub-commands."""
    p = sub.add_parser("estimator", help="ES–ZO local perturbation diagnostic: Corr(X+,X0), κ_base, Corr(X+,X-), "
                                         "κ_pair across σ and objectives (paper appendix)")
    p.add_argument("--model", default="demo", help="'demo' (embedded default), an HF directory or hub id")
    p.add_argument("--task", default="demo-add", help="task of the rollouts and of --supervised task (default demo-add)")
    p.add_argument("--split", default="test", help="task split; the first N problems are used (default test)")
    p.add_argument("--data-path", default=None, help="local data file/directory of the task")
    p.add_argument("--sigmas", default=",".join(PAPER_SIGMAS),
                   help=f"comma-separated perturbation scales (default {','.join(PAPER_SIGMAS)}, the paper's)")
    p.add_argument("--table-sigma", default=None,
                   help="σ of table (a) (default 1e-3 when in --sigmas, else the largest)")
    p.add_argument("--objectives", default=",".join(OBJECTIVES),
                   help=f"comma-separated subset of {','.join(OBJECTIVES)} (default all)")
    p.add_argument("--couplings", default=",".join(COUPLINGS),
                   help="seed couplings of the regenerated-rollout reward (default common,independent)")
    p.add_argument("--directions", type=int, default=4, help="perturbation directions (paper 4)")
    p.add_argument("--direction-seed", type=int, default=0, help="direction d uses ES seed DIRECTION_SEED + d")
    p.add_argument("--reward-prompts", type=int, default=16, help="regenerated rollouts: prompts (paper 16)")
    p.add_argument("--reward-seeds", type=int, default=16, help="regenerated rollouts: seeds per prompt (paper 16)")
    p.add_argument("--rollout-prompts", type=int, default=16, help="fixed rollouts: prompts (paper 16)")
    p.add_argument("--rollout-seeds", type=int, default=8,
                   help="fixed rollouts: responses per prompt = GRPO group size (paper 8)")
    p.add_argument("--ce-examples", type=int, default=32,
                   help="supervised fixed batch size (default 32; x 4 directions = the paper's 128 observations)")
    p.add_argument("--supervised", default="task",
                   help="'task': gold completions of --task; 'sst2': SST-2 with the verbaliser "
                        "' terrible'/' great' (needs the hub or --sst2-path)")
    p.add_argument("--sst2-split", default="validation", help="SST-2 split (train or validation; default validation)")
    p.add_argument("--sst2-path", default=None, help="local SST-2 file or directory (fields sentence, label)")
    p.add_argument("--temperature", type=float, default=1.0, help="rollout sampling temperature (default 1.0)")
    p.add_argument("--top-p", type=float, default=1.0, help="rollout nucleus mass (default 1.0)")
    p.add_argument("--max-new-tokens", type=int, default=64, help="rollout response limit (default 64)")
    p.add_argument("--format-reward", type=float, default=0.1, help="reward of a formatted wrong answer (0.1)")
    p.add_argument("--grpo-epsilon", type=float, default=0.2, help="clip range of the GRPO surrogate (paper 0.2)")
    p.add_argument("--seed", type=int, default=0, help="base generation seed (default 0)")
    p.add_argument("--dtype", default="float32", help="model dtype: float32, bfloat16, float16 (default float32)")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    p.add_argument("--batch-size", type=int, default=256, help="rows per sampler forward (default 256)")
    p.add_argument("--score-batch-size", type=int, default=16, help="sequences per scoring forward (default 16)")
    p.add_argument("--out", default=None, help=f"output directory (default {DEFAULT_OUT})")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the Markdown tables")
    p.add_argument("--no-progress", action="store_true", help="no progress output on stderr")
    p.set_defaults(func=_cmd_estimator)
    return p


__all__ = ["add_parsers", "settings_from_args"]
