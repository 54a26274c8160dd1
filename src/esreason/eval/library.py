"""In-process evaluation for trainers (periodic held-out evaluation), no files.

The same code path as ``esreason eval`` (:mod:`esreason.eval.harness`): problems are
sampled and verified call by call (:func:`esreason.eval.collect.run_chunk`) and turned
into numbers by :mod:`esreason.eval.aggregate`.
"""

from __future__ import annotations

import time
from typing import Any, Sequence

from esreason.backends.base import Generator
from esreason.eval.aggregate import AVERAGE, metric_names, summarize, task_table
from esreason.eval.answers import equivalence
from esreason.eval.bootstrap import Bootstrap
from esreason.eval.collect import DEFAULT_ROWS_PER_CALL, TaskScorers, Timings, plan_chunks, problems_per_call, run_chunk
from esreason.eval.records import ProblemRecord, Protocol, check_ks
from esreason.eval.verify import default_workers
from esreason.io.progress import progress_bar
from esreason.tasks.base import Problem


def evaluate_problems(generator: Generator, tokenizer: Any, problems: Sequence[Problem], *, samples: int,
                      temperature: float, max_new_tokens: int, ks: Sequence[int] | None, seed: int,
                      greedy: bool = True, top_p: float = 1.0, rows_per_call: int = DEFAULT_ROWS_PER_CALL,
                      ci_resamples: int = 0, progress: bool = False) -> dict[str, float | int | None]:
    """Sample ``samples`` responses per problem, verify, and return the metrics as a flat dict.

    Keys: ``<metric>`` for the equal-weight average over the problems' tasks and
    ``<task>/<metric>`` per task, metric in :func:`esreason.eval.aggregate.metric_names`
    (``pass@k``, ``maj@k``, ``maj@k_expected``, ``greedy_acc``, ``entropy``, ``tokens``,
    ``formatted``); ``num_problems``; ``time/generate_s``, ``time/verify_s``,
    ``time/aggregate_s``; ``tokens_generated``. With ``ci_resamples > 0`` every metric also
    gets ``<key>/ci_low`` and ``<key>/ci_high`` (percentile bootstrap, 95 %).
    Problems may come from several tasks (``Problem.task``); ``ks`` default: K in {1, 16, 32}
    up to ``samples``. A trainer calls this with its own generator (the policy's centre).
    """
    protocol = Protocol(samples=samples, temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens,
                        greedy=greedy, seed=seed)
    ks = check_ks(ks, samples)
    scorers = TaskScorers(tokenizer=tokenizer)
    timings = Timings()
    records: dict[str, list[ProblemRecord]] = {}
    chunks = plan_chunks(problems, problems_per_call(samples, rows_per_call))
    with progress_bar(len(problems), "evaluate", disable=None if progress else True) as bar:
        for chunk in chunks:
            task, scorer = scorers.get(chunk.task)
            out = run_chunk(generator, tokenizer, chunk, task, protocol, scorer,
                            workers=default_workers(task.verifier), timings=timings)
            records.setdefault(chunk.task, []).extend(out)
            bar.update(len(chunk.problems))
    t0 = time.perf_counter()
    names = metric_names(ks, samples, greedy)
    tables = {t: task_table(recs, ks, equivalence(scorers.tasks[t]), default_workers(scorers.tasks[t].verifier),
                         scorers.tasks[t].votes)
              for t, recs in records.items()}
    estimates = summarize(tables, names, Bootstrap(ci_resamples, seed=seed) if ci_resamples > 0 else None)
    aggregate_s = time.perf_counter() - t0
    flat: dict[str, float | int | None] = {}
    for group, per_metric in estimates.items():
        prefix = "" if group == AVERAGE else f"{group}/"
        for name, est in per_metric.items():
            flat[prefix + name] = est.value
            if ci_resamples > 0:
                flat[f"{prefix}{name}/ci_low"] = est.low
                flat[f"{prefix}{name}/ci_high"] = est.high
    flat["num_problems"] = len(problems)
    flat["tokens_generated"] = timings.tokens
    flat["time/generate_s"] = timings.generate_s
    flat["time/verify_s"] = timings.verify_s
    flat["time/aggregate_s"] = aggregate_s
    return flat
