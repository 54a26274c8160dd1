"""``esreason eval``: the command-line face of :func:`esreason.eval.harness.evaluate`.

    esreason eval --model PATH|demo (--tasks a,b | --suite NAME) --output DIR
                  [--samples 32] [--temperature 0.6] [--top-p 1.0] [--max-new-tokens 2048]
                  [--k 1,16,32] [--greedy] [--limit N] [--data-dir D] [--split test]
                  [--seed S] [--batch-size B] [--device cpu|cuda] [--dtype auto]
                  [--bootstrap 1000] [--no-progress] [--backend hf|vllm] [--engines E] [--engines-per-gpu K] [--tensor-parallel-size TP]
                  [--schedule auto|stream|calls]

Parsing only; bad values raise :class:`esreason.errors.UserError` (one line, exit 2).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from esreason.errors import UserError


def parse_ks(text: str | None, flag: str = "--k") -> tuple[int, ...] | None:
    """``"1,16,32"`` -> (1, 16, 32); UserError naming ``flag`` and the bad item."""
    if text is None:
        return None
    ks = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        try:
            ks.append(int(item))
        except ValueError:
            raise UserError(f"{flag}: {item!r} is not an integer (expected e.g. {flag} 1,16,32)") from None
    if not ks:
        raise UserError(f"{flag} is empty (expected e.g. {flag} 1,16,32)")
    return tuple(ks)


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the ``eval`` subcommand to the top-level CLI."""
    p = subparsers.add_parser(
        "eval", help="sampled evaluation: Pass@K, Maj@K, greedy accuracy, entropy (resumable)",
        description="Sample M responses per problem, verify them, and report Pass@1/Pass@K/Maj@K "
                    "(paper appendix 'Evaluation Metrics') with bootstrap intervals. Rerunning with the "
                    "same --output resumes.")
    p.add_argument("--model", required=True, help="'demo' (embedded default), a model directory or a hub id")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--tasks", help="comma-separated task names (esreason.tasks.names())")
    which.add_argument("--suite", help="a suite name (e.g. easy-heldout, hard-math, demo-heldout)")
    p.add_argument("--output", required=True, help="output directory (resumed when it holds the same protocol)")
    p.add_argument("--samples", type=int, default=32, help="responses per problem M (default 32)")
    p.add_argument("--temperature", type=float, default=0.6, help="sampling temperature (default 0.6)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus mass (default 1.0)")
    p.add_argument("--max-new-tokens", type=int, default=2048,
                   help="response limit (default 2048: Easy; the Hard setting uses 8192)")
    p.add_argument("--k", default=None,
                   help="comma-separated K for Pass@K and Maj@K (default 1,16,32 up to --samples)")
    p.add_argument("--greedy", action="store_true", help="also one greedy response per problem")
    p.add_argument("--limit", type=int, default=None, help="first N problems of each task")
    p.add_argument("--data-dir", default=None, help="local datasets: DIR/<task>/<split>.jsonl")
    p.add_argument("--split", default="test", help="dataset split (default test)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    p.add_argument("--batch-size", type=int, default=256, help="rows per sampler batch (default 256)")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    p.add_argument("--dtype", default="auto",
                   help="float32, bfloat16, float16 or auto: the model's own (its config.json; bfloat16 for the "
                        "paper's models, float32 for the embedded default); default auto")
    p.add_argument("--bootstrap", type=int, default=1000,
                   help="bootstrap resamples for the 95%% intervals (0: none; default 1000)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--backend", choices=("hf", "vllm"), default="hf",
                   help="sampler: hf (transformers, any device; default) or vllm (vLLM engines, "
                        "entropy by a teacher-forced pass; docs/evaluation.md)")
    p.add_argument("--engines", type=int, default=1,
                   help="vLLM engines, one GPU each; E > 1 runs them as Ray actors (default 1)")
    p.add_argument("--engines-per-gpu", type=int, default=1,
                   help="K vLLM engines share one GPU (1/K of a GPU and of the memory reservation each); "
                        "needs --engines >= 2 (default 1)")
    p.add_argument("--tensor-parallel-size", type=int, default=1,
                   help="GPUs per vLLM engine (tensor parallelism; each engine's weights split over them; "
                        "docs/tensor-parallel.md; default 1)")
    p.add_argument("--schedule", choices=("auto", "stream", "calls"), default="auto",
                   help="vLLM engines: 'stream' (auto's choice) hands each engine its whole share at once and "
                        "records problems as they complete; 'calls' runs one batch-size call after another "
                        "(same row seeds; docs/evaluation.md)")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Run the evaluation described by parsed ``args``; prints the summary table."""
    from esreason.backends.hf import resolve_dtype
    from esreason.eval.harness import evaluate
    from esreason.tasks import resolve

    names = resolve(tasks=args.tasks, suite_name=args.suite)
    if not names:
        raise UserError("--tasks names no task")
    summary = evaluate(args.model, names, output_dir=Path(args.output), samples=args.samples,
                       temperature=args.temperature, top_p=args.top_p, max_new_tokens=args.max_new_tokens,
                       ks=parse_ks(args.k), greedy=args.greedy, limit=args.limit, data_dir=args.data_dir,
                       seed=args.seed, batch_size=args.batch_size, split=args.split,
                       progress=not args.no_progress, device=args.device, dtype=resolve_dtype(args.model, args.dtype),
                       ci_resamples=args.bootstrap, suite=args.suite, backend=args.backend, engines=args.engines,
                       engines_per_gpu=args.engines_per_gpu, schedule=args.schedule,
                       tensor_parallel_size=args.tensor_parallel_size)
    print(summary.to_markdown())
    print(f"results: {summary.output_dir}/summary.json, {summary.output_dir}/<task>/responses.jsonl")
    return 0
