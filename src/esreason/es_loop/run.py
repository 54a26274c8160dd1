"""Build an ES run from a :class:`RunConfig` and execute it (``esreason train es``).

Wires the pieces together — model and tokenizer, task data and verifier, the
sampler, the policy, the run directory — and hands them to :class:`ESTrainer`.
Resuming (``--resume``) loads the newest complete checkpoint and continues from
its update index; because every random draw is a function of (train.seed, step)
the resumed run ends bit-identical to an uninterrupted one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import yaml

from esreason.config import RunConfig, to_dict
from esreason.errors import UserError
from esreason.es_loop.trainer import ES_STATE_FILE, ESTrainer, TrainResult

CONFIG_FILE = "config.yaml"


def _task_data_path(cfg: RunConfig, task: str) -> str | None:
    if task == cfg.task and cfg.data_path:
        return cfg.data_path
    if cfg.data_dir:
        return str(Path(cfg.data_dir) / task)
    return None


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
    from esreason.eval.scoring import EntropyScorer

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


def check_resume_config(run_path: Path, cfg: Any) -> None:
    """Refuse ``--resume`` when ``cfg`` differs from the run's saved ``config.yaml`` (ES and GRPO runs);
    the error lists the first differing dotted keys."""
    saved_path = run_path / CONFIG_FILE
    if not saved_path.is_file():
        return
    saved = yaml.safe_load(saved_path.read_text())
    now = to_dict(cfg)
    if saved != now:
        diffs = _diff(saved, now)
        raise UserError(f"--resume with a different config than {saved_path}: " + "; ".join(diffs[:5]))


def _diff(a: Any, b: Any, prefix: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b)):
            out += _diff(a.get(k), b.get(k), f"{prefix}.{k}" if prefix else k)
        return out
    return [] if a == b else [f"{prefix}: {a!r} -> {b!r}"]


def run_es(cfg: RunConfig, output: str | Path, *, resume: bool = False, progress: bool = True) -> TrainResult:
    """Train with ES according to ``cfg`` into run directory ``output``."""
    from esreason import tasks, verifiers
    from esreason.backends.hf import HFPolicy, load_model, resolve_model_path
    from esreason.backends.sampling import Sampler
    from esreason.io import MetricsLogger, RunDir, build_manifest, clean_stale_tmp, write_manifest
    from esreason.io.atomic import atomic_write_text

    out = Path(output)
    run_dir = RunDir(out)
    if not resume and run_dir.metrics_path.exists():
        raise UserError(f"run directory {out} already holds a run; pass --resume to continue it "
                        "or choose another --output")
    start_step, start_model = 0, cfg.model
    if resume:
        check_resume_config(out, cfg)
        if run_dir.checkpoints_dir.exists():
            clean_stale_tmp(run_dir.checkpoints_dir)
        latest = run_dir.latest_checkpoint()
        if latest is not None:
            start_step, ckpt = latest
            state = json.loads((Path(ckpt) / ES_STATE_FILE).read_text())
            if state["step"] != start_step:
                raise UserError(f"checkpoint {ckpt}: es_state.json says step {state['step']}")
            start_model = str(ckpt)

    # Task data first: a bad dataset fails before the model is loaded.
    task = tasks.get(cfg.task)
    problems = task.load(cfg.train.split, cfg.data_path, cfg.train.limit)
    model, tokenizer = load_model(start_model, cfg.dtype, cfg.device)
    policy = HFPolicy(model, tokenizer, restore=cfg.es.restore, master_weights=cfg.es.master_weights,
                      direction_cache_mb=cfg.es.direction_cache_mb, perturbation=cfg.es.perturbation,
                      rank=cfg.es.rank)
    if start_step:
        policy.load_masters(start_model)
    prompts = [tasks.render_prompt(tokenizer, p.messages) for p in problems]
    scorer = verifiers.get(task.verifier, format_reward=cfg.es.format_reward)
    generator = Sampler(model, tokenizer, batch_size=cfg.generation.batch_size)

    out.mkdir(parents=True, exist_ok=True)
    if not resume or not (out / CONFIG_FILE).exists():
        atomic_write_text(out / CONFIG_FILE, yaml.safe_dump(to_dict(cfg), sort_keys=False))
        resolved = resolve_model_path(cfg.model)
        model_dir = resolved if Path(resolved).is_dir() else None  # hub ids are not hashed
        manifest = build_manifest(to_dict(cfg), seeds={"train.seed": cfg.train.seed}, model_dir=model_dir,
                                  datasets={cfg.task: f"{len(problems)} problems, split {cfg.train.split}"})
        write_manifest(out, manifest)
    # On resume, drop metrics (file and TensorBoard) logged after the checkpoint we resume from.
    truncate_after = (start_step if start_step else -1) if resume else None
    from esreason.es_loop.select import build_evaluator

    # Before metrics.jsonl exists: a backend that fails to start (bad Ray address, too many
    # engines) must not leave a directory that "already holds a run".
    evaluator = build_evaluator(cfg, policy, generator, tokenizer)
    try:
        heldout = make_heldout(cfg, heldout_generator(evaluator, policy, generator, tokenizer), tokenizer)
        with MetricsLogger(out, truncate_after=truncate_after) as logger:
            trainer = ESTrainer(cfg, policy, generator, problems, prompts, scorer, run_dir, logger, heldout,
                                evaluator=evaluator)
            return trainer.train(start_step=start_step, progress=progress)
    finally:
        evaluator.close()
