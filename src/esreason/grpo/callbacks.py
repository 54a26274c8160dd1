"""TrainerCallbacks that write the esreason run directory from inside TRL's training loop.

transformers calls, after every optimizer step: ``on_step_end``, then (via
``_maybe_log_save_evaluate``) ``on_log`` when a log is due and ``on_save`` right after TRL
wrote ``RUN/trl/checkpoint-<global_step>``. With ``logging_steps`` and ``save_steps``
multiples of the optimizer steps per update (:func:`esreason.grpo.trainer.build_trl_args`),
every log and save falls on an update boundary, so:

- :class:`HeldoutCallback` evaluates the held-out set at update 0 and every ``eval.every``
  updates (``on_step_end``), with the same code path as ES (``esreason.es_loop.run.make_heldout``
  -> ``esreason.eval.evaluate_problems``): entropy, Pass@1, Pass@K of the current policy;
- :class:`MetricsCallback` writes one metrics.jsonl row per update (``on_log``): TRL's
  metrics (``entropy``, ``kl``, ``clip_ratio/*``, ``loss``, ``grad_norm``, ``reward``,
  ``completions/*``, ...), our task metrics (``reward/mean``, ``accuracy/mean``,
  ``format/mean``), ``optimizer_steps``, ``time/step`` (wall seconds of the update, held-out
  evaluation excluded), and the held-out metrics with ``time/heldout``;
- :class:`CheckpointCallback` writes ``RUN/checkpoints/step_N`` (HF format + tokenizer +
  ``grpo_state.json``) atomically (``on_save``), after TRL's own checkpoint, so a complete
  ``step_N`` implies a complete TRL state to resume from.

With several processes (:mod:`esreason.grpo.distributed`) transformers calls the callbacks on
every process: the held-out and metrics callbacks exist on the main process only, and the
checkpoint callback runs on all of them (gathering a sharded model is a collective) while
only the main process writes.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable

from transformers import TrainerCallback

from esreason.grpo.plan import BatchPlan

GRPO_STATE_FILE = "grpo_state.json"
TRL_DIR = "trl"


def trl_checkpoint_name(optimizer_steps: int) -> str:
    """TRL's checkpoint directory name under RUN/trl for ``global_step`` = ``optimizer_steps``."""
    return f"checkpoint-{optimizer_steps}"


class HeldoutCallback(TrainerCallback):
    """Periodic held-out evaluation; results wait in :meth:`pop` for the update's metrics row.

    heldout: ``heldout(update) -> {"heldout/...": float}`` (``make_heldout``); every: eval.every;
    logger: receives the update-0 row directly (there is no TRL log at update 0).
    """

    def __init__(self, heldout: Callable[[int], dict[str, float]], every: int, plan: BatchPlan,
                 model: Any, logger: Any) -> None:
        if every < 1:
            raise ValueError(f"held-out evaluation needs eval.every >= 1, got {every}")
        self.heldout, self.every, self.plan = heldout, every, plan
        self.model, self.logger = model, logger
        self._pending: dict[str, float] = {}

    def _evaluate(self, update: int) -> dict[str, float]:
        was_training = self.model.training
        self.model.eval()
        t0 = time.perf_counter()
        try:
            out = dict(self.heldout(update))
        finally:
            self.model.train(was_training)
        out["time/heldout"] = time.perf_counter() - t0
        return out

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step == 0:
            self.logger.log(0, self._evaluate(0))

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        step = state.global_step
        if self.plan.is_update_boundary(step) and self.plan.update_of(step) % self.every == 0:
            self._pending = self._evaluate(self.plan.update_of(step))

    def pop(self) -> dict[str, float]:
        out, self._pending = self._pending, {}
        return out


class MetricsCallback(TrainerCallback):
    """One metrics.jsonl row per update from TRL's logs (non-numeric and None values dropped)."""

    def __init__(self, plan: BatchPlan, logger: Any, heldout: HeldoutCallback | None = None,
                 bar: Any = None) -> None:
        self.plan, self.logger, self.heldout, self.bar = plan, logger, heldout, bar
        self._t_last = time.perf_counter()

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._t_last = time.perf_counter()

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._t_last = time.perf_counter()  # checkpoint writing is not part of the next update

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None,
               **kwargs: Any) -> None:
        if not logs or "train_runtime" in logs:  # the end-of-training summary, not an update
            return
        step = state.global_step
        if not self.plan.is_update_boundary(step):
            raise RuntimeError(f"TRL logged at optimizer step {step}, inside an update "
                               f"({self.plan.optimizer_steps_per_update} optimizer steps per update)")
        now = time.perf_counter()
        row: dict[str, Any] = {k: float(v) for k, v in logs.items()
                               if isinstance(v, (int, float)) and not isinstance(v, bool)}
        row["optimizer_steps"] = step
        if self.heldout is not None:
            row.update(self.heldout.pop())
        # Wall time of the update itself (rollouts, scoring, optimizer steps), without held-out
        # evaluation and checkpoint writing (as ES's time/step).
        row["time/step"] = now - self._t_last - row.get("time/heldout", 0.0)
        self.logger.log(self.plan.update_of(step), row)
        self._t_last = time.perf_counter()
        if self.bar is not None:
            self.bar.update(1)
            postfix = {"reward": row.get("reward/mean"), "acc": row.get("accuracy/mean"),
                       "kl": row.get("kl"), "H": row.get("entropy")}
            self.bar.set_postfix({k: f"{v:.3g}" for k, v in postfix.items() if v is not None})


class CheckpointCallback(TrainerCallback):
    """Writes RUN/checkpoints/step_N after TRL saved RUN/trl/checkpoint-<global_step>.

    save: ``save(update, grpo_state, model) -> Path`` writes the HF checkpoint with ``grpo_state.json``
    (``model``: the trainer's model as transformers passes it, possibly DDP/FSDP-wrapped). Called
    on every process; ``save`` decides who writes.
    """

    def __init__(self, plan: BatchPlan, save: Callable[[int, dict[str, Any], Any], Path], train_seed: int) -> None:
        self.plan, self.save, self.train_seed = plan, save, train_seed
        self.last: Path | None = None

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        step = state.global_step
        if not self.plan.is_update_boundary(step):
            raise RuntimeError(f"TRL saved at optimizer step {step}, inside an update")
        update = self.plan.update_of(step)
        trl_ckpt = Path(args.output_dir) / trl_checkpoint_name(step)
        # trainer_state.json is written by the main process; others may get here before it does.
        if state.is_world_process_zero and not (trl_ckpt / "trainer_state.json").is_file():
            raise RuntimeError(f"TRL checkpoint {trl_ckpt} is missing after on_save")
        grpo_state = {
            "step": update,
            "optimizer_steps": step,
            "trl_checkpoint": f"{TRL_DIR}/{trl_checkpoint_name(step)}",
            "epoch": state.epoch,
            "total_updates": self.plan.total_updates,
            "train_seed": self.train_seed,
            "plan": self.plan.as_dict(),
            # sha256 + size of every file of TRL's checkpoint, verified on resume (docs/faults.md)
            "trl_files": trl_checksums(trl_ckpt) if state.is_world_process_zero else {},
        }
        self.last = self.save(update, grpo_state, kwargs.get("model"))


def trl_checksums(trl_ckpt: Path) -> dict[str, dict[str, Any]]:
    """sha256 and size of every file TRL wrote into ``trl_ckpt`` (recorded in grpo_state.json)."""
    from esreason.io.verify import file_checksums

    return file_checksums(trl_ckpt)


def verify_trl_checkpoint(trl_ckpt: Path, grpo_state: dict[str, Any]) -> None:
    """Check TRL's checkpoint against grpo_state.json's ``trl_files``; DamagedFile names the first bad file.

    A grpo_state.json written before checksums existed has no ``trl_files``: accepted unverified.
    """
    from esreason.io.verify import verify_files

    if "trl_files" in grpo_state:
        verify_files(Path(trl_ckpt), grpo_state["trl_files"], Path(trl_ckpt))


def write_hf_checkpoint(directory: Path, model: Any, tokenizer: Any, grpo_state: dict[str, Any],
                        state_dict: dict[str, Any] | None = None, save_dtype: str | None = None) -> None:
    """Model + tokenizer in Hugging Face format, plus grpo_state.json, into ``directory``.

    state_dict: the full weights when ``model`` is sharded (gathered by
    :func:`esreason.grpo.distributed.full_state_dict`); None = ``model``'s own. transformers
    writes the same files either way (tied weights stored once). save_dtype: cast the
    floating-point weights to this dtype and declare it in config.json (None = as trained;
    :mod:`esreason.grpo.save_dtype`).
    """
    if save_dtype is not None:
        from esreason.grpo.save_dtype import cast_state_dict, stamp_config_dtype

        state_dict = cast_state_dict(state_dict if state_dict is not None else model.state_dict(), save_dtype)
        grpo_state = {**grpo_state, "save_dtype": save_dtype}
    model.save_pretrained(directory, state_dict=state_dict)
    if save_dtype is not None:
        stamp_config_dtype(directory, save_dtype)
    tokenizer.save_pretrained(directory)
    (Path(directory) / GRPO_STATE_FILE).write_text(json.dumps(grpo_state, indent=2))


__all__ = ["CheckpointCallback", "GRPO_STATE_FILE", "HeldoutCallback", "MetricsCallback", "TRL_DIR",
           "trl_checkpoint_name", "trl_checksums", "verify_trl_checkpoint", "write_hf_checkpoint"]
