"""``esreason experiment run FILE``: train what is missing, evaluate everything, write experiment.json.

Experiment directory (the contract :mod:`esreason.report` reads)::

    EXP/experiment.yaml            the resolved spec (stage configs inlined); a rerun must match it
    EXP/experiment.json            methods, their checkpoints, eval dirs, training metrics, timings; the budget
                                   matched on and each method's planned and consumed rollouts, tokens, FLOPs
    EXP/runs/es/, runs/grpo/       ordinary ES / GRPO run directories
    EXP/runs/es_grpo/, grpo_es/    sequence directories (stage1_<m>/, stage2_<m>/, sequence.json)
    EXP/runs/<m>/done.json         written when a method's training finished (final checkpoint, hash)
    EXP/eval/<m>/                  an ``esreason eval`` directory over all tasks (summary.json, ...)
    EXP/offtask/                   with ``analysis.offtask``: the off-task set and every method's token
                                   KL from Base (esreason.analysis.offtask.run; experiment.json "offtask")
    EXP/report/                    ``esreason report EXP`` (run at the end unless --no-report)

With ``seeds: [s1, s2, ...]`` each trained method has one run and one evaluation per seed,
``EXP/runs/<m>/seed<s>/`` and ``EXP/eval/<m>/seed<s>/`` (experiment.json: ``methods.<m>.seeds``
maps each seed to its eval dir, checkpoint and training stages); Base and checkpoints are
evaluated once (``EXP/eval/base/``). Seeds run in the listed order, all methods of one seed
before the next, so an interrupted run already holds complete seeds; adding seeds to a
finished experiment trains only the new ones.

Resumable at every level: a method with ``done.json`` is not trained again, an interrupted
training run or sequence resumes from its last checkpoint, and the evaluation harness skips
every problem already answered. Every method is evaluated with the same protocol and the same
sampling seed (common random numbers across methods).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time
from pathlib import Path
from typing import Any

import yaml

from esreason.errors import UserError
from esreason.experiments.spec import TRAINED, ExperimentSpec, MethodSpec, eval_settings, load_spec

EXPERIMENT_FILE = "experiment.json"
SPEC_FILE = "experiment.yaml"
DONE_FILE = "done.json"
KIND = "esreason-experiment"
#: Spec keys every trained method depends on. A method's own run config is checked through its
#: fingerprint in done.json (and by the run's --resume check while it is unfinished); evaluation
#: changes are refused by the evaluation harness's manifest check.
TRAINING_KEYS = ("model", "task", "updates", "data_dir", "match")
#: A training key's value when the spec leaves it out (an experiment written before the key existed matches it).
TRAINING_DEFAULTS = {"match": "flops"}


def _plain(obj: Any) -> Any:
    return json.loads(json.dumps(obj, default=str))


def check_same_spec(exp: Path, spec: ExperimentSpec) -> None:
    """Refuse to continue an experiment directory whose trained methods came from another spec."""
    from esreason.io.verify import DamagedFile, read_yaml_mapping, warn

    stored_path = exp / SPEC_FILE
    if not stored_path.is_file():
        return
    try:
        stored = read_yaml_mapping(stored_path)
    except DamagedFile as exc:  # rewritten below; done.json fingerprints still guard every trained method
        warn(f"{exc}; rewriting it from this spec")
        return
    current = _plain(spec.raw)
    for key in TRAINING_KEYS:
        old, now = _plain(stored.get(key)), current.get(key)
        if key in TRAINING_DEFAULTS:
            old, now = old or TRAINING_DEFAULTS[key], now or TRAINING_DEFAULTS[key]
        if old != now:
            raise UserError(f"{exp} was created from a different experiment (key '{key}' differs from "
                            f"{stored_path}); write elsewhere (--output OTHER_DIR) or start over with "
                            f"'rm -r {exp}'")
    if (stored.get("seeds") is None) != (current.get("seeds") is None):
        raise UserError(f"{exp} was created {'without' if stored.get('seeds') is None else 'with'} the key "
                        f"'seeds' ({stored_path}); its run layout differs; write elsewhere (--output OTHER_DIR) "
                        f"or start over with 'rm -r {exp}'")


def fingerprint(method: MethodSpec, spec: ExperimentSpec) -> str:
    """SHA-256 of what training ``method`` depends on: its kind, T and its stage configs."""
    import hashlib

    from esreason.config_logging import without_logging

    inputs = {"kind": method.kind, "updates": spec.method_updates(method),  # logging (W&B) does not change it
              "configs": {k: without_logging(_config_dict(spec.stage_config(method, k))) for k in TRAINED[method.kind]}}
    return hashlib.sha256(json.dumps(_plain(inputs), sort_keys=True).encode()).hexdigest()


def _rel(path: Path, root: Path) -> str:
    try:
        return str(path.resolve().relative_to(root.resolve()))
    except ValueError:
        return str(path)


def _train(method: MethodSpec, spec: ExperimentSpec, exp: Path, progress: bool, run: Path) -> dict[str, Any]:
    """Train ``method`` into ``run`` (or find it trained there) and return its done.json record."""
    from esreason.io.atomic import atomic_write_json
    from esreason.io.hashing import hash_directory_safetensors

    method = spec.method(method.name)  # this spec's own (a seeded spec seeds the method's own config too)
    done = run / DONE_FILE
    key = fingerprint(method, spec)
    from esreason.io.verify import read_rebuildable

    record = read_rebuildable(done, "resuming the method's training run to rebuild it")
    if record is not None:
        if record.get("fingerprint") != key:
            raise UserError(f"{run} was trained from a different {method.name} config than this experiment's "
                            f"(fingerprint in {done} differs); use another output directory")
        if (exp / record["checkpoint"]).is_dir() and _intact(exp / record["checkpoint"], method.name):
            return record
    stages = TRAINED[method.kind]
    t0 = time.perf_counter()
    if len(stages) == 1:
        from esreason.experiments.sequence import train_method

        planned = spec.method_updates(method)
        steps, final = train_method(method.kind, spec.stage_config(method, method.kind), run, progress)
        if final is None or steps != planned:
            raise UserError(f"{method.name} in {run} ran {steps} updates, planned {planned}")
        training = [{"method": method.kind, "metrics": _rel(run / "metrics.jsonl", exp), "updates": steps,
                     "offset": 0}]
    else:
        from esreason.experiments.sequence import plan_sequence, run_sequence

        plan = plan_sequence({"stages": list(stages), "total_updates": spec.updates,
                              "es": _plain(_config_dict(spec.es)), "grpo": _plain(_config_dict(spec.grpo))})
        result = run_sequence(plan, run, progress=progress)
        final = result.final_checkpoint
        training, offset = [], 0
        for r in result.stages:
            training.append({"method": r.method, "metrics": _rel(r.run_dir / "metrics.jsonl", exp),
                             "updates": r.updates, "offset": offset})
            offset += r.updates
    record = {"method": method.name, "fingerprint": key, "checkpoint": _rel(Path(final), exp),
              "updates": spec.method_updates(method),
              "sha256_tensors": hash_directory_safetensors(final), "training": training,
              "train_seconds": round(time.perf_counter() - t0, 1)}
    atomic_write_json(done, record)
    return record


def _intact(checkpoint: Path, name: str) -> bool:
    """Whether a trained method's final checkpoint verifies; a damaged one is warned about (and retrained)."""
    from esreason.io.verify import DamagedFile, verify_checkpoint, warn

    try:
        verify_checkpoint(checkpoint)
    except DamagedFile as exc:
        warn(f"checkpoint damaged: {exc}; resuming {name}'s training to rebuild it")
        return False
    return True


def _config_dict(cfg: Any) -> dict[str, Any]:
    from esreason.config import to_dict

    return to_dict(cfg)


def _evaluate(model: str, spec: ExperimentSpec, out: Path, progress: bool) -> float:
    from esreason.eval.harness import evaluate

    device, dtype = eval_settings(spec)
    p = spec.eval
    t0 = time.perf_counter()
    evaluate(model, list(p.tasks), output_dir=out, samples=p.samples, temperature=p.temperature, top_p=p.top_p,
             max_new_tokens=p.max_new_tokens, ks=p.ks, greedy=p.greedy, limit=p.limit, data_dir=spec.data_dir,
             seed=p.seed, batch_size=p.batch_size, progress=progress, device=device, dtype=dtype,
             ci_resamples=p.ci_resamples, backend=p.backend, engines=p.engines,
             engines_per_gpu=p.engines_per_gpu, tensor_parallel_size=p.tensor_parallel_size)
    return time.perf_counter() - t0


def _add_budget(spec: ExperimentSpec, record: dict[str, Any], entries: dict[str, dict[str, Any]]) -> int | None:
    """``record["budget"]`` (match, shared L, P, whether FLOPs and rollouts are equal) and every trained
    method's ``planned`` budget and GRPO objective (:mod:`esreason.accounting.budget`); returns P."""
    from esreason.accounting.budget import experiment_budget
    from esreason.accounting.flops import count_parameters
    from esreason.experiments.variants import method_record, method_stages

    record["match"] = spec.match
    stages = {m.name: method_stages(spec, m, TRAINED) for m in spec.methods if m.kind in TRAINED}
    if not stages:
        return None
    params = count_parameters(spec.model)
    length = (spec.es or spec.grpo).generation.max_new_tokens  # one shared L, the ES config's as the paper's
    record["budget"], planned = experiment_budget(stages, length, params, spec.match)
    for m in spec.methods:
        if m.name in planned:
            entries[m.name]["planned"] = planned[m.name]
        if m.kind == "grpo":
            entries[m.name].update(method_record(m, spec.stage_config(m, "grpo"), spec.method_updates(m)))
    return params


def _consumed(exp: Path, training: list[dict[str, Any]], params: int | None) -> dict[str, Any]:
    """Rollouts, tokens and FLOPs at measured lengths a trained method consumed, from its stages' metrics."""
    from esreason.accounting.budget import combine, consumed

    parts = [consumed([exp / t["metrics"]], t["method"], params) for t in training]
    return parts[0] if len(parts) == 1 else combine(parts)


@dataclasses.dataclass(frozen=True)
class ExperimentResult:
    output: Path
    record: dict[str, Any]
    report: Path | None


def run_experiment(spec: ExperimentSpec, output: str | Path, *, progress: bool = True,
                   report: bool = True, log: Any = print, plan: dict[str, Any] | None = None) -> ExperimentResult:
    """Train the missing methods of ``spec``, evaluate all of them and write ``experiment.json``.

    plan: the plan the experiment is launched with (``esreason experiment plan ... --json``); written
        to ``EXP/plan.json`` so that the report sets planned beside actual time per stage.

    Holds the experiment directory's lock throughout; its runs and evaluations take their own
    (:mod:`esreason.io.lock`)."""
    from esreason.io.lock import directory_lock

    exp = Path(output)
    if exp.exists() and not exp.is_dir():
        raise UserError(f"experiment output {exp} exists and is not a directory")
    with directory_lock(exp, what="experiment directory"):
        return _run_experiment(spec, exp, progress=progress, report=report, log=log, plan=plan)


def _run_experiment(spec: ExperimentSpec, exp: Path, *, progress: bool, report: bool, log: Any,
                    plan: dict[str, Any] | None = None) -> ExperimentResult:
    from esreason.io.atomic import atomic_write_json, atomic_write_text
    from esreason.report.timing import PLAN_FILE

    check_same_spec(exp, spec)
    from esreason.config_logging import with_wandb

    from esreason.experiments.variants import map_configs

    # W&B (logging.wandb): every training stage in one group, the experiment's name unless a config names one
    spec = map_configs(spec, lambda c: with_wandb(c, group=spec.name))
    exp.mkdir(parents=True, exist_ok=True)
    atomic_write_text(exp / SPEC_FILE, yaml.safe_dump(_plain(spec.raw), sort_keys=False, allow_unicode=True))
    if plan is not None:
        atomic_write_json(exp / PLAN_FILE, plan)
    p = spec.eval
    record: dict[str, Any] = {
        "kind": KIND, "version": 1, "name": spec.name, "model": spec.model, "train_task": spec.task,
        "updates": spec.updates,
        "suites": {"in_domain": list(p.in_domain), "held_out": list(p.held_out)},
        "protocol": {"samples": p.samples, "ks": list(p.ks), "temperature": p.temperature, "top_p": p.top_p,
                     "max_new_tokens": p.max_new_tokens, "greedy": p.greedy, "limit": p.limit, "seed": p.seed},
        "pairs": [list(x) for x in spec.pairs] or [[spec.task, t] for t in p.held_out],
        "methods": {}, "timings": {},
    }
    if spec.es is not None and spec.grpo is not None:
        from esreason.accounting.flops import compare, estimate_config

        # One shared L (the ES config's response limit), as the paper matches FLOPs.
        length = spec.es.generation.max_new_tokens
        record["flops"] = compare([estimate_config(spec.es, "es", length=length),
                                   estimate_config(spec.grpo, "grpo", length=length)])
    entries = {m.name: {"kind": m.kind, "label": m.label, "training": []} for m in spec.methods}
    params = _add_budget(spec, record, entries)
    if spec.seeds is not None:
        record["seeds"] = list(spec.seeds)
    seeds: tuple[int | None, ...] = spec.seeds if spec.seeds is not None else (None,)
    steps = [(m, None) for m in spec.methods if m.kind not in TRAINED]
    steps += [(m, s) for s in seeds for m in spec.methods if m.kind in TRAINED]
    for i, (m, seed) in enumerate(steps, start=1):
        tag = "" if seed is None else f"seed{seed}"
        name = f"{m.name}/{tag}" if tag else m.name
        what = f"[{i}/{len(steps)}] {m.label}{f' (seed {seed})' if tag else ''}"
        out: dict[str, Any] = {"eval": f"eval/{name}"}
        if m.kind in TRAINED:
            run = exp / "runs" / name
            log(f"{what}: training ({spec.method_updates(m)} updates) -> {run}")
            done = _train(m, spec if seed is None else spec.with_seed(seed), exp, progress, run)
            out.update(checkpoint=done["checkpoint"], training=done["training"],
                       sha256_tensors=done["sha256_tensors"], consumed=_consumed(exp, done["training"], params))
            model = str(exp / done["checkpoint"])
            record["timings"][f"train/{name}"] = done.get("train_seconds")
        else:
            out["checkpoint"] = m.checkpoint
            model = str(m.checkpoint)
        log(f"{what}: evaluating on {', '.join(p.tasks)} -> {exp / 'eval' / name}")
        record["timings"][f"eval/{name}"] = round(_evaluate(model, spec, exp / "eval" / name, progress), 1)
        if seed is None:
            entries[m.name].update(out)
        else:
            entries[m.name].setdefault("seeds", {})[str(seed)] = out
        record["methods"] = {k: e for k, e in entries.items() if "eval" in e or "seeds" in e}  # spec order
        atomic_write_json(exp / EXPERIMENT_FILE, record)
    if spec.analysis is not None and spec.analysis.offtask is not None:  # docs/offtask.md
        from esreason.analysis.offtask.run import run_offtask

        t0 = time.perf_counter()
        record["offtask"] = run_offtask(spec, exp, record, log=log)
        record["timings"]["offtask"] = round(time.perf_counter() - t0, 1)
        atomic_write_json(exp / EXPERIMENT_FILE, record)
    wandb = [c.logging.wandb for c in (spec.es, spec.grpo) if c is not None and c.logging.wandb.enabled]
    if wandb:  # one more W&B run in the group: the experiment spec attached, experiment.json's record as summary
        from esreason.io.wandb_log import log_experiment

        log_experiment(wandb[0], exp, _plain(spec.raw), record)
    report_path = None
    if report:
        from esreason.report import build_report

        t0 = time.perf_counter()
        report_path = Path(build_report(exp).markdown)
        record["timings"]["report"] = round(time.perf_counter() - t0, 1)  # shown by the next report build
        atomic_write_json(exp / EXPERIMENT_FILE, record)
        log(f"report: {report_path}")
    return ExperimentResult(exp, record, report_path)


# --------------------------------------------------------------------------- CLI


def _memory_check(spec: ExperimentSpec, args: argparse.Namespace) -> None:
    """Refuse, before anything starts, a stage whose memory does not fit the GPU: the GPU
    torch sees, or ``--assume-gpu`` on a machine without one. ``--force`` skips the check."""
    from esreason.experiments import memplan

    if args.assume_gpu:  # the ES stages size backend.engines_per_gpu: auto against it too, without a GPU
        from esreason.experiments.memplan_engines import ASSUME_GPU_ENV

        os.environ[ASSUME_GPU_ENV] = args.assume_gpu
    if args.force:
        from esreason.experiments.launch import FORCE_ENV

        os.environ[FORCE_ENV] = "1"  # the GRPO launcher's own fit check (launch.check_grpo_fits) too
        return
    from esreason.experiments.memplan_engines import resolve_spec  # engines_per_gpu: auto, as the run resolves it

    if args.assume_gpu:
        name, gib = memplan.GPU_MEMORY_GIB[args.assume_gpu]
        memplan.check_fits(resolve_spec(spec, gib), args.assume_gpus, name, gib)
        return
    local = memplan.local_gpu()
    if local is not None:
        import torch

        memplan.check_fits(resolve_spec(spec, local[1]), torch.cuda.device_count(), local[0], local[1])


def _cmd_run(args: argparse.Namespace) -> int:
    spec = load_spec(args.file, args.set or [])
    if args.wandb:  # --wandb PROJECT: every training stage logs to it
        from esreason.config_logging import with_wandb

        from esreason.experiments.variants import map_configs

        spec = map_configs(spec, lambda c: with_wandb(c, project=args.wandb))
    output = Path(args.output) if args.output else Path("runs") / "experiments" / spec.name
    _memory_check(spec, args)
    if not args.force:  # the planned checkpoints and engine state against the free disk, before any stage
        from esreason.experiments.diskcheck import check_disk

        check_disk(spec, output)
    plan = read_plan(args.plan, spec) if args.plan else None
    print(f"experiment {spec.name}: {', '.join(m.label for m in spec.methods)} -> {output}")
    result = run_experiment(spec, output, progress=not args.no_progress, report=not args.no_report, plan=plan)
    print(f"experiment directory: {result.output}")
    return 0


def read_plan(path: str, spec: ExperimentSpec) -> dict[str, Any]:
    """A plan file of ``esreason experiment plan ... --json`` for this experiment, or a one-line error."""
    import json

    file = Path(path)
    try:
        plan = json.loads(file.read_text())
    except FileNotFoundError:
        raise UserError(f"--plan: {file} not found") from None
    except (OSError, ValueError) as exc:
        raise UserError(f"--plan: {file} is not a JSON plan ({exc})") from None
    if not isinstance(plan, dict) or not isinstance(plan.get("stages"), list):
        raise UserError(f"--plan: {file} has no 'stages' list; write it with `esreason experiment plan X --json`")
    if plan.get("experiment") != spec.name:
        raise UserError(f"--plan: {file} plans experiment {plan.get('experiment')!r}, not {spec.name!r}")
    return plan


def register(actions: Any) -> argparse.ArgumentParser:
    p = actions.add_parser("run", help="train and evaluate Base/GRPO/ES/ES->GRPO/GRPO->ES (resumable)")
    p.add_argument("file", help="experiment YAML (e.g. configs/experiments/demo.yaml)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override a key, e.g. --set updates=4 --set eval.limit=8 --set configs.es.es.sigma=1e-3")
    p.add_argument("--output", help="experiment directory (default: runs/experiments/<name>); rerun to resume")
    p.add_argument("--no-report", action="store_true", help="do not write the report at the end")
    p.add_argument("--plan", metavar="PLAN.json", help="the plan it is launched with (`esreason experiment plan X "
                   "--json [--calibrate]`): recorded in the experiment directory; the report shows planned vs actual")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--force", action="store_true",
                   help="run even where the plan says a stage does not fit the GPU or the free disk")
    from esreason.experiments.memplan import GPU_MEMORY_GIB

    p.add_argument("--assume-gpu", choices=sorted(GPU_MEMORY_GIB),
                   help="check the memory plan against this GPU type (default: the GPU torch sees; none: no check); "
                        "on a machine without a GPU, backend.engines_per_gpu: auto is sized against it too")
    p.add_argument("--assume-gpus", type=int, default=8, help="with --assume-gpu: GPUs of the node (default 8)")
    from esreason.config_logging import add_wandb_flag

    add_wandb_flag(p)
    p.set_defaults(func=_cmd_run)
    return p
