"""TRL's habits in the ES loop: a ``transformers.TrainerState``, a ``TrainerControl`` and ``TrainerCallback`` events.

TRL's trainers are transformers ``Trainer`` s: a user's callbacks (``callbacks=[...]``) receive
``(args, state, control, **kwargs)`` at each event, ``trainer.state`` counts ``global_step`` against
``max_steps`` and keeps ``log_history``, and reward functions get the state as ``trainer_state``. The
ES loop has no optimizer and no dataloader, but the same events, so it drives the same objects:
transformers' own :class:`~transformers.TrainerState`, :class:`~transformers.TrainerControl` and
callback dispatcher (:class:`~transformers.trainer_callback.CallbackHandler`), not copies of them.

One ES update is one step. The events of an update, in transformers' order::

    on_epoch_begin (first update of an epoch) -> on_step_begin -> [population evaluated, centre updated]
    -> on_step_end -> on_log (a logging update) -> on_evaluate (held-out evaluation ran)
    -> on_save (a checkpoint was written) -> on_epoch_end (last update of an epoch)

around ``on_train_begin`` / ``on_train_end``. Before ``on_step_end`` the loop sets
``control.should_log`` (a ``logging.logging_steps`` update) and ``control.should_save`` (a
``checkpoint.every`` update, or the last); a callback may change them, and may set
``control.should_training_stop``: the loop then writes a checkpoint of that update and ends (a later
``--resume`` continues the schedule). ``should_evaluate`` and ``should_epoch_stop`` are not used: held-out
evaluation follows ``eval.every``, and an ES epoch is only the data order's period.

``state.global_step`` is the number of updates done: during update t (0-based) the reward functions
see t, as TRL's see the optimizer steps done. ``state.epoch`` is updates done / updates per epoch.
The callbacks get ``model`` (the policy's model, the centre), ``processing_class`` (the tokenizer), and
``optimizer``, ``lr_scheduler``, ``train_dataloader``, ``eval_dataloader`` as None.
"""

from __future__ import annotations

from typing import Any, Sequence

from transformers.trainer_callback import CallbackHandler, TrainerCallback, TrainerControl, TrainerState

from esreason.errors import UserError


class _Handler(CallbackHandler):
    """transformers' dispatcher without its warning about a missing ``DefaultFlowCallback``: the ES loop
    decides ``should_log`` and ``should_save`` itself (what ``DefaultFlowCallback`` does for a Trainer)."""

    def __init__(self, callbacks: Sequence[Any], model: Any, processing_class: Any) -> None:
        self.callbacks = []
        for cb in callbacks:
            self.add_callback(cb)
        self.model, self.processing_class = model, processing_class
        self.optimizer = self.lr_scheduler = self.train_dataloader = self.eval_dataloader = None


def check_callbacks(callbacks: Any) -> list[Any]:
    """``callbacks`` as a list of TrainerCallback instances or classes (UserError naming a wrong one)."""
    if callbacks is None:
        return []
    items = list(callbacks) if isinstance(callbacks, (list, tuple)) else [callbacks]
    for cb in items:
        ok = isinstance(cb, TrainerCallback) or (isinstance(cb, type) and issubclass(cb, TrainerCallback))
        if not ok:
            raise UserError(f"callbacks: expected transformers.TrainerCallback instances or classes, got "
                            f"{type(cb).__name__} ({cb!r:.60})")
    return items


def reported(step: int, total: int, logging_steps: int, metrics: dict[str, Any]) -> bool:
    """Whether update ``step``'s row is reported (``logging.logging_steps``; see ESLoggingConfig)."""
    measured = any(k.startswith(("heldout/", "coverage/")) for k in metrics)
    return step % logging_steps == 0 or step == total or measured


class LoopEvents:
    """The TrainerState, TrainerControl and callbacks of one ES training run.

    cfg: the run config (``logging.logging_steps``, ``checkpoint.every``, ``train``). args: what the
    callbacks get as ``args`` (:class:`esreason.ESConfig` through the API; the run config through the
    CLI). callbacks: TrainerCallback instances or classes.
    """

    def __init__(self, cfg: Any, args: Any = None, callbacks: Sequence[Any] = ()) -> None:
        self.cfg = cfg
        self.args = args if args is not None else cfg
        self.state = TrainerState(logging_steps=cfg.logging.logging_steps, save_steps=cfg.checkpoint.every,
                                  train_batch_size=cfg.train.batch_size, num_train_epochs=cfg.train.epochs)
        self.control = TrainerControl()
        self.handler = _Handler(check_callbacks(callbacks), None, None)

    @property
    def callbacks(self) -> list[Any]:
        return self.handler.callbacks

    def attach(self, model: Any, tokenizer: Any) -> None:
        """The model and tokenizer the callbacks receive (once the run has loaded them)."""
        self.handler.model, self.handler.processing_class = model, tokenizer

    def _call(self, event: str, **kwargs: Any) -> None:
        self.control = getattr(self.handler, event)(self.args, self.state, self.control, **kwargs)

    def train_begin(self, total: int, start_step: int, steps_per_epoch: int) -> None:
        s = self.state
        s.max_steps, s.global_step = total, start_step
        s.epoch = start_step / steps_per_epoch
        self._call("on_train_begin")

    def epoch_begin(self) -> None:
        self._call("on_epoch_begin")

    def step_begin(self) -> None:
        self._call("on_step_begin")

    def step_end(self, steps_done: int, epoch: float, *, log: bool, save: bool) -> None:
        """After update ``steps_done``: the state advanced, ``should_log`` / ``should_save`` proposed,
        ``on_step_end`` called (its callbacks may change them, or stop training)."""
        self.state.global_step, self.state.epoch = steps_done, epoch
        self.control.should_log, self.control.should_save = log, save
        self._call("on_step_end")

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        """A reported row: appended to ``state.log_history`` (with ``step``), then ``on_log``."""
        self.state.log_history.append({**metrics, "step": step})
        self._call("on_log", logs=dict(metrics))

    def evaluate(self, metrics: dict[str, Any]) -> None:
        self._call("on_evaluate", metrics=dict(metrics))

    def save(self) -> None:
        self._call("on_save")

    def epoch_end(self) -> None:
        self._call("on_epoch_end")

    def train_end(self) -> None:
        self._call("on_train_end")

    def restore_history(self, rows: Sequence[dict[str, Any]], start_step: int, total: int) -> None:
        """A resumed run's ``log_history``: the reported rows of metrics.jsonl up to ``start_step``
        (reported by :func:`reported`; rows a callback chose to log besides are not known)."""
        n = self.cfg.logging.logging_steps
        self.state.log_history = [dict(r) for r in rows
                                  if r["step"] <= start_step and (r["step"] == 0 or reported(r["step"], total, n, r))]


__all__ = ["LoopEvents", "check_callbacks", "reported"]
