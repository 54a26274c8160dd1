"""The ``logging:`` section of every run config (ES, GRPO, the stages of compositions and experiments).

metrics.jsonl and TensorBoard are always written (the run directory contract, DESIGN §1);
``logging.wandb`` adds Weights & Biases on top of them (docs/experiments.md,
"Weights & Biases"). The section lives here rather than in :mod:`esreason.config` only to keep
that module under the 500-line limit; :class:`esreason.config.RunConfig` and
:class:`esreason.grpo.config.GRPORunConfig` both declare ``logging: LoggingConfig`` last.

Logging never changes what a run computes, so the section is not part of a run's identity:
``--resume`` (:mod:`esreason.es_loop.resume`), an experiment's method fingerprints and a
sweep's finished-run check compare configs without it (:func:`without_logging`). A run may be
resumed with W&B switched on, off or pointed elsewhere.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Mapping, Sequence

from esreason.errors import UserError

#: The top-level config key of this section.
LOGGING_KEY = "logging"


@dataclass(frozen=True)
class WandbConfig:
    """Weights & Biases (``pip install 'esreason[wandb]'``), imported only when ``project`` is set."""

    project: str | None = None
    """W&B project; None (default) = no W&B. ``--wandb PROJECT`` on ``train es|grpo|sequence`` and
    ``experiment run`` sets it."""
    entity: str | None = None
    """W&B entity (user or team); None = the logged-in default (``WANDB_ENTITY``)."""
    mode: Literal["online", "offline", "disabled"] | None = None
    """W&B mode; None = W&B's own default (``WANDB_MODE``, else online). offline writes only the
    local files (``RUN/wandb/``), for ``wandb sync`` later."""
    group: str | None = None
    """W&B group; None = the experiment's name for the stages of ``experiment run``, the sequence
    directory's name for the two stages of ``train sequence``, no group for a single run."""
    name: str | None = None
    """W&B run name; None = the run directory's last two path parts (``runs/es``, ``es_grpo/stage1_es``)."""
    table_every: int = 10
    """Log a ``completions`` table (prompt, completion, reward) every this many updates (0 = never).
    ES: ``table_rows`` prompts of the update's batch answered by the updated centre at train-time
    sampling settings (an extra generation; the trajectory is unchanged). GRPO: the last
    ``table_rows`` rollouts TRL scored (prompt, completion, reward, advantage)."""
    table_rows: int = 4
    """Rows of each completions table."""

    def __post_init__(self) -> None:
        for key, value in (("project", self.project), ("entity", self.entity), ("group", self.group),
                           ("name", self.name)):
            if value is not None and not value.strip():
                raise UserError(f"config key 'logging.wandb.{key}': must not be empty (null to leave it unset)")
        if self.table_every < 0:
            raise UserError(f"config key 'logging.wandb.table_every': must be >= 0 (got {self.table_every})")
        if self.table_rows < 1:
            raise UserError(f"config key 'logging.wandb.table_rows': must be >= 1 (got {self.table_rows})")

    @property
    def enabled(self) -> bool:
        """True when runs log to W&B (``project`` set)."""
        return self.project is not None


@dataclass(frozen=True)
class LoggingConfig:
    """Where a run's metrics go besides RUN/metrics.jsonl and RUN/tensorboard (always written)."""

    wandb: WandbConfig = field(default_factory=WandbConfig)
    """Weights & Biases (off unless ``logging.wandb.project`` is set)."""


#: The integrations ``logging.report_to`` names (TRL's values; the others TRL knows are not supported).
REPORT_TO = ("tensorboard", "wandb")
#: W&B project of ``report_to: [wandb]`` with no ``logging.wandb.project`` and no ``WANDB_PROJECT``.
DEFAULT_WANDB_PROJECT = "esreason"


@dataclass(frozen=True)
class ESLoggingConfig:
    """Where an ES run's metrics go (TRL's ``report_to`` and ``logging_steps``), besides RUN/metrics.jsonl,
    which gets every update's row whatever these say: it is the run's record (``--resume``, the budget's
    consumed rollouts and the report read it). GRPO's ``logging`` section (:class:`LoggingConfig`) has
    ``wandb`` only: TRL's own logging reports its metrics there."""

    report_to: tuple[Literal["all", "none", "tensorboard", "wandb"], ...] = ("tensorboard",)
    """Integrations the metrics go to, TRL's values: ``tensorboard`` (RUN/tensorboard), ``wandb`` (Weights &
    Biases; project ``logging.wandb.project``, else ``WANDB_PROJECT``, else 'esreason'), ``all`` (both) or
    ``none``. Setting ``logging.wandb.project`` (``--wandb``) also turns W&B on. TRL's default is 'none';
    ours keeps TensorBoard, part of every run directory (RUN/tensorboard), local and free."""
    logging_steps: int = 1
    """Report every this many updates: a row goes to ``report_to``, to ``trainer.state.log_history`` and to
    the callbacks' ``on_log`` after update s when s is a multiple, at the last update, and whenever held-out
    evaluation or coverage diagnostics ran (those are never dropped). The row is that update's own (TRL
    averages its per-step losses over the window; an ES update's metrics are already means over its N x B
    responses, and the row of one update is what a resumed run reproduces). TRL's default is 10; ours is
    1 because an ES update is seconds to minutes, not a fraction of a second."""
    wandb: WandbConfig = field(default_factory=WandbConfig)
    """Weights & Biases (off unless ``logging.wandb.project`` is set, or ``report_to`` names wandb)."""

    def __post_init__(self) -> None:
        chosen = set(self.report_to)
        if chosen & {"all", "none"} and len(chosen) > 1:
            raise UserError(f"config key 'logging.report_to': 'all' and 'none' stand alone (got {list(self.report_to)})")
        if self.logging_steps < 1:
            raise UserError(f"config key 'logging.logging_steps': must be >= 1 (got {self.logging_steps})")
        if chosen == {"none"} and self.wandb.enabled:
            raise UserError(f"config key 'logging.report_to': 'none', but logging.wandb.project is set "
                            f"({self.wandb.project!r}, or --wandb); drop one of them")

    @property
    def integrations(self) -> frozenset[str]:
        """The integrations this run reports to (``all`` and ``none`` resolved; a W&B project adds wandb)."""
        chosen = set(REPORT_TO) if "all" in self.report_to else set(self.report_to) - {"none"}
        if self.wandb.enabled:
            chosen.add("wandb")
        return frozenset(chosen)

    @property
    def tensorboard(self) -> bool:
        """RUN/tensorboard is written."""
        return "tensorboard" in self.integrations

    def effective_wandb(self) -> WandbConfig:
        """The W&B settings the run uses: ``wandb`` with a project when ``report_to`` names wandb and none is
        set (``WANDB_PROJECT``, else :data:`DEFAULT_WANDB_PROJECT`)."""
        import os

        if "wandb" in self.integrations and not self.wandb.enabled:
            return replace(self.wandb, project=os.environ.get("WANDB_PROJECT") or DEFAULT_WANDB_PROJECT)
        return self.wandb


#: Top-level keys that say where things are found or sent, not what a run computes: ``tasks_dir``
#: only locates task files (the task's name and data are compared through ``task`` and ``data_path``).
NOT_IDENTITY = (LOGGING_KEY, "tasks_dir")


def without_logging(config: Mapping[str, Any]) -> dict[str, Any]:
    """A run config's plain dict (``esreason.config.to_dict``) without the ``logging`` section and the
    other :data:`NOT_IDENTITY` keys: what a resume, a fingerprint or a finished-run check compares (they
    do not change results, and run directories written before they existed have none)."""
    return {k: v for k, v in config.items() if k not in NOT_IDENTITY}


def with_wandb(cfg: Any, *, project: str | None = None, group: str | None = None) -> Any:
    """Run config ``cfg`` (None stays None) with ``logging.wandb.project`` = ``project`` when given, and
    ``logging.wandb.group`` = ``group`` when W&B is then on and the config sets no group."""
    if cfg is None:
        return None
    w = cfg.logging.wandb
    if project is not None:
        w = replace(w, project=project)
    if group is not None and w.enabled and w.group is None:
        w = replace(w, group=group)
    return replace(cfg, logging=replace(cfg.logging, wandb=w))


def add_wandb_flag(parser: argparse.ArgumentParser) -> None:
    """``--wandb PROJECT`` on the commands that train (``train es|grpo|sequence``, ``experiment run``)."""
    parser.add_argument("--wandb", metavar="PROJECT",
                        help="also log to this Weights & Biases project (sets logging.wandb.project; "
                             "pip install 'esreason[wandb]'); TensorBoard and metrics.jsonl are written as always")


def wandb_sets(args: argparse.Namespace, prefixes: Sequence[str] = ("",)) -> list[str]:
    """The ``--set`` overrides ``--wandb PROJECT`` stands for (one per run config prefix, e.g. ``es.``)."""
    project = getattr(args, "wandb", None)
    return [f"{p}{LOGGING_KEY}.wandb.project={json.dumps(project)}" for p in prefixes] if project else []


__all__ = ["DEFAULT_WANDB_PROJECT", "ESLoggingConfig", "LOGGING_KEY", "LoggingConfig", "REPORT_TO", "WandbConfig",
           "add_wandb_flag", "wandb_sets", "with_wandb", "without_logging"]
