"""``esreason analyze coverage RUN`` and ``esreason analyze lemma1``: parsers and commands (docs/coverage.md).

Each writes ``<out>/<name>.md/.tex/.json`` and its PNGs and prints the Markdown tables or,
with ``--json``, the JSON payload.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from esreason.analysis.coverage.lemma1 import Lemma1Settings, parse_sigmas

def cmd_coverage(args: argparse.Namespace) -> int:
    from esreason.analysis.coverage.plots import plot_coverage
    from esreason.analysis.coverage.report import coverage_report, load_coverage_rows
    from esreason.analysis.tables import dumps, emit, render_markdown

    rows = load_coverage_rows(args.run)
    out = Path(args.out) if args.out else Path(args.run) / "plots" / "coverage"
    tables, payload = coverage_report(rows, args.run)
    from esreason.io.lock import directory_lock

    with directory_lock(out, what="analysis output"):  # one writer per output directory
        paths = list(emit(out, "coverage", tables, payload).values())
        paths += plot_coverage(rows, out, f"Coverage diagnostics: {Path(args.run).name}")
    print(dumps(payload) if args.json else render_markdown(tables))
    print("wrote: " + ", ".join(str(p) for p in paths), file=sys.stderr)
    return 0


def cmd_lemma1(args: argparse.Namespace) -> int:
    from esreason.analysis.coverage.lemma1 import lemma1_report, run_lemma1
    from esreason.analysis.coverage.plots import plot_lemma1
    from esreason.analysis.tables import dumps, emit, render_markdown

    settings = Lemma1Settings(model=args.model, task=args.task, split=args.split, sigmas=parse_sigmas(args.sigmas),
                              population=args.population, prompts=args.prompts, samples=args.samples,
                              fisher_samples=args.fisher_samples, repeats=args.repeats,
                              max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                              dtype=args.dtype, seed=args.seed)
    res = run_lemma1(settings, progress=not args.no_progress)
    out = Path(args.out)
    table = lemma1_report(res)
    from esreason.io.lock import directory_lock

    with directory_lock(out, what="analysis output"):  # one writer per output directory
        paths = list(emit(out, "lemma1", [table], res).values())
        paths.append(plot_lemma1(res, out / "lemma1.png"))
    print(dumps(res) if args.json else render_markdown([table]))
    print("wrote: " + ", ".join(str(p) for p in paths), file=sys.stderr)
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Register ``coverage`` and ``lemma1`` on the ``analyze`` sub-parsers."""
    p = sub.add_parser("coverage", help="population coverage diagnostics of an ES run (P_pop vs P_same, JS_succ, "
                                        "Cov(w,p), Proposition 1)")
    p.add_argument("run", help="ES run directory trained with coverage.every > 0")
    p.add_argument("--out", default=None, help="output directory (default RUN/plots/coverage)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the Markdown tables")
    p.set_defaults(func=cmd_coverage)

    d = Lemma1Settings()
    p = sub.add_parser("lemma1", help="numerical check of Lemma 1: JS_pol vs (σ²/2)(1−1/N) tr I_x over a σ grid")
    p.add_argument("--model", default=d.model, help="'demo' or a HF model directory (default demo)")
    p.add_argument("--task", default=d.task, help=f"task whose prompts are used (default {d.task})")
    p.add_argument("--split", default=d.split, help=f"dataset split (default {d.split})")
    p.add_argument("--sigmas", default=",".join(f"{v:g}" for v in d.sigmas), help="comma-separated σ grid")
    p.add_argument("--population", type=int, default=d.population, help=f"N (default {d.population})")
    p.add_argument("--prompts", type=int, default=d.prompts, help=f"prompts (default {d.prompts})")
    p.add_argument("--samples", type=int, default=d.samples,
                   help=f"responses per member and prompt for JS_pol (default {d.samples})")
    p.add_argument("--fisher-samples", type=int, default=d.fisher_samples,
                   help=f"centre responses per prompt for tr I_x (default {d.fisher_samples})")
    p.add_argument("--repeats", type=int, default=d.repeats, help=f"populations per σ (default {d.repeats})")
    p.add_argument("--max-new-tokens", type=int, default=d.max_new_tokens, help=f"(default {d.max_new_tokens})")
    p.add_argument("--temperature", type=float, default=d.temperature,
                   help=f"policy temperature: pi = softmax(logits/T) (default {d.temperature})")
    p.add_argument("--dtype", default=d.dtype, help="float32 (default, what ES samples from) or float64 (same numbers on the demo, about 3x slower)")
    p.add_argument("--seed", type=int, default=d.seed, help="population and sampling seed (default 0)")
    p.add_argument("--out", default=str(Path("runs") / "analysis" / "lemma1"), help="output directory")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the Markdown table")
    p.add_argument("--no-progress", action="store_true", help="no progress output")
    p.set_defaults(func=cmd_lemma1)


__all__ = ["add_parsers", "cmd_coverage", "cmd_lemma1"]
