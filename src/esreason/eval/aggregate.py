"""From records to numbers: per-problem metrics, task means and equal-weight averages.

Per problem (M sampled responses, c correct; paper, appendix "Evaluation Metrics"):

- ``pass@k`` for every k: the unbiased estimator (:func:`esreason.eval.metrics.pass_at_k`);
  ``pass@1`` = c / M.
- ``maj@k`` for every k > 1: plurality vote over the first k responses, the paper's
  protocol; ``maj@k_expected``: its exact expectation over random k-subsets (only for
  k < M; at k = M the two coincide). Rules: :mod:`esreason.eval.voting`.
- ``greedy_acc``: the greedy response is correct (only when the protocol has one).
- ``entropy``: token-level entropy of the sampling distribution, pooled over the M
  responses' tokens (:func:`esreason.eval.metrics.pooled_entropy`).
- ``tokens``: mean response length in tokens; ``formatted``: share of responses that
  followed the task's answer format.

A task's score is the mean over its problems (each problem weighs the same); the
average of several tasks is the mean of task scores (each task weighs the same), with
bootstrap intervals (:mod:`esreason.eval.bootstrap`).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Mapping, Sequence

from esreason.eval.bootstrap import Bootstrap, Estimate
from esreason.eval.metrics import pass_at_k, pooled_entropy
from esreason.eval.records import ProblemRecord
from esreason.eval.voting import expected_majority, group_answers, group_correctness, majority_winner


def metric_names(ks: Sequence[int], samples: int, greedy: bool) -> list[str]:
    """Metric keys in report order."""
    names = [f"pass@{k}" for k in ks]
    names += [f"maj@{k}" for k in ks if k > 1]
    names += [f"maj@{k}_expected" for k in ks if 1 < k < samples]
    if greedy:
        names.append("greedy_acc")
    return names + ["entropy", "tokens", "formatted"]


def problem_metrics(record: ProblemRecord, ks: Sequence[int],
                    equivalent: Callable[[str, str], bool] | None = None,
                    votes: bool = True) -> dict[str, float | None]:
    """All metrics of one problem (keys as in :func:`metric_names`, plus ``correct`` = c).

    votes: False for a task whose samples carry no answer (reward functions without an
    ``answer_fn``): its Maj@K values are None (left out), not 0.
    """
    samples = record.samples
    m = len(samples)
    correct = [s.correct for s in samples]
    c = sum(correct)
    out: dict[str, float | None] = {"correct": float(c)}
    for k in ks:
        out[f"pass@{k}"] = pass_at_k(m, c, k)
    ids = group_answers([s.vote for s in samples], equivalent)
    ok = group_correctness(ids, correct)
    for k in ks:
        if k > 1:
            winner = majority_winner(ids[:k])
            out[f"maj@{k}"] = float(winner is not None and ok[winner]) if votes else None
        if 1 < k < m:
            out[f"maj@{k}_expected"] = float(expected_majority(ids, ok, k)) if votes else None
    if record.greedy is not None:
        out["greedy_acc"] = float(record.greedy.correct)
    entropies = [s.entropy_sum for s in samples]
    out["entropy"] = None if any(e is None for e in entropies) else \
        pooled_entropy([float(e) for e in entropies], [s.num_tokens for s in samples])  # type: ignore[arg-type]
    out["tokens"] = sum(s.num_tokens for s in samples) / m
    out["formatted"] = sum(s.formatted for s in samples) / m
    return out


def task_table(records: Sequence[ProblemRecord], ks: Sequence[int],
               equivalent: Callable[[str, str], bool] | None = None,
               workers: int = 1, votes: bool = True) -> list[dict[str, float | None]]:
    """problem_metrics of every record, in order.

    workers: threads over problems; worth it only when ``equivalent`` waits on other
    processes (math-verify's worker pool groups non-numeric math answers).
    """
    if workers > 1 and equivalent is not None and len(records) > 1:
        with ThreadPoolExecutor(max_workers=min(workers, len(records)), thread_name_prefix="esreason-vote") as ex:
            return list(ex.map(lambda r: problem_metrics(r, ks, equivalent, votes), records))
    return [problem_metrics(r, ks, equivalent, votes) for r in records]


def summarize(tables: Mapping[str, Sequence[Mapping[str, float | None]]], names: Sequence[str],
              bootstrap: Bootstrap | None = None) -> dict[str, dict[str, Estimate]]:
    """Per task and for the equal-weight average ("__average__"): an Estimate per metric.

    Without ``bootstrap`` the intervals are None (point estimates only).
    """
    out: dict[str, dict[str, Estimate]] = {}
    for task, rows in tables.items():
        out[task] = {}
        for name in names:
            values = [row.get(name) for row in rows]
            if bootstrap is not None:
                out[task][name] = bootstrap.task(task, values)
            else:
                present = [float(v) for v in values if v is not None]
                out[task][name] = Estimate(sum(present) / len(present) if present else None, None, None,
                                           len(present))
    average: dict[str, Estimate] = {}
    for name in names:
        by_task = {task: [row.get(name) for row in rows] for task, rows in tables.items()}
        if bootstrap is not None:
            average[name] = bootstrap.suite(by_task)
        else:
            means = [out[t][name].value for t in tables if out[t][name].value is not None]
            average[name] = Estimate(sum(means) / len(means) if means else None, None, None, len(means))
    out[AVERAGE] = average
    return out


AVERAGE = "__average__"
