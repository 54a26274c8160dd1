"""Build an ES run from a :class:`RunConfig` and execute it (``esreason train es``).

Wires the pieces together — model and tokenizer, task data and verifier, the
sampler, the policy, the run directory — and hands them to :class:`ESTrainer`.
Resuming (``--resume``) loads the newest complete checkpoint and continues from
its update index; because every random draw is a function of (train.seed, step)
the resumed run ends bit-identical to an uninterrupted one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import yaml

from esreason.config import RunConfig, to_dict
from esreason.errors import UserError
from esreason.es_loop.resume import CONFIG_FILE, ResumeCheck, record_extension, trained_evidence
from esreason.es_loop.trainer import ES_STATE_FILE, ESTrainer, TrainResult

#: What population evaluation actually ran, written when the backend has started (RUN/backend.json).
BACKEND_FILE = "backend.json"


def _task_data_path(cfg: RunConfig, task: str) -> str | None:
    if task == cfg.task and cfg.data_path:
        return cfg.data_path
    if cfg.data_dir:
        return str(Path(cfg.data_dir) / task)
    return None


def check_batch_size(cfg: RunConfig, task: str, num_problems: int) -> None:
    """Refuse ``train.batch_size`` larger than the training split: every update would silently train on
    fewer prompts than asked (the batch is the whole split), which also changes the run's FLOPs and its
    match with GRPO (whose plan refuses the same case)."""
    from esreason.config import ConfigError

    if cfg.train.batch_size > num_problems:
        raise ConfigError(f"config key 'train.batch_size': {cfg.train.batch_size} prompts per update, but the "
                          f"training split of task {task!r} ({cfg.train.split!r}) has only {num_problems} problems; "
                          "lower it or give more data")


def make_heldout(cfg: RunConfig, generator: Any, tokenizer: Any) -> Callable[[int], dict[str, float]] | None:
    """Periodic held-out evaluation (same code path as ``esreason eval``), or None when off."""
    if not cfg.eval.every:
        return None
    from esreason import tasks
    from esreason.eval import evaluate_problems

    names = list(cfg.eval.tasks) or [cfg.task]
    problems = []
    for name in names:
        problems.extend(tasks.get(name).load(cfg.eval.split, _task_data_path(cfg, name), cfg.eval.limit))
    max_new = cfg.eval.max_new_tokens or cfg.generation.max_new_tokens

    def heldout(step: int) -> dict[str, float]:
        res = evaluate_problems(generator, tokenizer, problems, samples=cfg.eval.samples,
                                temperature=cfg.eval.temperature, max_new_tokens=max_new,
                                ks=cfg.eval.ks, seed=cfg.train.seed, greedy=cfg.eval.greedy)
        return flatten_eval(res)

    return heldout


def heldout_generator(evaluator: Any, policy: Any, generator: Any, tokenizer: Any) -> Any:
    """Held-out evaluation's sampler: the training engines when ES runs on vLLM (the Ray pool's
    engines or the in-process engine, entropies scored by the trainer's policy, which holds the
    same centre), else the trainer's own HF sampler."""
    from esreason.backends.eval_pool import pool_generator, runs_on_vllm
    from esreason.backends.scoring import EntropyScorer

    if not runs_on_vllm(evaluator):
        return generator
    return pool_generator(evaluator, tokenizer, EntropyScorer(policy.model))


def flatten_eval(res: dict[str, Any], prefix: str = "heldout") -> dict[str, float]:
    """{'task': {'pass@1': x}} -> {'heldout/task/pass@1': x} (numbers only)."""
    out: dict[str, float] = {}
    for key, val in res.items():
        name = f"{prefix}/{key}"
        if isinstance(val, dict):
            out.update(flatten_eval(val, name))
        elif isinstance(val, (int, float)) and not isinstance(val, bool):
            out[name] = float(val)
    return out


def check_resume_config(run_path: Path, cfg: Any) -> ResumeCheck:
    """Refuse ``--resume`` when ``cfg`` differs from the run's saved config other than by a longer
    schedule (ES and GRPO runs); see :mod:`esreason.es_loop.resume`."""
    from esreason.es_loop.resume import check_resume_config as check

    return check(run_path, cfg)


def load_es_state(step: int, ckpt: Path) -> dict[str, Any]:
    """A checkpoint's ``es_state.json``; DamagedFile when unreadable or for another step."""
    from esreason.io.verify import DamagedFile, read_json_object

    path = Path(ckpt) / ES_STATE_FILE
    state = read_json_object(path)
    if state.get("step") != step:
        raise DamagedFile(path, f"says step {state.get('step')!r}, the directory is step_{step}")
    return state


def reference_placement(cfg: RunConfig) -> tuple[str, str | None]:
    """(device of the trainer's HF policy, its noise device).

    With vLLM engines on GPUs (``backend.type`` vllm, or ray on cuda) every GPU's memory
    belongs to an engine: the trainer's reference centre (checkpoints, checksums,
    re-broadcasts) then lives in host memory and draws its update directions on the GPU, so
    it moves exactly as the engines do while holding only the CUDA context and three noise
    blocks of GPU memory (docs/internals.md, "The trainer's reference in host memory").
    """
    if cfg.device.startswith("cuda") and cfg.backend.type in ("vllm", "ray"):
        return "cpu", cfg.device
    return cfg.device, None


def run_es(cfg: RunConfig, output: str | Path, *, resume: bool = False, progress: bool = True,
           resume_from: int | None = None, task: Any = None, model: Any = None, tokenizer: Any = None,
           accept_task_change: bool = False, events: Any = None,
           resolve_engines: Callable[[RunConfig], RunConfig] | None = None) -> TrainResult:
    """Train with ES according to ``cfg`` into run directory ``output``.

    ``resume``: continue from the newest intact checkpoint (damaged newer ones are named in a
    warning, docs/faults.md); ``resume_from``: from ``checkpoints/step_{resume_from}`` (implies resume).
    A resume refuses other training data or another reward (:mod:`esreason.es_loop.fingerprint`) unless
    ``accept_task_change``. The run directory's lock (:mod:`esreason.io.lock`) is held from before the
    first check to the end.

    The Python API (:class:`esreason.api.ESTrainer`) passes what a config cannot name: ``task`` (a
    :class:`esreason.tasks.Task` built from the user's dataset and reward functions, used instead of
    the registry's ``cfg.task``), ``model`` / ``tokenizer`` (an in-memory model, used instead of
    loading ``cfg.model`` when the run starts from step 0) and ``events`` (its TrainerState and
    callbacks, :class:`esreason.es_loop.events.LoopEvents`). ``resolve_engines`` turns
    ``backend.engines_per_gpu: auto`` into a number for the GPU the run sees; it needs the memory plan, which
    sits above the loop, so the entry points pass it (:func:`esreason.experiments.memplan_engines.resolve_at_run`);
    without it ``auto`` is refused. The run directory keeps ``auto`` (a resume on another GPU resolves again).
    """
    from esreason.io.lock import directory_lock

    if cfg.backend.engines_per_gpu == "auto" and resolve_engines is None:  # refused before anything is written
        _engines_resolved(cfg, None)
    with directory_lock(output, what="run directory"):
        return _run_es(cfg, Path(output), resume=resume, progress=progress, resume_from=resume_from,
                       task=task, model=model, tokenizer=tokenizer, accept_task_change=accept_task_change,
                       events=events, resolve_engines=resolve_engines)


def _engines_resolved(cfg: RunConfig, resolve: Callable[[RunConfig], RunConfig] | None) -> RunConfig:
    """``cfg`` with ``backend.engines_per_gpu: auto`` resolved by ``resolve`` (see :func:`run_es`)."""
    if cfg.backend.engines_per_gpu != "auto":
        return cfg
    if resolve is None:
        raise UserError("backend.engines_per_gpu: auto is resolved against the GPU by the command or API that "
                        "starts the run (esreason train es, ESTrainer, experiment and sweep runs); a direct "
                        "run_es call passes resolve_engines=esreason.experiments.memplan_engines.resolve_at_run; "
                        "elsewhere set a number (--set backend.engines_per_gpu=1)")
    return resolve(cfg)


def _load_start(cfg: RunConfig, start_model: str, device: str, model: Any, tokenizer: Any) -> tuple[Any, Any]:
    """(model, tokenizer) the run starts from: ``model`` when given (cast to the run's dtype and
    device), else ``start_model`` (the config's model or the checkpoint resumed from) loaded."""
    from esreason.backends.hf import load_model

    if model is None or start_model != cfg.model:
        loaded, tok = load_model(start_model, cfg.dtype, device)
        return loaded, tokenizer or tok
    import torch

    if tokenizer is None:
        raise UserError("an in-memory model needs its tokenizer (processing_class)")
    return model.to(device=device, dtype=getattr(torch, cfg.dtype)).eval(), tokenizer


def _run_es(cfg: RunConfig, output: Path, *, resume: bool, progress: bool, resume_from: int | None,
            task: Any = None, model: Any = None, tokenizer: Any = None, accept_task_change: bool = False,
            events: Any = None, resolve_engines: Callable[[RunConfig], RunConfig] | None = None) -> TrainResult:
    """:func:`run_es` under the run directory's lock."""
    from esreason import tasks
    from esreason.backends.hf import HFPolicy, resolve_model_path
    from esreason.backends.sampling import Sampler
    from esreason.io import MetricsLogger, RunDir, build_manifest, clean_stale_tmp, write_manifest
    from esreason.io.atomic import atomic_write_text
    from esreason.io.verify import select_checkpoint

    from esreason.io.wandb_log import require

    wandb_cfg = cfg.logging.effective_wandb()  # logging.wandb, or report_to: [wandb]
    require(wandb_cfg)  # W&B asked for but not installed: one line, before anything is loaded
    resume = resume or resume_from is not None
    out = Path(output)
    run_dir = RunDir(out)
    held = None if resume else trained_evidence(out)
    if held is not None:
        raise UserError(f"run directory {out} already holds a run ({held}); pass --resume to continue it "
                        "or choose another --output")
    # A fresh start over the headers of a run that failed before its first update replaces them.
    fresh_over_leftovers = not resume and run_dir.metrics_path.exists()
    start_step, start_model = 0, cfg.model
    check = ResumeCheck(rewrite_config=True, rewrite_manifest=True)
    if resume:
        check = check_resume_config(out, cfg)
        if run_dir.checkpoints_dir.exists():
            clean_stale_tmp(run_dir.checkpoints_dir)
        point = select_checkpoint(run_dir.checkpoints_dir, load_es_state, resume_from)
        if point is not None:
            start_step, ckpt, _ = point
            start_model = str(ckpt)

    # Task data first: a bad dataset fails before the model is loaded.
    if cfg.tasks_dir:
        tasks.add_tasks_dir(cfg.tasks_dir)
    task = task if task is not None else tasks.get(cfg.task)
    problems = task.load(cfg.train.split, cfg.data_path, cfg.train.limit)
    check_batch_size(cfg, task.name, len(problems))
    from esreason.es_loop import fingerprint as fp

    task_print = fp.fingerprint(task, problems, task.scorer(cfg.es.format_reward))
    trained = resume and trained_evidence(out) is not None  # before the first update nothing is compared
    accepted = fp.check_task_unchanged(out, task_print, accept=accept_task_change) if trained else []
    device, noise_device = reference_placement(cfg)
    in_memory = model is not None and start_model == cfg.model
    model, tokenizer = _load_start(cfg, start_model, device, model, tokenizer)
    policy = HFPolicy(model, tokenizer, restore=cfg.es.restore, master_weights=cfg.es.master_weights,
                      # a host-resident reference never perturbs: a direction cache would only hold GPU memory
                      direction_cache_mb=cfg.es.direction_cache_mb if noise_device is None else 0,
                      perturbation=cfg.es.perturbation, rank=cfg.es.rank, noise_device=noise_device,
                      anchor_decay=cfg.es.anchor_decay)
    if start_step:
        policy.load_masters(start_model)
    prompts = tasks.RenderedPrompts(tokenizer, problems)  # rendered as the schedule draws them
    scorer = task.scorer(cfg.es.format_reward, tokenizer)
    generator = Sampler(model, tokenizer, batch_size=cfg.generation.batch_size)

    out.mkdir(parents=True, exist_ok=True)
    from esreason.es_loop.anchor import keep_run_anchor

    keep_run_anchor(out, policy, start_step)  # es.anchor_decay > 0: theta_0 is the run's start model
    if check.rewrite_config:
        atomic_write_text(out / CONFIG_FILE, yaml.safe_dump(to_dict(cfg), sort_keys=False))
    if check.rewrite_manifest:
        resolved = None if in_memory else resolve_model_path(cfg.model)
        model_dir = resolved if resolved and Path(resolved).is_dir() else None  # hub ids are not hashed
        manifest = build_manifest(to_dict(cfg), seeds={"train.seed": cfg.train.seed}, model_dir=model_dir,
                                  datasets={task.name: f"{len(problems)} problems, split {cfg.train.split}"})
        if in_memory:  # the weights the run started from, hashed as loaded
            from esreason.io.hashing import hash_state_dict

            manifest["model"]["sha256_state_dict"] = hash_state_dict(model.state_dict())
        write_manifest(out, fp.record_fingerprint(manifest, task_print, at_step=start_step, accepted=accepted))
    else:
        fp.update_manifest(out, task_print, at_step=start_step, accepted=accepted)
    from esreason.es.schedule import Schedule
    from esreason.accounting.budget import record_in_manifest

    t = cfg.train
    updates = t.max_steps or Schedule(len(problems), t.batch_size, t.epochs, t.seed, t.stream_start).total_steps
    record_in_manifest(out, cfg, model, updates=updates)  # planned rollouts, tokens, FLOPs (consumed: at the end)
    record_extension(out, cfg, check, start_step)
    # On resume, drop metrics (file and TensorBoard) logged after the checkpoint we resume from.
    truncate_after = (start_step if start_step else -1) if resume or fresh_over_leftovers else None
    from esreason.es_loop.select import build_evaluator
    pool_cfg = _engines_resolved(cfg, resolve_engines)  # backend.engines_per_gpu: auto -> K for this GPU
    # Before metrics.jsonl exists: a backend that fails to start (bad Ray address, too many
    # engines) must not leave a directory that "already holds a run".
    evaluator = build_evaluator(pool_cfg, policy, generator, tokenizer)
    try:
        from esreason.es_loop.select import describe_evaluator
        from esreason.io.atomic import atomic_write_json

        atomic_write_json(out / BACKEND_FILE, describe_evaluator(pool_cfg, evaluator))
        sampler = heldout_generator(evaluator, policy, generator, tokenizer)
        heldout = make_heldout(cfg, sampler, tokenizer)
        from esreason.io.wandb_log import wandb_metrics

        from esreason.es_loop.events import LoopEvents

        events = events if events is not None else LoopEvents(cfg)
        events.attach(model, tokenizer)
        with MetricsLogger(out, truncate_after=truncate_after, tensorboard=cfg.logging.tensorboard) as run_log, \
                wandb_metrics(wandb_cfg, out, to_dict(cfg), run_log, job_type="es") as logger:
            if start_step:  # trainer.state.log_history of a resumed run: the reported rows it kept
                from esreason.io import read_metrics

                events.restore_history(read_metrics(run_log.path), start_step, updates)
            trainer = ESTrainer(cfg, policy, generator, problems, prompts, scorer, run_dir, logger, heldout,
                                evaluator=evaluator, events=events)
            if logger is not run_log:  # W&B: its completions table (esreason.es_loop.wandb_samples)
                from esreason.es_loop.wandb_samples import es_completions

                logger.sample = es_completions(trainer, sampler, wandb_cfg.table_rows)
            result = trainer.train(start_step=start_step, progress=progress)
        record_in_manifest(out, cfg, model, updates=updates, finished=True)
        from esreason.es_loop.lengths import record_in_manifest as record_lengths

        record_lengths(out, cfg.generation.max_new_tokens)  # the run's response lengths (es_loop.lengths)
        return result
    finally:
        evaluator.close()
