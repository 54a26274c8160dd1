"""The harness's streamed path: every unanswered problem of every task to the engines at once.

Used by :func:`esreason.eval.harness.evaluate` when the generator is a set of evaluation engines
that can stream (``--backend vllm``; :mod:`esreason.backends.eval_stream`). The protocol, seeds and
files are the call path's (:mod:`esreason.eval.collect`): problem i of call c of a task gets the
same row seeds as there, each finished problem is verified and appended to its task's
``responses.jsonl`` at once (a kill loses only the problems in flight, and the rerun samples
exactly those again), and when a task is complete its file is rewritten in problem order, so the
finished file does not depend on which engine finished first.

Verification runs on the driver while the engines generate. Timings: per task the responses,
tokens, verification seconds (overlapped) and ``generate_s``, the task's share of the stream's
wall time by rows (so ``generate_s / generate_calls`` stays the per-call figure the calibrated plan
reads); in ``total``: the stream's wall time and, per engine, ``active_s`` and the fraction of the
wall time it spent generating.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, Sequence

from esreason.backends.base import SamplingParams
from esreason.eval.collect import Timings, TaskScorers, call_seed, plan_chunks, problem_record
from esreason.eval.records import Protocol, problem_fingerprint
from esreason.eval.results import ResponsesFile
from esreason.eval.verify import default_workers, score_batch
from esreason.tasks.base import Problem, problem_prompt


def stream_jobs(tokenizer: Any, name: str, items: Sequence[Problem], responses: ResponsesFile, protocol: Protocol,
                per_call: int) -> list[Any]:
    """The unanswered problems of one task as stream jobs, each with the call path's row seeds."""
    from esreason.backends.eval_stream import StreamJob
    from esreason.backends.vllm import request_seeds

    m = protocol.samples
    jobs = []
    for chunk in plan_chunks(items, per_call):
        seeds = request_seeds(call_seed(protocol.seed, chunk.task, chunk.index), len(chunk.problems) * m)
        greedy = request_seeds(0, len(chunk.problems)) if protocol.greedy else None
        for i, problem in enumerate(chunk.problems):
            if responses.is_complete(problem.id):
                continue
            jobs.append(StreamJob((name, problem, chunk.index), problem_prompt(tokenizer, problem),
                                  seeds[i * m:(i + 1) * m], None if greedy is None else greedy[i]))
    return jobs


def answer_streamed(generator: Any, tokenizer: Any, names: Sequence[str], problems: dict[str, list[Problem]],
                    scorers: TaskScorers, protocol: Protocol, paths: dict[str, Path], per_call: int,
                    bar: Callable[[int, int], Any]) -> tuple[dict[str, ResponsesFile], dict[str, Timings],
                                                             dict[str, int], dict[str, Any]]:
    """Answer every unanswered problem of ``names`` on the engines at once.

    Returns (responses file per task, this run's timings per task, problems already answered per
    task, stream record). ``bar(total, initial)`` opens a progress bar (context manager).
    """
    files, done, jobs = {}, {}, []
    for name in names:
        files[name] = ResponsesFile(paths[name], protocol)
        files[name].check_fingerprints({p.id: problem_fingerprint(p) for p in problems[name]})
        done[name] = sum(files[name].is_complete(p.id) for p in problems[name])
        jobs += stream_jobs(tokenizer, name, problems[name], files[name], protocol, per_call)
    stats = {name: Timings() for name in names}
    rows_per_problem = protocol.samples + (1 if protocol.greedy else 0)
    params = SamplingParams(max_new_tokens=protocol.max_new_tokens, temperature=float(protocol.temperature),
                            top_p=float(protocol.top_p), seed=protocol.seed, compute_entropy=True)
    right = total = 0
    t0 = time.perf_counter()
    with bar(sum(len(problems[n]) for n in names), sum(done.values())) as progress:
        for res in generator.stream(jobs, params):
            name, problem, _ = res.job.key
            task, scorer = scorers.get(name)
            v0 = time.perf_counter()
            texts = list(res.texts) + ([res.greedy_text] if res.greedy_ids is not None else [])
            verdicts = score_batch(scorer, texts, [problem.gold] * len(texts), [0] * len(texts),
                                   default_workers(task.verifier))
            m = len(res.texts)
            greedy = None if res.greedy_ids is None else (res.greedy_text, len(res.greedy_ids), verdicts[m])
            record = problem_record(problem, task, res.texts, [len(t) for t in res.token_ids], res.entropy_sum,
                                    verdicts[:m], greedy, res.job.seeds, res.job.greedy_seed)
            files[name].append([record])
            s = stats[name]
            s.verify_s += time.perf_counter() - v0
            s.tokens += sum(len(t) for t in res.token_ids) + (len(res.greedy_ids) if res.greedy_ids else 0)
            s.responses += len(texts)
            right += sum(x.correct for x in record.samples)
            total += len(record.samples)
            progress.update(1)
            progress.set_postfix({"pass@1": f"{right / total:.3f}"}, refresh=False)
    wall = time.perf_counter() - t0
    asked = {name: sum(1 for j in jobs if j.key[0] == name) for name in names}
    all_rows = max(1, sum(asked.values()))
    for name in names:
        items = problems[name]
        files[name].rewrite_in_order([p.id for p in items])
        s = stats[name]
        s.generate_s = wall * asked[name] / all_rows  # the task's share of the stream by rows
        calls = len({j.key[2] for j in jobs if j.key[0] == name})  # the call path's calls these problems fill
        s.calls = calls * (2 if protocol.greedy else 1)
    engines = [{**c, "generating_fraction": round(c["active_s"] / wall, 4) if wall > 0 else None,
                "mean_rows_in_flight": round(c.get("row_s", 0.0) / c["active_s"], 2) if c["active_s"] > 0 else None}
               for c in generator.stream_counters]
    record = {"schedule": "stream", "wall_s": round(wall, 4), "problems": len(jobs),
              "rows": len(jobs) * rows_per_problem, "engines": sorted(engines, key=lambda e: e["engine"])}
    return files, stats, done, record
