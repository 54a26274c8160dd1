"""``esreason.evaluate``: Pass@K, Maj@K and entropy of a model on a dataset and reward, or on tasks.

The same harness as ``esreason eval`` (:func:`esreason.eval.harness.evaluate`): M samples per problem,
the unbiased Pass@K estimator, plurality Maj@K, token entropy, 95 % bootstrap intervals, a
resumable output directory. The result is a dict keyed as the CLI's summary is (``pass@1``,
``pass@16``, ``maj@16``, ``entropy``, ...; the equal-weight average over the tasks), with the
intervals under ``ci`` and, for several tasks, each task under ``tasks``.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, Callable, Hashable, Sequence

from esreason.errors import UserError

MAJ_NOTE = ("left out: the task's samples carry no answer to vote on (reward functions without an "
            "answer_fn; pass answer_fn=... to get Maj@K)")


def evaluate(model: Any, dataset: Any = None, *, reward_funcs: Any = None, task: str | Sequence[str] | None = None,
             n: int = 8, k: Sequence[int] | None = None, pass_threshold: float = 1.0,
             answer_fn: Callable[[str], Hashable | None] | None = None,
             reward_weights: Sequence[float] | None = None, name: str = "custom-eval", temperature: float = 0.6,
             top_p: float = 1.0, max_new_tokens: int = 2048, greedy: bool = False, split: str = "test",
             limit: int | None = None, seed: int = 0, output_dir: str | Path | None = None,
             tasks_dir: str | Path | None = None, data_dir: str | Path | None = None, batch_size: int = 256,
             device: str | None = None, dtype: str = "auto", ci_resamples: int = 1000,
             processing_class: Any = None, progress: bool = False) -> dict[str, Any]:
    """Evaluate ``model`` at Pass@K, Maj@K and entropy and return the metrics: a dict keyed as
    ``esreason eval``'s summary (``pass@1``, ``pass@16``, ``maj@16``, ``entropy``, ...; the
    equal-weight average over the tasks), the 95 % bootstrap intervals under ``ci``, each task under
    ``tasks`` when there are several, and ``notes``.

    Give either ``dataset`` with ``reward_funcs`` (a user's data, scored by TRL-style reward
    functions) or ``task`` (registered tasks scored by their verifiers).

    model: 'demo', a model or checkpoint directory, a hub id, a ``PreTrainedModel`` (with
        ``processing_class``, or its tokenizer is loaded from ``name_or_path``), or a
        ``(model, tokenizer)`` pair.
    dataset: a ``datasets.Dataset`` or a list of dicts with a ``prompt`` column, registered as task
        ``name`` (split ``test``).
    reward_funcs: one callable or a list with TRL's contract (as for :class:`esreason.ESTrainer`)
        scoring ``dataset``'s completions.
    task: instead of a dataset, one or several registered tasks (built-ins, task files under
        ``tasks_dir``); several give each task's metrics under ``tasks`` and their equal-weight average.
    n: samples per problem (M).
    k: the K of Pass@K and Maj@K, each <= ``n`` (None: 1, 16, 32 up to ``n``).
    pass_threshold: a sample is correct when its combined reward is >= this (with ``reward_funcs``).
    answer_fn: ``answer_fn(completion) -> hashable | None``, the answer Maj@K votes on (with
        ``reward_funcs``); without it Maj@K is left out and ``notes`` says why.
    reward_weights: one weight per reward function (TRL's ``reward_weights``); None = 1 each.
    name: the task name ``dataset`` is registered under (it seeds the sampling, as a task's name does).
    temperature: sampling temperature of the ``n`` samples.
    top_p: nucleus mass of the samples.
    max_new_tokens: response limit in tokens.
    greedy: also one greedy response per problem (``greedy_acc``).
    split: the split of the registered tasks evaluated (a ``dataset`` is split ``test``).
    limit: only the first ``limit`` problems of each task (None: all).
    seed: sampling seed (the same seed gives the same samples).
    output_dir: where responses.jsonl and summary.json go; a later call with the same directory
        resumes (None: a temporary directory, removed).
    tasks_dir: a directory of task files registered before ``task`` is looked up.
    data_dir: a directory with ``<data_dir>/<task>/<split>.jsonl`` for the registered tasks.
    batch_size: sampler rows per generate call (responses are bit-reproducible for one batch size).
    device: the torch device (None: CUDA when available, else the CPU).
    dtype: dtype the model is loaded in ('auto': the model's own for a directory or hub id, float32
        for an in-memory model).
    ci_resamples: bootstrap resamples of the 95 % intervals under ``ci`` (0: no intervals).
    processing_class: the tokenizer of an in-memory ``model``.
    progress: show a progress bar.

    Example::

        from esreason import evaluate

        def exact(completions, total, **kwargs):
            return [float(str(t) in c) for c, t in zip(completions, total)]

        rows = [{"prompt": f"{a}+{b}", "total": a + b} for a, b in [(12, 30), (25, 17), (31, 9), (40, 2)]]
        scores = evaluate("demo", rows, reward_funcs=exact, n=4, k=[1, 4], max_new_tokens=32)
        print(scores["pass@1"], scores["pass@4"], scores["ci"]["pass@1"])
        builtin = evaluate("demo", task="demo-add", n=4, k=[1, 4], limit=8, max_new_tokens=32)
        print(builtin["pass@4"], builtin["maj@4"])
    """
    from esreason import tasks as registry
    from esreason.api.data import register_api_task, reward_task
    from esreason.eval.harness import evaluate as harness_evaluate

    if (dataset is None) == (task is None):
        raise UserError("evaluate: give a dataset with reward_funcs, or task=... (registered tasks), not both")
    if tasks_dir is not None:
        registry.add_tasks_dir(tasks_dir)
    if dataset is not None:
        if reward_funcs is None:
            raise UserError("evaluate: a dataset needs reward_funcs to score its completions")
        if split != "test":
            raise UserError(f"split: {split!r}; an in-memory dataset is evaluated as the 'test' split")
        names = [register_api_task(reward_task(name, reward_funcs, {"test": dataset}, reward_weights=reward_weights,
                                               pass_threshold=pass_threshold, answer_fn=answer_fn)).name]
    else:
        if reward_funcs is not None or answer_fn is not None or reward_weights is not None or pass_threshold != 1.0:
            raise UserError("evaluate: reward_funcs / answer_fn / reward_weights / pass_threshold go with a dataset; "
                            "a registered task has its own")
        names = [task] if isinstance(task, str) else list(task)  # type: ignore[arg-type]
        for t in names:
            registry.get(t)
    spec = _model_spec(model, processing_class)
    from esreason.backends.hf import resolve_dtype

    if isinstance(spec, str):
        dtype = resolve_dtype(spec, dtype)
    elif dtype == "auto":
        dtype = "float32"
    with tempfile.TemporaryDirectory(prefix="esreason-eval-") as tmp:
        out = Path(output_dir) if output_dir is not None else Path(tmp) / "eval"
        summary = harness_evaluate(spec, names, output_dir=out, samples=n, temperature=temperature, top_p=top_p,
                                   max_new_tokens=max_new_tokens, ks=k, greedy=greedy, limit=limit,
                                   data_dir=data_dir, seed=seed, batch_size=batch_size, split=split,
                                   progress=progress, device=device, dtype=dtype, ci_resamples=ci_resamples)
        return results_dict(summary, {t: registry.get(t).votes for t in names},
                            None if output_dir is None else str(out))


def _model_spec(model: Any, processing_class: Any) -> Any:
    """What the harness takes: a spec string, or a (model, tokenizer) pair."""
    if isinstance(model, (str, Path)):
        return str(model)
    if isinstance(model, tuple) and len(model) == 2:
        return model
    import torch

    if isinstance(model, torch.nn.Module):
        if processing_class is None:
            from transformers import AutoTokenizer

            processing_class = AutoTokenizer.from_pretrained(model.name_or_path)
        return model, processing_class
    raise UserError(f"model: expected 'demo', a model directory, a hub id, a PreTrainedModel or a "
                    f"(model, tokenizer) pair, got {type(model).__name__}")


def _flat(estimates: dict[str, Any], keep: Callable[[str], bool]) -> tuple[dict[str, Any], dict[str, Any]]:
    values = {m: e.value for m, e in estimates.items() if keep(m)}
    cis = {m: [e.low, e.high] for m, e in estimates.items() if keep(m) and e.low is not None}
    return values, cis


def results_dict(summary: Any, votes: dict[str, bool], output_dir: str | None) -> dict[str, Any]:
    """The summary as the API returns it (see the module docstring)."""
    from esreason.eval.aggregate import AVERAGE

    def keep_for(task_votes: bool) -> Callable[[str], bool]:
        return lambda m: task_votes or not m.startswith("maj@")

    all_vote = all(votes.values())
    values, cis = _flat(summary.estimates[AVERAGE], keep_for(all_vote))
    out: dict[str, Any] = {**values, "ci": cis, "num_problems": sum(summary.num_problems.values()),
                           "samples": summary.protocol.samples, "output_dir": output_dir}
    if len(summary.tasks) > 1:
        out["tasks"] = {}
        for t in summary.tasks:
            tv, tc = _flat(summary.estimates[t], keep_for(votes[t]))
            out["tasks"][t] = {**tv, "ci": tc, "num_problems": summary.num_problems[t]}
    silent = [t for t, v in votes.items() if not v]
    if silent:
        out["notes"] = {"maj@k": f"{MAJ_NOTE}: {', '.join(silent)}"}
    return out


__all__ = ["MAJ_NOTE", "evaluate", "results_dict"]
