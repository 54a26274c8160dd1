"""The evaluation harness behind ``esreason eval``: sample, verify, write, summarise, resume.

Protocol (paper, appendix "Evaluation Configuration" and "Evaluation Metrics"): M
responses per problem (32) at temperature 0.6, up to 2,048 (Easy) or 8,192 (Hard) new
tokens, optionally one greedy response (Easy); Pass@1, Pass@K and Maj@K for K in
{16, 32}; task scores are means over problems, multi-task averages weigh tasks equally.
We add the token-level entropy of the sampling distribution and 95 % bootstrap
intervals for every number.

Resuming: the output directory's ``manifest.json`` fixes the protocol (samples,
temperature, top-p, max new tokens, greedy, seed, split, model weights hash). A rerun
with the same protocol skips every problem whose responses are all in its task's
``responses.jsonl``; a call with some answered problems is regenerated whole (same
seed, same prompts, so the same responses) and only the missing problems are written.
A different protocol is refused (UserError). ``ks`` and the bootstrap settings only
affect the summary, which is recomputed from the files on every run.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from esreason.backends.base import Generator
from esreason.errors import UserError
from esreason.eval.aggregate import AVERAGE, metric_names, summarize, task_table
from esreason.eval.answers import equivalence
from esreason.eval.bootstrap import Bootstrap, Estimate
from esreason.eval.collect import TaskScorers, Timings, plan_chunks, problems_per_call, run_chunk
from esreason.eval.records import Protocol, check_ks, problem_fingerprint
from esreason.eval.results import (MANIFEST_KIND, RESPONSES_FILE, ResponsesFile, check_manifest, summary_markdown,
                                   write_manifest, write_problem_table, write_summary)
from esreason.eval.verify import default_workers
from esreason.io.progress import progress_bar
from esreason.tasks.base import Problem, Task
from esreason.verifiers.base import Verdict

log = logging.getLogger(__name__)


@dataclass
class Summary:
    """What an evaluation measured (also written to ``summary.json`` / ``summary.md``).

    estimates: per task name, and for the equal-weight average under ``"__average__"``,
        an :class:`~esreason.eval.bootstrap.Estimate` per metric name.
    """

    output_dir: Path
    model: str
    tasks: list[str]
    names: list[str]
    ks: tuple[int, ...]
    protocol: Protocol
    split: str
    num_problems: dict[str, int]
    estimates: dict[str, dict[str, Estimate]]
    bootstrap: dict[str, Any]
    timings: dict[str, Any] = field(default_factory=dict)
    suite: str | None = None

    def value(self, metric: str, task: str | None = None) -> float | None:
        """Point estimate of ``metric`` for ``task`` (None: the equal-weight average)."""
        return self.estimates[AVERAGE if task is None else task][metric].value

    def as_dict(self) -> dict[str, Any]:
        return {
            "model": self.model, "suite": self.suite, "split": self.split, "protocol": self.protocol.as_dict(),
            "ks": list(self.ks), "metrics": self.names, "bootstrap": self.bootstrap,
            "tasks": {t: {"num_problems": self.num_problems[t],
                          "metrics": {n: self.estimates[t][n].as_dict() for n in self.names}} for t in self.tasks},
            "average": {"tasks": self.tasks,
                        "weighting": "equal weight per task; equal weight per problem within a task",
                        "metrics": {n: self.estimates[AVERAGE][n].as_dict() for n in self.names}},
            "timings": self.timings,
        }

    def to_markdown(self) -> str:
        p = self.protocol
        header = [f"model: `{self.model}`" + (f"; suite: {self.suite}" if self.suite else ""),
                  f"protocol: {p.samples} samples per problem, temperature {p.temperature}, top-p {p.top_p}, "
                  f"max {p.max_new_tokens} new tokens, greedy: {'yes' if p.greedy else 'no'}, seed {p.seed}, "
                  f"split {self.split}"]
        rows = [(t, self.num_problems[t], self.estimates[t]) for t in self.tasks]
        if len(self.tasks) > 1:
            rows.append(("**average**", sum(self.num_problems.values()), self.estimates[AVERAGE]))
        return summary_markdown("Evaluation summary", header, rows, self.names)


def _resolve_data_path(data_dir: str | Path | None, task: str) -> Path | None:
    """``DATA/<task>`` (a directory of ``<split>.jsonl``) or ``DATA/<task>.jsonl``, if present."""
    if data_dir is None:
        return None
    root = Path(data_dir)
    if not root.is_dir():
        raise UserError(f"data directory not found: {root}")
    for candidate in (root / task, root / f"{task}.jsonl"):
        if candidate.exists():
            return candidate
    return None


def load_problems(names: Sequence[str], split: str, data_dir: str | Path | None,
                  limit: int | None) -> tuple[dict[str, list[Problem]], dict[str, str | None]]:
    """Problems of every task (first ``limit`` of each) and the data path used per task."""
    from esreason import tasks as registry

    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise UserError(f"limit must be an integer >= 1, got {limit!r}")
    problems: dict[str, list[Problem]] = {}
    sources: dict[str, str | None] = {}
    for name in names:
        task = registry.get(name)
        path = _resolve_data_path(data_dir, name)
        try:
            items = task.load(split, path, limit)
        except UserError as exc:
            if data_dir is not None and path is None:
                raise UserError(f"no data for task {name!r} in {data_dir} (looked for {Path(data_dir) / name}/ "
                                f"and {Path(data_dir) / (name + '.jsonl')}): {exc}") from None
            raise
        seen: set[str] = set()
        for p in items:
            if p.task != name:
                raise UserError(f"task {name!r} loaded a problem of task {p.task!r} (id {p.id!r})")
            if p.id in seen:
                raise UserError(f"task {name!r} has two problems with id {p.id!r}"
                                + (f" (data: {path})" if path else ""))
            seen.add(p.id)
        problems[name] = items
        sources[name] = str(path) if path is not None else None
    return problems, sources


def _default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def resolve_generator(model: Any, *, batch_size: int, dtype: str, device: str | None,
                      ) -> tuple[Generator, Any, dict[str, Any]]:
    """(generator, tokenizer, model description with an ``identity``) from what the caller gave.

    model: a spec ("demo", a local Hugging Face directory or a hub id), a
        ``(transformers model, tokenizer)`` pair, or a ``(Generator, tokenizer)`` pair
        (any object with ``generate(prompts, SamplingParams) -> Generation``). The
        identity of a model is the sha256 of its weights (:func:`esreason.io.hash_state_dict`);
        a bare generator is identified by its ``identity`` attribute or its class name.
    """
    import torch

    from esreason.backends.sampling import Sampler
    from esreason.io.hashing import hash_state_dict

    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise UserError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    info: dict[str, Any] = {}
    if isinstance(model, (str, Path)):
        from esreason.backends.hf import load_model, resolve_model_path

        spec = str(model)
        info["spec"] = spec
        info["path"] = resolve_model_path(spec)
        net, tokenizer = load_model(spec, dtype=dtype, device=device or _default_device())
    elif isinstance(model, tuple) and len(model) == 2:
        net, tokenizer = model
        info["spec"] = f"<in-memory {type(net).__name__}>"
    else:
        raise UserError("model must be a spec ('demo', a model directory, a hub id) or a (model, tokenizer) pair")
    if isinstance(net, torch.nn.Module):
        info["dtype"] = str(next(net.parameters()).dtype).replace("torch.", "")
        info["identity"] = "sha256:" + hash_state_dict(net.state_dict())
        # share_prefix: each problem's prompt is prefilled once for its samples (the KV rows are
        # copied); 28 % less wall per demo evaluation call with identical token ids (docs/evaluation.md)
        return Sampler(net, tokenizer, batch_size=batch_size, share_prefix=True), tokenizer, info
    if not callable(getattr(net, "generate", None)):
        raise UserError(f"{type(net).__name__} is neither a torch model nor a generator with .generate()")
    info["identity"] = str(getattr(net, "identity", None) or f"generator:{type(net).__qualname__}")
    return net, tokenizer, info


def _generating_s(generator: Any) -> list[dict[str, float]] | None:
    """Each evaluation engine's call-path counters so far (``generating_s``, ``row_s``;
    :func:`esreason.backends.eval_pool.call_counters`), or None (no engines)."""
    probe = getattr(generator, "call_counters", None)
    return list(probe()) if callable(probe) else None


def _answer_task(generator: Generator, tokenizer: Any, task: Task, scorer: Callable[[str, Any], Verdict],
                 items: Sequence[Problem], protocol: Protocol, path: Path, per_call: int,
                 progress: bool) -> tuple[ResponsesFile, Timings, int]:
    """Sample and verify every unanswered problem of one task into ``path``.

    Returns the responses file, the timings of this run and how many problems were
    already answered.
    """
    responses = ResponsesFile(path, protocol)
    responses.check_fingerprints({p.id: problem_fingerprint(p) for p in items})
    done = sum(responses.is_complete(p.id) for p in items)
    stats = Timings()
    right = total = 0  # this run's correct / sampled responses, for the progress bar
    with progress_bar(len(items), task.name, disable=None if progress else True, initial=done) as bar:
        for chunk in plan_chunks(items, per_call):
            missing = {p.id for p in chunk.problems if not responses.is_complete(p.id)}
            if not missing:
                continue
            # The whole call is regenerated (same seed and prompts => same responses); only
            # the unanswered problems are written.
            records = [r for r in run_chunk(generator, tokenizer, chunk, task, protocol, scorer,
                                            workers=default_workers(task.verifier), timings=stats)
                       if r.problem_id in missing]
            responses.append(records)
            right += sum(s.correct for r in records for s in r.samples)
            total += sum(len(r.samples) for r in records)
            bar.update(len(records))
            bar.set_postfix({"pass@1": f"{right / total:.3f}",
                             "tok/s": f"{stats.tokens / max(stats.generate_s, 1e-9):.0f}"}, refresh=False)
    return responses, stats, done


def evaluate(model: Any, tasks: Sequence[str] | str, *, output_dir: str | Path, samples: int = 32,
             temperature: float = 0.6, top_p: float = 1.0, max_new_tokens: int = 2048,
             ks: Sequence[int] | None = None, greedy: bool = False, limit: int | None = None,
             data_dir: str | Path | None = None, seed: int = 0, batch_size: int = 256, split: str = "test",
             progress: bool = True, device: str | None = None, dtype: str = "float32",
             ci_resamples: int = 1000, ci_level: float = 0.95, suite: str | None = None,
             backend: str = "hf", engines: int = 1, engines_per_gpu: int = 1, schedule: str = "auto",
             tensor_parallel_size: int = 1) -> Summary:
    """Evaluate ``model`` on ``tasks`` and write the results to ``output_dir`` (resumable).

    model: see :func:`resolve_generator`. tasks: registry names (``esreason.tasks.names()``).
    ks: Pass@k for every k, Maj@k for every k > 1 (default: K in {1, 16, 32} up to
        ``samples``); UserError when k > samples.
    greedy: one extra greedy response per problem (``greedy_acc``).
    limit: first ``limit`` problems of each task. data_dir: ``DATA/<task>/<split>.jsonl``.
    batch_size: sampler batch (rows); one generate call covers ``batch_size // samples``
        problems (at least one). Responses are bit-reproducible for the same batch size.
    ci_resamples / ci_level: bootstrap of every reported number (0 resamples: no interval).
    suite: name of the suite the tasks came from (reports only).
    backend: 'hf' (our sampler) or 'vllm' (:mod:`esreason.backends.vllm_eval`: per-request
        seeds, entropy by a teacher-forced pass); ``model`` must then be a spec.
    engines: vLLM engines (E > 1: Ray actors, one GPU each); a call then covers
        ``batch_size * engines`` rows, ``batch_size`` per engine.
    engines_per_gpu: K engines share one GPU (1/K of a GPU and of the memory reservation each;
        responses do not depend on it).
    tensor_parallel_size: GPUs per vLLM engine (tensor parallelism; docs/tensor-parallel.md).
    schedule: how engines get their rows. 'stream' (what 'auto' picks for ``backend='vllm'``): every
        unanswered problem at once, each engine its whole share, results recorded as they complete
        (:mod:`esreason.eval.streamed`); 'calls': one generate call of ``batch_size`` rows per engine
        after another, as the HF sampler always runs. Same row seeds either way.
    """
    if schedule not in ("auto", "stream", "calls"):
        raise UserError(f"schedule must be 'auto', 'stream' or 'calls', got {schedule!r}")
    names = [tasks] if isinstance(tasks, str) else list(dict.fromkeys(tasks))
    if not names:
        raise UserError("no task given (use --tasks a,b or --suite NAME)")
    protocol = Protocol(samples=samples, temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens,
                        greedy=bool(greedy), seed=seed)
    ks = check_ks(ks, samples)
    if isinstance(ci_resamples, bool) or not isinstance(ci_resamples, int) or ci_resamples < 0:
        raise UserError(f"ci_resamples must be an integer >= 0, got {ci_resamples!r}")
    if not (isinstance(ci_level, float) and 0 < ci_level < 1):
        raise UserError(f"ci_level must be a number in (0, 1), got {ci_level!r}")
    problems, sources = load_problems(names, split, data_dir, limit)
    out_dir = Path(output_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise UserError(f"output {out_dir} exists and is not a directory")
    from esreason.io.lock import directory_lock

    with directory_lock(out_dir, what="evaluation directory"):  # before the model loads: a second writer fails at once
        return _evaluate_locked(model, names, problems, sources, out_dir, protocol, ks, backend=backend,
                                engines=engines, engines_per_gpu=engines_per_gpu, batch_size=batch_size,
                                dtype=dtype, device=device, limit=limit, tensor_parallel_size=tensor_parallel_size,
                                data_dir=data_dir, split=split, progress=progress,
                                boot=(ci_resamples, ci_level), suite=suite, schedule=schedule)


def _evaluate_locked(model: Any, names: list[str], problems: dict[str, list[Problem]],
                     sources: dict[str, str | None], out_dir: Path, protocol: Protocol, ks: tuple[int, ...], *,
                     backend: str, engines: int, engines_per_gpu: int, batch_size: int, dtype: str,
                     device: str | None,
                     limit: int | None, data_dir: str | Path | None, split: str, progress: bool,
                     boot: tuple[int, float], suite: str | None, schedule: str = "auto",
                     tensor_parallel_size: int = 1) -> Summary:
    """:func:`evaluate` under the evaluation directory's lock: load the sampler, answer, summarise."""
    generator, tokenizer, model_info = _backend_generator(model, backend, engines, batch_size=batch_size,
                                                          dtype=dtype, device=device,
                                                          engines_per_gpu=engines_per_gpu,
                                                          tensor_parallel_size=tensor_parallel_size)
    try:
        rows = batch_size * (engines if backend == "vllm" else 1)
        sampler = {"backend": backend, "engines": engines}
        can_stream = bool(getattr(generator, "can_stream", False))
        if schedule == "stream" and not can_stream:
            raise UserError("schedule 'stream' needs evaluation engines (backend 'vllm'); the HF sampler runs by calls")
        return _evaluate(generator, tokenizer, model_info, names, problems, sources, out_dir, protocol, ks,
                         rows=rows, sampler=sampler, limit=limit, data_dir=data_dir, split=split,
                         progress=progress, boot=boot, suite=suite,
                         streamed=can_stream and schedule != "calls")
    finally:
        close = getattr(generator, "close", None)
        if backend == "vllm" and callable(close):
            close()


def _backend_generator(model: Any, backend: str, engines: int, *, batch_size: int, dtype: str,
                       device: str | None, engines_per_gpu: int = 1,
                       tensor_parallel_size: int = 1) -> tuple[Generator, Any, dict[str, Any]]:
    """:func:`resolve_generator` for ``backend='hf'``; the vLLM engines for ``'vllm'``."""
    if backend == "hf":
        off = [f"{k}={v}" for k, v in (("engines", engines), ("engines_per_gpu", engines_per_gpu),
                                       ("tensor_parallel_size", tensor_parallel_size)) if v != 1]
        if off:
            raise UserError(f"{', '.join(off)} needs backend 'vllm' (the HF sampler runs in this process)")
        return resolve_generator(model, batch_size=batch_size, dtype=dtype, device=device)
    if backend != "vllm":
        raise UserError(f"backend must be 'hf' or 'vllm', got {backend!r}")
    if not isinstance(model, (str, Path)):
        raise UserError("backend 'vllm' needs a model spec ('demo' or a model directory), not an in-memory model")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise UserError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    from esreason.backends.eval_pool import build_eval_generator

    return build_eval_generator(str(model), engines=engines, engines_per_gpu=engines_per_gpu, dtype=dtype,
                                device=device, batch_size=batch_size, tensor_parallel_size=tensor_parallel_size)


def _evaluate(generator: Generator, tokenizer: Any, model_info: dict[str, Any], names: list[str],
              problems: dict[str, list[Problem]], sources: dict[str, str | None], out_dir: Path,
              protocol: Protocol, ks: tuple[int, ...], *, rows: int, sampler: dict[str, Any], limit: int | None,
              data_dir: str | Path | None, split: str, progress: bool, boot: tuple[int, float],
              suite: str | None, streamed: bool = False) -> Summary:
    """The body of :func:`evaluate` once the generator runs (``rows``: rows per generate call)."""
    samples, seed = protocol.samples, protocol.seed
    current = {"protocol": protocol.as_dict(), "split": split, "model": model_info}
    stored = check_manifest(out_dir, current)
    if stored is not None and (stored.get("batch_size") != rows
                               or stored.get("sampler", {"backend": "hf", "engines": 1}) != sampler):
        log.warning("resuming %s with %s rows per call on %s (was %s on %s): new responses are not "
                    "bit-identical to an uninterrupted run", out_dir, rows, sampler, stored.get("batch_size"),
                    stored.get("sampler", {"backend": "hf", "engines": 1}))
    from esreason.io.manifest import build_manifest

    manifest = build_manifest({"tasks": names, "samples": samples, "temperature": protocol.temperature,
                               "top_p": protocol.top_p, "max_new_tokens": protocol.max_new_tokens, "ks": list(ks),
                               "greedy": protocol.greedy, "limit": limit,
                               "data_dir": str(data_dir) if data_dir else None, "seed": seed,
                               "batch_size": rows, "split": split, **sampler}, seeds={"eval_seed": seed})
    task_info = dict((stored or {}).get("tasks", {}))
    task_info.update({t: {"data": sources[t], "problems_requested": len(problems[t])} for t in names})
    manifest.update({"kind": MANIFEST_KIND, "protocol": protocol.as_dict(), "split": split, "model": model_info,
                     "batch_size": rows, "sampler": sampler, "tasks": task_info,
                     "schedule": "stream" if streamed else "calls"})
    out_dir.mkdir(parents=True, exist_ok=True)
    write_manifest(out_dir, manifest)

    scorers = TaskScorers(tokenizer=tokenizer)
    per_call = problems_per_call(samples, rows)
    tables: dict[str, list[dict[str, float | None]]] = {}
    timings: dict[str, Any] = {}
    total = Timings()
    engine_s = _generating_s(generator)
    t_answer = time.perf_counter()
    answered: dict[str, tuple[ResponsesFile, Timings, int]] = {}
    stream_record: dict[str, Any] = {"schedule": "calls"}
    if streamed:
        from esreason.eval.streamed import answer_streamed

        def bar(count: int, initial: int) -> Any:
            return progress_bar(count, ",".join(names), disable=None if progress else True, initial=initial)

        files, stats_by, done_by, stream_record = answer_streamed(
            generator, tokenizer, names, problems, scorers, protocol,
            {n: out_dir / n / RESPONSES_FILE for n in names}, per_call, bar)
        answered = {n: (files[n], stats_by[n], done_by[n]) for n in names}
    else:
        for name in names:
            task, scorer = scorers.get(name)
            answered[name] = _answer_task(generator, tokenizer, task, scorer, problems[name], protocol,
                                          out_dir / name / RESPONSES_FILE, per_call, progress)
        if engine_s is not None:  # the call path's engines: seconds inside generate over the answering wall
            wall = time.perf_counter() - t_answer
            stream_record["wall_s"] = round(wall, 4)
            stream_record["engines"] = [
                {"engine": k, "active_s": round(b["generating_s"] - a["generating_s"], 4),
                 "row_s": round(b["row_s"] - a["row_s"], 4),
                 "mean_rows_in_flight": round((b["row_s"] - a["row_s"]) / (b["generating_s"] - a["generating_s"]), 2)
                 if b["generating_s"] > a["generating_s"] else None,
                 "generating_fraction": round((b["generating_s"] - a["generating_s"]) / wall, 4) if wall else None}
                for k, (a, b) in enumerate(zip(engine_s, _generating_s(generator) or engine_s))]
    for name in names:
        task, scorer = scorers.get(name)
        items = problems[name]
        responses, stats, done = answered[name]
        t0 = time.perf_counter()
        records = [responses.record(p.id) for p in items]
        tables[name] = task_table(records, ks, equivalence(task), default_workers(task.verifier), task.votes)
        write_problem_table(out_dir / name, [p.id for p in items], tables[name])
        timings[name] = {**stats.as_dict(), "aggregate_s": round(time.perf_counter() - t0, 4),
                         "problems_resumed": done}
        total.add(stats)
    timings["total"] = {**total.as_dict(), **stream_record}

    names_m = metric_names(ks, samples, protocol.greedy)
    ci_resamples, ci_level = boot
    estimates = summarize(tables, names_m, Bootstrap(ci_resamples, ci_level, seed) if ci_resamples > 0 else None)
    summary = Summary(output_dir=out_dir, model=str(model_info.get("path") or model_info.get("spec")
                                                        or model_info["identity"]),
                      tasks=names, names=names_m, ks=ks, protocol=protocol, split=split,
                      num_problems={t: len(problems[t]) for t in names}, estimates=estimates,
                      bootstrap={"resamples": ci_resamples, "level": ci_level, "seed": seed,
                                 "method": "percentile, problems resampled within each task"},
                      timings=timings, suite=suite)
    write_summary(out_dir, summary.as_dict(), summary.to_markdown())
    return summary
