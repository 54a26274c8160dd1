"""``ESTrainer``: full-parameter ES in TRL's shape (its docstring has the parameters and an example).

It builds the same objects ``esreason train es --config`` builds and runs the same loop
(:func:`esreason.es_loop.run.run_es`): the same settings give the same checkpoints through either
face, and a run keeps every guarantee of the CLI's (exact restore, ``resume_from_checkpoint``, the
run directory's lock, the manifest, W&B when ``wandb_project`` is set).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Callable, Hashable

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
        **columns) -> list[float | None]``; combined with ``args.reward_weights``. None: train on the
        registered task ``args.task`` (a built-in, a task file) with its own verifier.
    train_dataset: a ``datasets.Dataset`` or a list of dicts with a ``prompt`` column (text, or chat
        messages); its other columns reach the reward functions as keyword arguments. Registered as
        task ``args.task``, split ``train``.
    eval_dataset: the same for periodic held-out evaluation (``args.eval_every``), split ``test``.
    args: the run's settings, an :class:`esreason.ESConfig` (None: ``ESConfig()``).
    processing_class: the tokenizer (None: the model's own).
    answer_fn: ``answer_fn(completion) -> hashable | None``, the answer Maj@K votes on in held-out
        evaluations (None: Maj@K is left out).

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
                 answer_fn: Callable[[str], Hashable | None] | None = None) -> None:
        self.args = args if args is not None else ESConfig()
        if not isinstance(self.args, ESConfig):
            raise UserError(f"args: expected an esreason.ESConfig, got {type(self.args).__name__}")
        self.model_object, spec = _model_argument(model, self.args)
        self.processing_class = processing_class
        if self.model_object is not None and processing_class is None:
            from transformers import AutoTokenizer

            self.processing_class = AutoTokenizer.from_pretrained(self.model_object.name_or_path)
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
        elif train_dataset is not None or eval_dataset is not None:
            raise UserError("reward_funcs: a train_dataset needs reward functions to score it")
        elif self.args.reward_weights is not None or self.args.pass_threshold != 1.0:
            raise UserError(f"reward_weights / pass_threshold: they combine and judge reward_funcs; the registered task "
                            f"{self.args.task!r} scores with its own verifier (a task file: its own keys)")
        self.result: TrainResult | None = None
        _warn_openmp(self.run_config.device)

    @property
    def output_dir(self) -> Path:
        return Path(self.args.output_dir)

    def train(self, resume_from_checkpoint: bool | str | Path | None = None) -> TrainResult:
        """Run ES into ``args.output_dir``; returns (updates done, final checkpoint).

        resume_from_checkpoint: None starts a new run (refused when the directory holds one);
        True continues from the newest intact checkpoint; a path ``OUTPUT/checkpoints/step_N``
        continues from that one.
        """
        from esreason.es_loop.run import run_es

        resume, resume_from = _resume_argument(resume_from_checkpoint, self.output_dir)
        self.result = run_es(self.run_config, self.output_dir, resume=resume, resume_from=resume_from,
                             progress=True, task=self.task, model=self.model_object,
                             tokenizer=self.processing_class)
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
