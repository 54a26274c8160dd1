"""Weights & Biases logging beside RUN/metrics.jsonl and TensorBoard (``logging.wandb``).

W&B is optional (``pip install 'esreason[wandb]'``) and imported only here, lazily, when a
config sets ``logging.wandb.project``; without it that key fails with one line naming the extra
(:func:`import_wandb`). TensorBoard and metrics.jsonl stay the run's record: W&B gets a copy.

- :func:`start_run` opens one W&B run per training run, its files in ``RUN/wandb/``
  (``wandb.init(dir=RUN)``), with the run config attached and project, entity, mode, group and
  name from :class:`esreason.config_logging.WandbConfig`. Every invocation is a new W&B run; a
  ``--resume``\\ d run logs its updates after the checkpoint into a new one (same group and name).
- :class:`WandbMetrics` wraps the :class:`esreason.io.MetricsLogger` the ES trainer writes to: each
  row also goes to W&B at ``step`` = the update index (the numbers TensorBoard gets, same rule,
  :func:`esreason.io.metrics._scalar`), and every ``table_every`` updates a ``completions`` table
  (:func:`completions_table`) from a sampler the caller provides.
- GRPO: TRL's metrics go through transformers' ``WandbCallback`` (``report_to=["wandb"]``), which
  finds the run :func:`start_run` opened (``wandb.run``) and plots against ``train/global_step``;
  our metrics.jsonl rows through :class:`WandbMetrics` at the same x-axis; the table from
  :mod:`esreason.grpo.wandb_table`.
- An experiment (:func:`log_experiment`) adds one run of its own to its stages' group.

W&B's API used (wandb 0.31, the version tested, .ci/constraints.txt): ``wandb.init(project, entity,
mode, group, name, job_type, config, dir, settings)``, ``run.log(data, step)``, ``run.summary``,
``wandb.Table(columns, data)``, ``run.finish(exit_code)``.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

from esreason.errors import UserError

#: The pip extra that installs W&B.
EXTRA = "pip install 'esreason[wandb]'"
#: W&B key of the completions tables.
TABLE_KEY = "completions"
TABLE_COLUMNS = ("step", "prompt", "completion", "reward")

#: (prompt, completion, reward) rows of one table.
Rows = Sequence[tuple[str, str, float]]


def import_wandb() -> Any:
    """The ``wandb`` module, or a one-line :class:`UserError` naming the extra when it is not installed."""
    try:
        import wandb
    except ImportError:
        raise UserError("config key 'logging.wandb.project' is set (or --wandb) but wandb is not installed: "
                        f"{EXTRA}") from None
    return wandb


def default_name(run_dir: str | Path) -> str:
    """The run directory's last two path parts: ``runs/es``, ``es_grpo/stage1_es``, ``es/seed0``."""
    parts = Path(run_dir).resolve().parts
    return "/".join(parts[-2:])


def start_run(wcfg: Any, run_dir: str | Path, config: Mapping[str, Any], *, job_type: str) -> Any:
    """Open a W&B run for the training run in ``run_dir`` (``wcfg``: a WandbConfig with ``project`` set).

    Its files go to ``run_dir/wandb/``; ``config`` (the run config's plain dict) is attached with the
    run directory under ``run_dir``. W&B's console capture is off (our progress bar and warnings stay
    as they are). Returns the ``wandb`` run object.
    """
    wandb = import_wandb()
    out = Path(run_dir)
    out.mkdir(parents=True, exist_ok=True)
    settings = wandb.Settings(console="off", silent=True)
    # The mode is read now: W&B's process-wide setup keeps the environment of its first run, so a later
    # run in the same process (the Python API, a notebook) would not see WANDB_MODE set since.
    mode = wcfg.mode or os.environ.get("WANDB_MODE") or None
    try:
        return wandb.init(project=wcfg.project, entity=wcfg.entity, mode=mode, group=wcfg.group,
                          name=wcfg.name or default_name(out), job_type=job_type, dir=str(out),
                          config={**config, "run_dir": str(out.resolve())}, settings=settings)
    except wandb.errors.Error as exc:  # not logged in, no network, unknown entity: one line, not a traceback
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UserError(f"config key 'logging.wandb': W&B could not start a run ({first}); run `wandb login`, "
                        "or set logging.wandb.mode: offline (WANDB_MODE=offline) and `wandb sync` later") from None


def completions_table(step: int, rows: Rows) -> Any:
    """A ``wandb.Table`` with columns step, prompt, completion, reward (one row per completion)."""
    wandb = import_wandb()
    return wandb.Table(columns=list(TABLE_COLUMNS),
                       data=[[int(step), str(p), str(c), float(r)] for p, c, r in rows])


def scalars(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The numeric values of a metrics row (what TensorBoard gets; strings, bools and None dropped)."""
    from esreason.io.metrics import _scalar

    out = {}
    for key, value in metrics.items():
        v = _scalar(value)
        if v is not None:
            out[key] = v
    return out


class WandbMetrics:
    """A metrics logger that writes through to ``logger`` (RUN/metrics.jsonl + TensorBoard) and to the
    W&B ``run``.

    sample: ``sample(step) -> rows`` (prompt, completion, reward) for the completions table, called
    after update ``step`` when ``table_every`` divides it (0: never; ``sample`` may be set later,
    once the trainer it reads exists). x_axis: None = W&B's step is the update (ES); else
    ``x_axis(step)`` is a dict of x-axis values logged with the row at W&B's own step (GRPO, where
    transformers' WandbCallback steps the run and plots against ``train/global_step``). Other
    attributes are the wrapped logger's.
    """

    def __init__(self, logger: Any, run: Any, table_every: int, sample: Callable[[int], Rows] | None = None,
                 x_axis: Callable[[int], dict[str, int]] | None = None) -> None:
        self.logger, self.run, self.table_every, self.sample = logger, run, table_every, sample
        self.x_axis = x_axis

    def log(self, step: int, metrics: dict[str, Any], *, report: bool = True) -> None:
        """``report=False`` (not a ``logging.logging_steps`` update): the run directory's record only."""
        if not report:
            self.logger.log(step, metrics, report=False)
            return
        self.logger.log(step, metrics)  # the run directory first: it is the record
        data: dict[str, Any] = scalars(metrics)
        if self.sample is not None and self.table_every and step > 0 and step % self.table_every == 0:
            data[TABLE_KEY] = completions_table(step, self.sample(step))
        if self.x_axis is None:
            self.run.log(data, step=int(step))
        else:
            self.run.log({**data, **self.x_axis(int(step))})

    def __getattr__(self, name: str) -> Any:
        return getattr(self.logger, name)


def log_experiment(wcfg: Any, exp_dir: str | Path, spec: Mapping[str, Any], record: Mapping[str, Any]) -> None:
    """The experiment's own W&B run (job type ``experiment``, in its stages' group, files in EXP/wandb/):
    the resolved experiment spec as its config (key ``experiment``), experiment.json's ``methods`` (eval
    directories, checkpoints, training stages) and ``timings`` as its summary."""
    run = start_run(wcfg, exp_dir, {"experiment": dict(spec)}, job_type="experiment")
    failed = True
    try:
        run.summary.update({"methods": record.get("methods", {}), "timings": record.get("timings", {})})
        failed = False
    finally:
        run.finish(exit_code=1 if failed else 0)


def require(wcfg: Any) -> None:
    """Fail early, with one line naming the extra, when ``wcfg`` (a WandbConfig) is on and wandb is missing."""
    if wcfg.enabled:
        import_wandb()


@contextlib.contextmanager
def wandb_metrics(wcfg: Any, run_dir: str | Path, config: Mapping[str, Any], logger: Any, *, job_type: str,
                  x_axis: Callable[[int], dict[str, int]] | None = None) -> Iterator[Any]:
    """The logger a trainer writes to: ``logger`` itself when W&B is off, else a :class:`WandbMetrics`
    around it on a run opened with :func:`start_run` and finished on exit (exit code 1 on an exception).
    ``None`` (no logger: a non-main GRPO process) stays None."""
    if logger is None or not wcfg.enabled:
        yield logger
        return
    run = start_run(wcfg, run_dir, config, job_type=job_type)
    failed = True
    try:
        yield WandbMetrics(logger, run, wcfg.table_every, x_axis=x_axis)
        failed = False
    finally:
        run.finish(exit_code=1 if failed else 0)


__all__ = ["EXTRA", "TABLE_COLUMNS", "TABLE_KEY", "WandbMetrics", "completions_table", "default_name",
           "import_wandb", "log_experiment", "require", "scalars", "start_run", "wandb_metrics"]
