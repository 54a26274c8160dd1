"""The weight-analysis sub-commands of ``esreason analyze`` (paper §RQ2 and the restore ablation).

Added to the ``analyze`` sub-parsers by :func:`add_parsers` (see :mod:`esreason.analysis.command`):

- ``drift``     relative L2 distance, s_tau, thresholded distances, per-category drift, |Delta| histogram
- ``threshold`` write a magnitude-thresholded checkpoint (``--tau``) or sweep Pass@1 across taus (``--sweep``)
- ``localize``  the largest updates: top-k with a tie rule, the maximum and its count, categories
- ``rounding``  ulp attribution of the changes (integer-ulp share, single-ulp flips)
- ``restore-ablation``  ES with subtract-to-restore vs exact restore, same seeds, side by side

Each writes ``<out>/<name>.md``, ``.tex``, ``.json`` and a PNG, prints the Markdown
tables (or, with ``--json``, only the JSON object) and reports problems as
:class:`~esreason.errors.UserError`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from esreason.analysis.output import print_result
from esreason.analysis.weights.checkpoints import DEFAULT_CHUNK_ELEMS
from esreason.analysis.weights.drift import PAPER_TAUS, PAPER_TAUS_HARD, parse_taus
from esreason.errors import UserError

DEFAULT_OUT = Path("runs") / "analysis"


def _out(args: argparse.Namespace, name: str) -> Path:
    return Path(args.out) if args.out else DEFAULT_OUT / name


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {v}")
    return v


def _check_labels(args: argparse.Namespace) -> None:
    if getattr(args, "tuned_ref", None) and args.label == args.ref_label:
        raise UserError(f"--label and --ref-label must differ (both {args.label!r})")


def _topk(value: int) -> int:
    if value < 1:
        raise UserError(f"--topk must be >= 1 (got {value})")
    return value


# --------------------------------------------------------------------------- drift


def _cmd_drift(args: argparse.Namespace) -> int:
    _check_labels(args)
    from esreason.analysis.weights.pair import analyze_pair
    from esreason.analysis.weights.plots import plot_update_histogram
    from esreason.analysis.tables import emit
    from esreason.analysis.weights.reports import drift_report

    taus = parse_taus(args.taus)
    topk = _topk(args.topk)
    progress = not args.no_progress
    tuned = analyze_pair(args.base, args.tuned, label=args.label, taus=taus, topk=topk,
                         chunk_elems=args.chunk_elems, progress=progress)
    ref = None
    if args.tuned_ref:
        ref = analyze_pair(args.base, args.tuned_ref, label=args.ref_label, taus=taus, topk=topk,
                           chunk_elems=args.chunk_elems, progress=progress)
    tables, payload = drift_report(tuned, ref)
    out = _out(args, "drift")
    from esreason.io.lock import directory_lock

    with directory_lock(out, what="analysis output"):  # one writer per output directory
        paths = list(emit(out, "drift", tables, payload).values())
        hists = {pa.label: (pa.drift.hist_edges, pa.drift.hist_counts) for pa in ([ref] if ref else []) + [tuned]}
        paths.append(plot_update_histogram(hists, taus, out / "drift_hist.png",
                                           title=f"|Δθ| of {args.label}" + (f" and {args.ref_label}" if ref else "")))
    print_result(args, tables, payload, paths)
    return 0


# --------------------------------------------------------------------------- threshold


def _sweep_taus(text: str) -> list[tuple[str, float]]:
    if text.strip().lower() == "easy":
        return parse_taus(PAPER_TAUS)
    if text.strip().lower() == "hard":
        return parse_taus(PAPER_TAUS_HARD)
    return parse_taus(text)


def _cmd_threshold(args: argparse.Namespace) -> int:
    from esreason.analysis.tables import emit
    from esreason.analysis.weights.reports import sweep_table, threshold_table

    if (args.tau is None) == (args.sweep is None):
        raise UserError("give exactly one of --tau T (write one checkpoint) or --sweep TAUS (evaluate several)")
    if args.tau is not None:
        from esreason.analysis.weights.threshold import write_thresholded

        parsed = parse_taus(args.tau)
        if len(parsed) != 1:
            raise UserError(f"--tau takes one threshold (got {args.tau!r}); use --sweep for several")
        ((label, tau),) = parsed
        stats = write_thresholded(args.base, args.tuned, tau, args.out, tau_label=label, chunk_elems=args.chunk_elems)
        table = threshold_table(stats)
        payload = {"checkpoint": str(args.out), **stats.to_json()}
        print_result(args, [table], payload, [Path(args.out)])
        return 0

    from esreason import tasks as task_registry
    from esreason.analysis.weights.plots import plot_threshold_sweep
    from esreason.analysis.weights.threshold import EvalSettings, run_sweep, sweep_payload

    taus = _sweep_taus(args.sweep)
    names = task_registry.resolve(args.tasks, args.suite)
    settings = EvalSettings(tasks=names, suite=args.suite, samples=args.samples, temperature=args.temperature,
                            top_p=args.top_p, max_new_tokens=args.max_new_tokens, limit=args.limit,
                            data_dir=args.data_dir, split=args.split, seed=args.seed, batch_size=args.batch_size,
                            device=args.device, dtype=args.dtype, bootstrap=args.bootstrap)
    if args.samples < 1:
        raise UserError(f"--samples must be >= 1 (got {args.samples})")
    out = Path(args.out)
    from esreason.io.lock import directory_lock

    with directory_lock(out, what="analysis output"):  # one writer per output directory
        rows = run_sweep(args.base, args.tuned, taus, settings, out, keep_checkpoints=args.keep_checkpoints,
                         chunk_elems=args.chunk_elems, progress=not args.no_progress)
        table = sweep_table(rows, settings, args.label)
        payload = sweep_payload(rows, settings, args.base, args.tuned)
        paths = list(emit(out, "threshold_sweep", [table], payload).values())
        base_row = rows[-1]
        points = [(100 * r.sparsity, 100 * (r.pass1 or 0.0), "full" if r.tau is None else f"τ={r.label}")
                  for r in rows[:-1]]
        paths.append(plot_threshold_sweep(points, None if base_row.pass1 is None else 100 * base_row.pass1,
                                          out / "threshold_sweep.png",
                                          title=f"Pass@1 vs update sparsity ({args.suite or args.tasks})"))
    print_result(args, [table], payload, paths)
    return 0


# --------------------------------------------------------------------------- localize / rounding


def _cmd_localize(args: argparse.Namespace) -> int:
    _check_labels(args)
    from esreason.analysis.weights.pair import analyze_pair
    from esreason.analysis.weights.plots import plot_category_counts
    from esreason.analysis.tables import emit
    from esreason.analysis.weights.reports import category_panels, localize_report

    topk = _topk(args.topk)
    progress = not args.no_progress
    tuned = analyze_pair(args.base, args.tuned, label=args.label, topk=topk, chunk_elems=args.chunk_elems,
                         progress=progress)
    ref = None
    if args.tuned_ref:
        ref = analyze_pair(args.base, args.tuned_ref, label=args.ref_label, topk=topk,
                           chunk_elems=args.chunk_elems, progress=progress)
    tables, payload = localize_report(tuned, ref, show=args.show)
    out = _out(args, "localize")
    from esreason.io.lock import directory_lock

    with directory_lock(out, what="analysis output"):  # one writer per output directory
        paths = list(emit(out, "localize", tables, payload).values())
        rows = ([ref] if ref else []) + [tuned]
        paths.append(plot_category_counts(category_panels(rows), out / "localize_categories.png",
                                          title="Where the largest updates are"))
    print_result(args, tables, payload, paths)
    return 0


def _cmd_rounding(args: argparse.Namespace) -> int:
    _check_labels(args)
    from esreason.analysis.weights.pair import analyze_pair
    from esreason.analysis.weights.plots import plot_category_counts
    from esreason.analysis.tables import emit
    from esreason.analysis.weights.reports import rounding_report

    progress = not args.no_progress
    pairs = [analyze_pair(args.base, args.tuned, label=args.label, rounding=True, chunk_elems=args.chunk_elems,
                          progress=progress)]
    if args.tuned_ref:
        pairs.insert(0, analyze_pair(args.base, args.tuned_ref, label=args.ref_label, rounding=True,
                                     chunk_elems=args.chunk_elems, progress=progress))
    tables, payload = rounding_report(pairs)
    out = _out(args, "rounding")
    from esreason.io.lock import directory_lock

    with directory_lock(out, what="analysis output"):  # one writer per output directory
        paths = list(emit(out, "rounding", tables, payload).values())
        panels = {"lattice steps between θ0 and θ (changed coordinates)":
                  {pa.label: pa.rounding.distance_buckets() for pa in pairs}}
        paths.append(plot_category_counts(panels, out / "rounding_lattice.png", title="Rounding attribution"))
    print_result(args, tables, payload, paths)
    return 0


# --------------------------------------------------------------------------- restore ablation


def _cmd_restore_ablation(args: argparse.Namespace) -> int:
    from esreason.analysis.weights.ablation import ablation_figures, ablation_report, run_restore_ablation
    from esreason.analysis.tables import emit

    taus = parse_taus(args.taus)
    out = Path(args.out)
    from esreason.io.lock import directory_lock

    with directory_lock(out, what="analysis output"):  # one writer per output directory
        analyses, endpoint, info = run_restore_ablation(args.config, args.set or [], args.steps, out, taus=taus,
                                                        topk=_topk(args.topk), with_null=args.with_null,
                                                        progress=not args.no_progress)
        tables, payload = ablation_report(analyses, endpoint, info)
        paths = list(emit(out, "restore_ablation", tables, payload).values())
        paths += ablation_figures(analyses, out, "restore_ablation")
    print_result(args, tables, payload, paths)
    return 0


# --------------------------------------------------------------------------- parser


def _pair_args(p: argparse.ArgumentParser, ref: bool = True) -> None:
    p.add_argument("--base", required=True, help="base checkpoint (HF directory with safetensors)")
    p.add_argument("--tuned", required=True, help="tuned checkpoint (same tensor names and shapes)")
    if ref:
        p.add_argument("--tuned-ref", default=None,
                       help="a second tuned checkpoint of the same base to compare with (e.g. GRPO)")
        p.add_argument("--ref-label", default="reference", help="name of --tuned-ref in tables (default: reference)")
    p.add_argument("--label", default="tuned", help="name of --tuned in tables (default: tuned)")


def _common(p: argparse.ArgumentParser, out_help: str) -> None:
    p.add_argument("--out", default=None, help=out_help)
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the Markdown tables")
    p.add_argument("--chunk-elems", type=_positive_int, default=DEFAULT_CHUNK_ELEMS,
                   help=f"elements per streamed chunk (memory bound; default {DEFAULT_CHUNK_ELEMS})")
    p.add_argument("--no-progress", action="store_true", help="no progress output on stderr")


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Add drift, threshold, localize, rounding and restore-ablation to the ``analyze`` sub-parsers."""
    taus_default = ",".join(PAPER_TAUS)

    p = sub.add_parser("drift", help="relative L2 drift, update sparsity s_tau, per-category drift, |Δ| histogram")
    _pair_args(p)
    p.add_argument("--taus", default=taus_default, help=f"comma-separated thresholds (default {taus_default})")
    p.add_argument("--topk", type=int, default=100, help="largest updates summarised by category (default 100)")
    _common(p, f"output directory (default {DEFAULT_OUT / 'drift'})")
    p.set_defaults(func=_cmd_drift)

    p = sub.add_parser("threshold", help="magnitude-thresholded checkpoint (--tau) or Pass@1 sweep (--sweep)")
    _pair_args(p, ref=False)
    p.add_argument("--tau", default=None, help="write the checkpoint with updates 0 < |Δ| <= TAU reset to base")
    p.add_argument("--sweep", default=None,
                   help="comma-separated taus, or 'easy' (paper: 2.5e-4..2e-3) / 'hard' (adds 2.5e-3, 3e-3)")
    p.add_argument("--out", required=True, help="--tau: the new checkpoint directory; --sweep: the results directory")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--suite", default=None, help="evaluation suite for --sweep (e.g. easy-indomain)")
    which.add_argument("--tasks", default=None, help="comma-separated tasks for --sweep")
    p.add_argument("--samples", type=int, default=32, help="responses per problem (paper: 32)")
    p.add_argument("--temperature", type=float, default=0.6, help="sampling temperature (paper: 0.6)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus mass (default 1.0)")
    p.add_argument("--max-new-tokens", type=int, default=2048, help="response limit (Easy 2048, Hard 8192)")
    p.add_argument("--limit", type=int, default=None, help="first N problems per task")
    p.add_argument("--data-dir", default=None, help="local datasets: DIR/<task>/<split>.jsonl")
    p.add_argument("--split", default="test", help="dataset split (default test)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    p.add_argument("--batch-size", type=int, default=256, help="rows per sampler batch (default 256)")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    p.add_argument("--dtype", default="float32", help="evaluation dtype (default float32)")
    p.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples for the CI (0: none)")
    p.add_argument("--keep-checkpoints", action="store_true", help="keep the thresholded checkpoints of a sweep")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the Markdown table")
    p.add_argument("--chunk-elems", type=_positive_int, default=DEFAULT_CHUNK_ELEMS, help=argparse.SUPPRESS)
    p.add_argument("--no-progress", action="store_true", help="no progress output")
    p.set_defaults(func=_cmd_threshold)

    p = sub.add_parser("localize", help="largest updates: top-k, maximum and its count, categories")
    _pair_args(p)
    p.add_argument("--topk", type=int, default=100, help="k of the top-k (default 100, as the paper)")
    p.add_argument("--show", type=int, default=20, help="rows of the top-k list printed (default 20)")
    _common(p, f"output directory (default {DEFAULT_OUT / 'localize'})")
    p.set_defaults(func=_cmd_localize)

    p = sub.add_parser("rounding", help="ulp attribution of the changes of a bf16/fp16/fp32 checkpoint")
    _pair_args(p)
    _common(p, f"output directory (default {DEFAULT_OUT / 'rounding'})")
    p.set_defaults(func=_cmd_rounding)

    p = sub.add_parser("restore-ablation",
                       help="ES with subtract-to-restore (the paper artifact) vs exact restore, same seeds")
    p.add_argument("--config", default=None, help="ES run config (YAML); --set overrides apply to both variants")
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="config override for both variants (repeatable), e.g. --set dtype=bfloat16 "
                        "--set es.master_weights=none")
    p.add_argument("--steps", type=int, required=True, help="ES updates per variant")
    p.add_argument("--out", required=True, help="output directory (must be new or empty)")
    p.add_argument("--taus", default=taus_default, help=f"thresholds for s_tau (default {taus_default})")
    p.add_argument("--topk", type=int, default=100, help="k of the top-k (default 100)")
    p.add_argument("--with-null", action="store_true",
                   help="also run both variants with es.alpha=0 (drift there is pure restore error)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the Markdown tables")
    p.add_argument("--no-progress", action="store_true", help="no progress output")
    p.set_defaults(func=_cmd_restore_ablation)
