"""The ES training loop — orchestration only.

One update t (paper appendix "Implementation Procedure"):

1. batch   = schedule.batch(t)                          (keep-tail, reshuffled per epoch)
2. members = draw_population(seed, t, N, estimator)      (32-bit seeds, signs)
3. R       = evaluate_population(...)                    (perturb / generate / score / restore)
4. z       = shape(R)                                    (z-score, none or rank)
5. theta  += alpha/N * sum_i z_i sign_i eps_i            (policy.apply_update; with a sharded
                                                         pool: evaluator.apply_update)
6. log, checkpoint, periodic held-out evaluation

Everything random is a pure function of (train.seed, t), so a run resumed from
the checkpoint after update t continues exactly as the uninterrupted run.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from esreason.backends.base import Generator, PopulationEvaluator, SamplingParams
from esreason.backends.hf import HFPolicy
from esreason.config import RunConfig
from esreason.es import shaping
from esreason.es_loop.evaluate import SequentialEvaluator
from esreason.es.population import draw_population, sampling_seeds
from esreason.es.schedule import Schedule
from esreason.tasks.base import Problem
from esreason.verifiers.base import Verdict
from esreason.verifiers.reward_functions import TASK_REWARD, RewardFunctions

ES_STATE_FILE = "es_state.json"
_CONTROL_STREAM = 0xC0C0


@dataclass
class TrainResult:
    """steps: updates completed; final_checkpoint: path of the last checkpoint; state: the run's
    ``transformers.TrainerState`` (global_step, max_steps, log_history); model: the trained model
    (the centre the final checkpoint holds)."""

    steps: int
    final_checkpoint: Path | None
    state: Any = field(default=None, repr=False, compare=False)
    model: Any = field(default=None, repr=False, compare=False)


def reward_stats(values: np.ndarray, names: Sequence[str]) -> dict[str, float]:
    """``rewards/<name>/mean`` and ``rewards/<name>/std`` over an update's responses, as TRL's GRPO logs
    them (``values``: [responses, functions], NaN = the function returned None): the mean and the
    Bessel-corrected std of the values that are not NaN (trl.trainer.utils.nanstd; NaN when fewer than 2).
    A task with a built-in verifier has one function, named ``task_reward`` as under GRPO."""
    out: dict[str, float] = {}
    for j, name in enumerate(names):
        column = values[:, j]
        column = column[~np.isnan(column)]
        out[f"rewards/{name}/mean"] = float(column.mean()) if column.size else float("nan")
        out[f"rewards/{name}/std"] = float(column.std(ddof=1)) if column.size > 1 else float("nan")
    return out


class ESTrainer:
    """Runs ES updates on an :class:`HFPolicy` and writes the run directory.

    cfg: the run config. policy/generator: the backend. prompts/problems: the
    training split (rendered prompts aligned with problems). scorer: the task
    verifier. run_dir: esreason.io.RunDir. logger: esreason.io.MetricsLogger.
    heldout: optional callable(step) -> dict of held-out metrics.
    evaluator: the population evaluator (``backend.type``; default: the sequential
    reference on ``policy``). events: the run's TrainerState, TrainerControl and callbacks
    (:class:`esreason.es_loop.events.LoopEvents`; default: a state and no callbacks). The trainer's ``policy`` always holds the authoritative
    centre and writes the checkpoints; it applies every update itself, except with a sharded
    Ray pool (``evaluator.owns_update``), which updates it in the background
    (:meth:`wait_reference` joins that before the policy is read).
    """

    def __init__(self, cfg: RunConfig, policy: HFPolicy, generator: Generator,
                 problems: Sequence[Problem], prompts: Sequence[str],
                 scorer: Callable[[str, Any], Verdict], run_dir: Any, logger: Any,
                 heldout: Callable[[int], dict[str, float]] | None = None,
                 evaluator: PopulationEvaluator | None = None, events: Any = None) -> None:
        self.cfg = cfg
        self.policy = policy
        self.generator = generator
        self.problems = list(problems)
        self.prompts = prompts  # a RenderedPrompts renders each as a batch first draws it
        self.scorer = scorer
        self.run_dir = run_dir
        self.logger = logger
        self.heldout = heldout
        self.evaluator = evaluator if evaluator is not None else SequentialEvaluator(policy, generator)
        self.schedule = Schedule(len(self.problems), cfg.train.batch_size, cfg.train.epochs, cfg.train.seed,
                                 cfg.train.stream_start)
        if events is None:
            from esreason.es_loop.events import LoopEvents

            events = LoopEvents(cfg)
        self.events = events
        if isinstance(scorer, RewardFunctions):  # TRL passes its TrainerState to reward functions: so do we
            scorer.trainer_state = events.state

    @property
    def total_steps(self) -> int:
        return self.cfg.train.max_steps or self.schedule.total_steps

    # ------------------------------------------------------------------ one update

    def member_params(self, step: int) -> list[SamplingParams]:
        es, gen = self.cfg.es, self.cfg.generation
        seeds = sampling_seeds(self.cfg.train.seed, step, es.population_size, es.sampling_seeds)
        return [SamplingParams(max_new_tokens=gen.max_new_tokens, temperature=gen.temperature,
                               top_p=gen.top_p, seed=s) for s in seeds]

    def step(self, t: int) -> dict[str, float]:
        """Run update ``t`` (0-based) and return its metrics."""
        es = self.cfg.es
        t_start = time.perf_counter()
        idx = self.schedule.batch(t)
        prompts = [self.prompts[i] for i in idx]
        golds = [self.problems[i].gold for i in idx]
        pop = draw_population(self.cfg.train.seed, t, es.population_size, es.estimator)
        functions = isinstance(self.scorer, RewardFunctions)
        if functions:
            self.scorer.start_recording()  # each function's rewards of this population, for rewards/<name>/*
        result = self.evaluator.evaluate(pop, es.sigma, prompts, golds, self.scorer, self.member_params(t))
        per_function = reward_stats(self.scorer.take_recorded(), self.scorer.names) if functions else \
            reward_stats(result.rewards.reshape(-1, 1), [TASK_REWARD])
        self.wait_reference()  # a sharded pool updates the policy in the background; done by now
        member_r = result.member_rewards  # [N]
        shaped_input = member_r
        if es.reward_control == "shuffle":
            # Control: rewards detached from their directions (same marginal distribution).
            rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(
                [self.cfg.train.seed, _CONTROL_STREAM, t])))
            shaped_input = member_r[rng.permutation(len(member_r))]
        z = shaping.shape(shaped_input, es.shaping, es.zscore_eps)  # [N] float64
        weights = [float(zi) * sgn for zi, sgn in zip(z, pop.signs)]
        probe = None
        if self.cfg.coverage.every and (t + 1) % self.cfg.coverage.every == 0:  # docs/coverage.md
            from esreason.es_loop.coverage import CoverageProbe

            probe = CoverageProbe(self.cfg, self.policy, self.generator, self.scorer, t)
            probe.measure(pop, es.sigma, prompts, golds, weights)  # centre restored bit-exactly
        if getattr(self.evaluator, "owns_update", False):
            # backend.update=sharded: the engines update, the policy follows in the background
            t_update = time.perf_counter()
            update_norm = self.evaluator.apply_update(pop.seeds, weights, es.alpha, t)
            timings = {**self.policy.params.pop_timings(), "update": time.perf_counter() - t_update}
        else:
            update_norm = self.policy.apply_update(pop.seeds, weights, es.alpha)
            self.evaluator.after_update(pop.seeds, weights, es.alpha, t)
            timings = self.policy.params.pop_timings()
        step_time = time.perf_counter() - t_start
        epoch, _ = self.schedule.position(t)
        metrics = {
            "epoch": epoch,
            "reward/mean": float(member_r.mean()),
            "reward/max": float(member_r.max()),
            "reward/min": float(member_r.min()),
            "reward/std": float(member_r.std()),
            "accuracy/mean": float(result.correct.mean()),
            "format/mean": float(result.formatted.mean()),
            "update_norm": float(update_norm),
            "time/perturb": timings.get("perturb", 0.0),
            "time/generate": result.timings["generate"],
            "time/reward": result.timings["reward"],
            "time/restore": timings.get("restore", 0.0),
            "time/update": timings.get("update", 0.0),
            "time/step": step_time,
            "rollouts": len(pop.seeds) * len(prompts),  # sampled responses the update used: N members x prompts
            "tokens": result.tokens,
            "tokens_per_s": result.tokens / max(step_time, 1e-9),
            **per_function,
        }
        from esreason.es_loop.lengths import length_metrics

        metrics.update(length_metrics(result.lengths, self.cfg.generation.max_new_tokens))  # per member and update
        if probe is not None:
            metrics.update(probe.finish())  # samples the updated centre (read-only)
        return metrics

    def wait_reference(self) -> None:
        """Join the evaluator's background update of ``policy`` (sharded pool) before reading it."""
        wait = getattr(self.evaluator, "wait_reference", None)
        if wait is not None:
            wait()

    # ------------------------------------------------------------------ checkpoints

    def save_checkpoint(self, steps_done: int) -> Path:
        from esreason.io import atomic_directory
        from esreason.io.space import tensor_bytes
        from esreason.io.verify import checksum_manifest

        self.wait_reference()
        final = self.run_dir.checkpoint_path(steps_done)
        epoch, pos = self.schedule.position(steps_done)
        state = {
            "step": steps_done,
            "epoch": epoch,
            "batch_in_epoch": pos,
            "steps_per_epoch": self.schedule.steps_per_epoch,
            "total_steps": self.total_steps,
            "train_seed": self.cfg.train.seed,
            "rng": "all randomness is derived from (train.seed, step); see esreason.es.population",
        }
        model = getattr(self.policy, "model", None)
        size = tensor_bytes(model.state_dict().values()) if model is not None else None  # for a full disk's error
        with atomic_directory(final, marker_text=checksum_manifest, expected_bytes=size) as tmp:  # COMPLETE: sha256s
            self.policy.save(tmp)
            (Path(tmp) / ES_STATE_FILE).write_text(json.dumps(state, indent=2))
        self._prune_checkpoints()
        return final

    def _prune_checkpoints(self) -> None:
        if self.cfg.checkpoint.keep_last is not None:
            self.run_dir.prune_checkpoints(self.cfg.checkpoint.keep_last)

    # ------------------------------------------------------------------ loop

    def _log(self, step: int, metrics: dict[str, Any], report: bool) -> None:
        """The row to metrics.jsonl always; to TensorBoard / W&B, log_history and on_log when ``report``."""
        self.logger.log(step, metrics, report=report)
        if report:
            self.events.log(step, metrics)

    def train(self, start_step: int = 0, progress: bool = True) -> TrainResult:
        from esreason.es_loop.events import reported
        from esreason.io import progress_bar

        total = self.total_steps
        every = self.cfg.checkpoint.every
        logging_steps = self.cfg.logging.logging_steps
        per_epoch = self.schedule.steps_per_epoch
        events = self.events
        last_ckpt: Path | None = None
        steps_done = start_step
        events.train_begin(total, start_step, per_epoch)
        if start_step == 0 and self.heldout is not None and self.cfg.eval.every:
            row = self.heldout(0)
            self._log(0, row, True)
            events.evaluate(row)
        bar = progress_bar(total=total, desc="ES", disable=None if progress else True, initial=start_step)
        for t in range(start_step, total):
            epoch = self.schedule.position(t)[0]
            if t == start_step or self.schedule.position(t - 1)[0] != epoch:
                events.epoch_begin()
            events.step_begin()
            metrics = self.step(t)
            steps_done = t + 1
            heldout: dict[str, float] = {}
            if self.heldout is not None and self.cfg.eval.every and steps_done % self.cfg.eval.every == 0:
                self.wait_reference()
                heldout = self.heldout(steps_done)
                metrics.update(heldout)
            save = bool(every and steps_done % every == 0) or steps_done == total
            events.step_end(steps_done, steps_done / per_epoch,
                            log=reported(steps_done, total, logging_steps, metrics), save=save)
            self._log(steps_done, metrics, events.control.should_log)  # (a callback may have changed it)
            if heldout:
                events.evaluate(heldout)
            bar.update(1)
            bar.set_postfix(reward=f"{metrics['reward/mean']:.3f}", acc=f"{metrics['accuracy/mean']:.3f}")
            if events.control.should_save or events.control.should_training_stop:  # a stopped run keeps its last update
                last_ckpt = self.save_checkpoint(steps_done)
                events.save()
            if steps_done == total or self.schedule.position(steps_done)[0] != epoch \
                    or events.control.should_training_stop:
                events.epoch_end()
            if events.control.should_training_stop:
                break
        bar.close()
        self.wait_reference()
        events.train_end()
        if last_ckpt is None and start_step >= total:
            found = self.run_dir.latest_checkpoint()
            last_ckpt = found[1] if found else None
        return TrainResult(total if start_step >= total else steps_done, last_ckpt, state=events.state,
                           model=getattr(self.policy, "model", None))
