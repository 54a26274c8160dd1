"""``ESTrainer``: full-parameter ES in TRL's shape (its docstring has the parameters and an example).

It builds the same objects ``esreason train es --config`` builds and runs the same loop
(:func:`esreason.es_loop.run.run_es`): the same settings give the same checkpoints through either
face, and a run keeps every guarantee of the CLI's (exact restore, ``resume_from_checkpoint``, the
run directory's lock, the manifest, W&B when ``wandb_project`` is set).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Callable, Hashable, Sequence

from esreason.api.config import ESConfig
from esreason.api.data import register_api_task, reward_task
from esreason.errors import UserError
from esreason.es_loop.trainer import TrainResult

#: Files of a checkpoint that make a Hugging Face model directory (``save_model`` copies these).
_RUN_STATE_FILES = ("es_state.json", "COMPLETE")


class ESTrainer:
    """Evolution Strategies post-training of ``model`` on ``train_dataset`` scored by ``reward_funcs``.

    model: ``"demo"`` (the embedded default), a local model directory, a hub id, or a
        ``transformers.PreTrainedModel`` (then ``processing_class`` is its tokenizer, or it is loaded
        from the model's ``name_or_path``). None: ``args.model``.
    reward_funcs: one callable or a list with TRL's contract, ``f(prompts, completions, completion_ids,
        **columns) -> list[float | None]``; combined with ``args.reward_weights``. They also receive
        ``trainer_state`` (this trainer's ``state``: ``global_step`` = updates done, ``max_steps``), as
        under TRL. A string (TRL's reward-model id) is refused: esreason does not load reward models.
        None: train on the registered task ``args.task`` (a built-in, a task file) with its own verifier.
    train_dataset: a ``datasets.Dataset`` or a list of dicts with a ``prompt`` column (text, or chat
        messages); its other columns reach the reward functions as keyword arguments. Registered as
        task ``args.task``, split ``train``. It is the third positional argument where TRL's
        ``GRPOTrainer`` has ``args``: esreason 0.1's order is kept so existing code keeps working; pass
        ``args=`` by keyword, as TRL's examples do (an ESConfig given third is refused, naming this).
    eval_dataset: the same for periodic held-out evaluation (``args.eval_every``), split ``test``.
    args: the run's settings, an :class:`esreason.ESConfig` (None: ``ESConfig()``).
    processing_class: the tokenizer (None: the model's own).
    callbacks: ``transformers.TrainerCallback`` instances or classes, called as a Trainer calls them
        (``on_train_begin``, ``on_step_begin``, ``on_step_end``, ``on_log``, ``on_evaluate``, ``on_save``,
        ``on_epoch_begin``/``end``, ``on_train_end``; one ES update is one step) with ``args``, ``state``,
        ``control`` and ``model``; ``control.should_training_stop`` ends training after a checkpoint of
        that update, ``control.should_save`` writes one (:mod:`esreason.es_loop.events`). None: none.
    answer_fn: ``answer_fn(completion) -> hashable | None``, the answer Maj@K votes on in held-out
        evaluations (None: Maj@K is left out).

    After ``train()``: ``state`` (a ``transformers.TrainerState``: ``global_step``, ``max_steps``,
    ``epoch``, ``log_history``) and ``model`` (the trained model, the final checkpoint's weights).

    Example::

        from esreason import ESConfig, ESTrainer

        def exact(completions, total, **kwargs):  # TRL's reward contract: columns arrive as keywords
            return [float(str(t) in c) for c, t in zip(completions, total)]

        rows = [{"prompt": f"{a}+{b}", "total": a + b} for a in range(10, 40) for b in range(10, 40)]
        trainer = ESTrainer(model="demo", reward_funcs=exact, train_dataset=rows,
                            args=ESConfig(output_dir="runs/api-es", population_size=4, batch_size=4,
                                          max_steps=2, max_new_tokens=32))
        result = trainer.train()                 # runs/api-es: config.yaml, metrics.jsonl, checkpoints/
        trainer.save_model("runs/api-es/model")  # loads with AutoModelForCausalLM.from_pretrained
    """

    def __init__(self, model: Any = None, reward_funcs: Any = None, train_dataset: Any = None,
                 eval_dataset: Any = None, args: ESConfig | None = None, processing_class: Any = None, *,
                 callbacks: Sequence[Any] | None = None,
                 answer_fn: Callable[[str], Hashable | None] | None = None) -> None:
        if isinstance(train_dataset, ESConfig) or isinstance(eval_dataset, ESConfig):
            raise UserError("train_dataset: got an ESConfig; ESTrainer's positional order is (model, reward_funcs, "
                            "train_dataset, eval_dataset, args), TRL's GRPOTrainer has args third: pass args=...")
        self.args = args if args is not None else ESConfig()
        if not isinstance(self.args, ESConfig):
            raise UserError(f"args: expected an esreason.ESConfig, got {type(self.args).__name__}")
        self.model_object, spec = _model_argument(model, self.args)
        self._spec = spec or self.args.model
        self.processing_class = processing_class
        if self.model_object is not None and processing_class is None:
            from transformers import AutoTokenizer

            self.processing_class = AutoTokenizer.from_pretrained(self.model_object.name_or_path)
        self._tokenizer = self.processing_class  # what the run uses (None: the one saved with the model)
        self.run_config = self.args.to_run_config(model=spec)
        self.task = None
        if reward_funcs is not None:
            if train_dataset is None:
                raise UserError("train_dataset: reward_funcs need a dataset to train on")
            self.task = register_api_task(reward_task(
                self.args.task, reward_funcs, {"train": train_dataset, "test": eval_dataset},
                reward_weights=self.args.reward_weights, pass_threshold=self.args.pass_threshold,
                answer_fn=answer_fn))
            if self.run_config.train.split != "train":
                raise UserError(f"split: {self.args.split!r}, but a train_dataset is the 'train' split")
            if eval_dataset is None and self.run_config.eval.every and not self.run_config.eval.tasks:
                raise UserError("eval_every: periodic evaluation of the training task needs an eval_dataset "
                                "(or eval_tasks naming registered tasks)")
            _check_batch_size(self.run_config, self.task)
        elif train_dataset is not None or eval_dataset is not None:
            raise UserError("reward_funcs: a train_dataset needs reward functions to score it")
        elif self.args.reward_weights is not None or self.args.pass_threshold != 1.0:
            raise UserError(f"reward_weights / pass_threshold: they combine and judge reward_funcs; the registered task "
                            f"{self.args.task!r} scores with its own verifier (a task file: its own keys)")
        from esreason.es_loop.events import LoopEvents

        self.events = LoopEvents(self.run_config, self.args, callbacks or ())
        self.result: TrainResult | None = None
        self._loaded: Any = None
        _warn_openmp(self.run_config.device)

    @property
    def output_dir(self) -> Path:
        return Path(self.args.output_dir)

    @property
    def state(self) -> Any:
        """The run's ``transformers.TrainerState``: ``global_step`` (updates done), ``max_steps``, ``epoch``,
        ``log_history`` (the reported rows, ``logging_steps``), as TRL's ``trainer.state``."""
        return self.events.state

    @property
    def model(self) -> Any:
        """The model: after ``train()``, the trained one (the weights of the final checkpoint); before, the
        model given, or the one ``model`` names, loaded on first access (TRL loads it in ``__init__``; a
        run loads its own, so a model that is only trained is loaded once)."""
        if self.result is not None and self.result.model is not None:
            return self.result.model
        if self.model_object is not None:
            return self.model_object
        if self._loaded is None:
            from esreason.backends.hf import load_model

            self._loaded, tok = load_model(self._spec, self.run_config.dtype, self.run_config.device)
            self.processing_class = self.processing_class or tok
        return self._loaded

    def add_callback(self, callback: Any) -> None:
        """Add a ``TrainerCallback`` (an instance or a class), as ``Trainer.add_callback``."""
        from esreason.es_loop.events import check_callbacks

        self.events.handler.add_callback(check_callbacks([callback])[0])

    def remove_callback(self, callback: Any) -> None:
        """Remove a callback (an instance, or the first of a class), as ``Trainer.remove_callback``."""
        self.events.handler.remove_callback(callback)

    def pop_callback(self, callback: Any) -> Any:
        """Remove and return a callback (an instance, or the first of a class), as ``Trainer.pop_callback``."""
        return self.events.handler.pop_callback(callback)

    def train(self, resume_from_checkpoint: bool | str | Path | None = None, *,
              accept_task_change: bool = False) -> TrainResult:
        """Run ES into ``args.output_dir``; returns (updates done, final checkpoint, state, model).

        resume_from_checkpoint: None starts a new run (refused when the directory holds one that has
        trained; a run that failed before its first update is started again); True continues from the
        newest intact checkpoint; a path ``OUTPUT/checkpoints/step_N`` continues from that one.
        accept_task_change: resume although the training data or the reward functions differ from the
        run's (``--accept-task-change``; without it such a resume is refused in one line naming what changed).
        """
        from esreason.config import ConfigError
        from esreason.es_loop.run import run_es
        from esreason.experiments.memplan_engines import resolve_at_run

        from esreason.api.config import _flat_message

        resume, resume_from = _resume_argument(resume_from_checkpoint, self.output_dir)
        if self.result is not None:  # a second train() of this trainer: a fresh state and history
            from esreason.es_loop.events import LoopEvents

            self.events = LoopEvents(self.run_config, self.args, self.events.callbacks)
        try:
            self.result = run_es(self.run_config, self.output_dir, resume=resume, resume_from=resume_from,
                                 progress=True, task=self.task, model=self.model_object,
                                 tokenizer=self._tokenizer,
                                 accept_task_change=accept_task_change, events=self.events,
                                 resolve_engines=resolve_at_run)
        except ConfigError as exc:  # a config key checked by the run (train.batch_size): the flat field's name
            raise ConfigError(_flat_message(str(exc))) from None
        return self.result

    def save_model(self, output_dir: str | Path | None = None) -> Path:
        """Write the trained model (the final checkpoint's centre) as a Hugging Face model directory
        (weights + tokenizer; loads with ``AutoModelForCausalLM.from_pretrained``); before ``train``,
        the model as given. Written atomically; returns the directory.

        output_dir: the directory (None: ``OUTPUT/final_model``).
        """
        from esreason.io import atomic_directory
        from esreason.io.verify import checksum_manifest

        target = Path(output_dir) if output_dir is not None else self.output_dir / "final_model"
        source = self.result.final_checkpoint if self.result is not None else None
        with atomic_directory(target, marker_text=checksum_manifest) as tmp:  # COMPLETE: sha256s
            if source is not None:
                for item in Path(source).iterdir():
                    if item.name not in _RUN_STATE_FILES and item.is_file():
                        shutil.copy2(item, Path(tmp) / item.name)
            else:
                from esreason.backends.hf import load_model

                model, tok = (self.model_object, self.processing_class) if self.model_object is not None else \
                    load_model(self.run_config.model, self.run_config.dtype, "cpu")
                model.save_pretrained(tmp)
                tok.save_pretrained(tmp)
        return target


def _check_batch_size(cfg: Any, task: Any) -> None:
    """``batch_size`` larger than ``train_dataset``: refused now, naming the flat field (the run checks it
    too, :func:`esreason.es_loop.run.check_batch_size`)."""
    from esreason.api.config import _flat_message
    from esreason.config import ConfigError
    from esreason.es_loop.run import check_batch_size

    try:
        check_batch_size(cfg, task.name, len(task.load("train", None, cfg.train.limit)))
    except ConfigError as exc:
        raise ConfigError(_flat_message(str(exc))) from None


def _warn_openmp(device: str) -> None:
    """Once: torch was imported before esreason on a CPU run, so libgomp spins at its default
    (esreason.openmp: several times slower beside any other busy process)."""
    import esreason

    if device != "cpu" or not esreason.OPENMP_TOO_LATE or getattr(_warn_openmp, "done", False):
        return
    import torch

    if torch.get_num_threads() > 1:
        import warnings

        warnings.warn("torch was imported before esreason, so its OpenMP threads spin at libgomp's default "
                      "(300,000 iterations): CPU runs are several times slower beside any other busy process. "
                      "Import esreason first, or set GOMP_SPINCOUNT=3000 before Python starts (esreason.openmp)",
                      stacklevel=3)
        _warn_openmp.done = True  # type: ignore[attr-defined]


def _model_argument(model: Any, args: ESConfig) -> tuple[Any, str | None]:
    """(an in-memory model or None, the model spec the run config records)."""
    if model is None:
        return None, None
    if isinstance(model, (str, Path)):
        return None, str(model)
    import torch

    if isinstance(model, torch.nn.Module) and hasattr(model, "config"):
        name = getattr(model, "name_or_path", "") or type(model).__name__
        return model, f"in-memory:{name}"
    raise UserError(f"model: expected 'demo', a model directory, a hub id or a PreTrainedModel, "
                    f"got {type(model).__name__}")


def _resume_argument(value: bool | str | Path | None, output: Path) -> tuple[bool, int | None]:
    """(resume, resume_from step) for ``train(resume_from_checkpoint=...)``."""
    if value is None or value is False:
        return False, None
    if value is True:
        return True, None
    from esreason.io.verify import parse_step_name

    path = Path(value)
    if path.parent.resolve() != (output / "checkpoints").resolve():
        raise UserError(f"resume_from_checkpoint: {path} is not a checkpoint of {output} "
                        f"(expected {output / 'checkpoints'}/step_N)")
    try:
        return True, parse_step_name(path.name)
    except ValueError as exc:
        raise UserError(f"resume_from_checkpoint: {exc}") from None


__all__ = ["ESTrainer"]
