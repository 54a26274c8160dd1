"""Command-line interface: parse, build config, dispatch — no logic here.

Every user-input problem surfaces as ``esreason: error: <one line>`` with exit
status 2 and no traceback (:class:`esreason.errors.UserError`).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from esreason.errors import UserError


def add_pretrain_arguments(ap: argparse.ArgumentParser) -> None:
    """Options of ``esreason pretrain-demo`` (here, so building the CLI imports no torch); None
    defaults resolve to the recipe's in :func:`esreason.embedded.pretrain.run`."""
    ap.add_argument("--output", default=None, help="model directory to write (default: the packaged "
                    "embedded default, src/esreason/assets/demo)")
    ap.add_argument("--steps", type=int, default=None, help="AdamW steps (default: the recipe's, docs/embedded.md)")
    ap.add_argument("--seed", type=int, default=None, help="seed (default: the recipe's, 0)")
    ap.add_argument("--quick", action="store_true", help="a tiny run (smoke test; a useless model)")


def _cmd_info(args: argparse.Namespace) -> int:
    from esreason.info import run_info

    return run_info(args)


def _cmd_pretrain_demo(args: argparse.Namespace) -> int:
    from esreason.embedded.pretrain import run

    return run(args)


def _default_output(config: str | None, kind: str) -> Path:
    stem = Path(config).stem if config else kind
    return Path("runs") / stem


def _cmd_train_es(args: argparse.Namespace) -> int:
    from esreason.config import load_config
    from esreason.es_loop.run import run_es

    from esreason.config_logging import wandb_sets

    cfg = load_config(args.config, [*(args.set or []), *wandb_sets(args)])
    output = Path(args.output) if args.output else _default_output(args.config, "es")
    from esreason.experiments.memplan_engines import resolve_at_run

    result = run_es(cfg, output, resume=args.resume, progress=not args.no_progress, resume_from=args.resume_from,
                    accept_task_change=args.accept_task_change, resolve_engines=resolve_at_run)
    print(f"ES run finished: {result.steps} updates; final checkpoint: {result.final_checkpoint}")
    print(f"run directory: {output}")
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from esreason.demo import run_demo

    from esreason.demo import default_output

    output = Path(args.output) if args.output else default_output(quick=args.quick, seeds=args.seeds)
    return run_demo(output=output, quick=args.quick, progress=not args.no_progress, seeds=args.seeds)


def build_parser() -> argparse.ArgumentParser:
    from esreason import __version__

    parser = argparse.ArgumentParser(
        prog="esreason",
        description="Evolution Strategies post-training for LLM reasoning (ES vs GRPO, Pass@K, weight analyses).")
    parser.add_argument("--version", action="version", version=f"esreason {__version__}")
    # Also before the command (`esreason --tasks-dir DIR tasks`); its own dest, because a sub-command's
    # default would overwrite a value argparse parsed at the top level.
    parser.add_argument("--tasks-dir", action="append", metavar="DIR", dest="global_tasks_dir",
                        help="register the task files (*.yaml) under DIR first (repeatable; also accepted after "
                             "the command; docs/custom-tasks.md)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser("info", help="versions, device and the embedded default's location")
    p.set_defaults(func=_cmd_info)

    p = sub.add_parser("demo", help="the pipeline in miniature on the embedded default (CPU, minutes)")
    p.add_argument("--output", default=None,
                   help="run directory (default: runs/demo; --quick: runs/demo-quick; --seeds N > 1: "
                        "runs/demo-seedsN, so each kind of demo has its own directory)")
    p.add_argument("--quick", action="store_true", help="a smoke-test sized demo (seconds)")
    p.add_argument("--seeds", type=int, default=1, metavar="N",
                   help="training seeds 0..N-1: intervals then cover training variance too (default 1: "
                        "evaluation noise only; N > 1 writes runs/<m>/seed<s>/)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=_cmd_demo)

    p = sub.add_parser("pretrain-demo", help="(re)train the embedded default by SFT on the synthetic tasks",
                       description="Train the embedded default by SFT on the synthetic tasks (CPU).")
    add_pretrain_arguments(p)
    p.set_defaults(func=_cmd_pretrain_demo)

    train = sub.add_parser("train", help="post-train a model").add_subparsers(
        dest="method", metavar="METHOD", required=True)
    p = train.add_parser("es", help="full-parameter ES (paper appendix 'Implementation Procedure')")
    p.add_argument("--config", help="YAML run config (e.g. configs/demo/es.yaml)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override a config key with a dotted name, e.g. --set es.sigma=1e-3 (repeatable)")
    p.add_argument("--output", help="run directory (default: runs/<config name>)")
    p.add_argument("--resume", action="store_true", help="continue the run in --output from its last checkpoint")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_cmd_train_es)
    from esreason.config_logging import add_wandb_flag

    add_wandb_flag(p)

    from esreason.grpo.run import add_resume_from
    from esreason.grpo.run import register as register_grpo

    add_resume_from(p)
    from esreason.es_loop.fingerprint import add_accept_flag

    add_accept_flag(p)

    register_grpo(train)
    from esreason.experiments.sequence import register as register_sequence

    register_sequence(train)

    from esreason.analysis.command import register as register_analysis
    from esreason.eval.command import register as register_eval
    from esreason.accounting.flops import register as register_flops

    register_eval(sub)
    register_analysis(sub)
    register_flops(sub)
    from esreason.report.command import register as register_report
    register_report(sub)
    from esreason.experiments.command import register as register_experiment

    register_experiment(sub)
    p = sub.add_parser("tasks", help="list every task: name, verifier, splits and where it came from",
                       description="List the registered tasks (built-in, plugin packages, task files).")
    p.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    p.set_defaults(func=_cmd_tasks)
    _add_tasks_dir(parser)
    return parser


def _add_tasks_dir(parser: argparse.ArgumentParser) -> None:
    """``--tasks-dir DIR`` on every command that runs (leaf sub-commands): task files (*.yaml) to register
    before anything looks a task up (docs/custom-tasks.md)."""
    children = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not children:
        parser.add_argument("--tasks-dir", action="append", metavar="DIR",
                            help="register the task files (*.yaml) under DIR first (repeatable; also "
                                 "ESREASON_TASKS_DIR; docs/custom-tasks.md)")
        return
    for action in children:
        for child in dict.fromkeys(action.choices.values()):
            _add_tasks_dir(child)


def _cmd_tasks(args: argparse.Namespace) -> int:
    from esreason.tasks.listing import print_tasks

    return print_tasks(as_json=args.json)


def _disk_full(exc: Exception, args: argparse.Namespace) -> UserError | None:
    """The one-line error for ``ENOSPC``/``EDQUOT`` raised where no writer of ours caught it (a
    library's own file, TensorBoard's event file, torch.save's errno-less failure on a full file
    system): the file when the error names it, else the command's output directory; None for any
    other exception."""
    from esreason.io.space import disk_full, find_disk_full, is_disk_full, torch_write_on_full_disk

    known = find_disk_full(exc)
    if known is not None:
        return known
    output = getattr(args, "output", None) or getattr(args, "out", None) or "."
    if not (is_disk_full(exc) or torch_write_on_full_disk(exc, output)):
        return None
    return disk_full(getattr(exc, "filename", None) or output, None, exc)


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from esreason import openmp

    openmp.configure()  # before torch is imported: libgomp reads its spin count once (esreason.openmp)
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        for directory in [*(getattr(args, "global_tasks_dir", None) or ()), *(getattr(args, "tasks_dir", None) or ())]:
            from esreason.tasks.registry import add_tasks_dir

            add_tasks_dir(directory)
        return int(args.func(args) or 0)
    except UserError as exc:
        print(f"esreason: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # The reader of our output left (`esreason tasks | head -1`): stop quietly, as `ls | head` does, with
        # the status a process killed by SIGPIPE has. stdout goes to devnull so the interpreter's final
        # flush does not raise again (Python's documented recipe, "Note on SIGPIPE").
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except Exception as exc:  # a full disk anywhere (a library's own write) is one line too, not a traceback
        full = _disk_full(exc, args)
        if full is None:
            raise
        print(f"esreason: error: {full}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("esreason: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
