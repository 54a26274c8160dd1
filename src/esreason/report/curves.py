"""Training curves over updates (paper Figure ``fig:rq1-overview`` (a-b)).

Each method's training stages are concatenated on one update axis: a row of stage s
at step n is drawn at ``offset_s + n`` (``offset`` from ``experiment.json``), so a
sequential composition is one line with its stage boundary at the second stage's
offset. Quantities:

- ``reward/mean``: mean training reward of the update (ES: over the population; GRPO:
  over the group samples). No base-model value is logged for it, so that panel has no
  reference line. Levels differ between methods by construction (ES members decode at the
  run's generation temperature, greedy in the paper's setting; GRPO samples at 1.0), so
  the reward is split by *measure*: each training stage's rows go to the panel of
  the measure its run logged them with (:func:`reward_measure`, from the stage's
  ``config.yaml``: greedy, or sampled at temperature t), one panel per measure, keyed
  ``reward/mean|<measure>``. A composition's two stages then sit in two panels, and no
  panel puts a greedy reward beside a sampled one on one axis.
  Each update's reward mostly reflects which prompts the update drew, so the figure also
  draws :func:`trailing_mean` (our choice: the last ``REWARD_WINDOW`` updates of the same
  stage; the paper smooths its reward curves with an EMA over hundreds of updates, which
  at the demo's 20 updates would be a running mean of everything so far).
- ``heldout/entropy`` and ``heldout/pass@K``: the periodic held-out evaluation during
  training (average over the run's held-out tasks). Step 0 of a run that starts from
  the base model is the base model's value, drawn as a horizontal reference line.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from esreason.report.load import Experiment, Stage

_PASS_KEY = re.compile(r"^heldout/pass@(\d+)$")
REWARD_KEY = "reward/mean"
#: Separates the reward key from its measure in a panel key (``reward/mean|greedy (temperature 0)``).
MEASURE_SEP = "|"
UNKNOWN_MEASURE = "measure unknown (no config.yaml beside the metrics)"

#: Updates in the trailing mean drawn over the per-update training reward.
REWARD_WINDOW = 5


@dataclass
class Series:
    """One method's line: x = concatenated update index, y = the logged value."""

    method: str
    label: str
    xs: list[int]
    ys: list[float]
    boundaries: list[int] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"method": self.method, "label": self.label, "x": self.xs, "y": self.ys,
                "stage_boundaries": self.boundaries}


def trailing_mean(s: Series, window: int = REWARD_WINDOW) -> list[float]:
    """Mean of the last ``window`` values at each point, never across a stage boundary.

    A composition's second stage starts its own window (ES and GRPO rewards are on
    different scales); the first points of a stage average what the stage has so far.
    """
    if window < 1:
        raise ValueError(f"window must be >= 1 (got {window})")
    out: list[float] = []
    start = 0  # index where the current stage's values begin
    for i, x in enumerate(s.xs):
        if i > 0 and any(s.xs[i - 1] <= b < x for b in s.boundaries):
            start = i  # the first row past a boundary (stage 2's step n >= 1 sits at offset + n)
        lo = max(start, i - window + 1)
        out.append(sum(s.ys[lo:i + 1]) / (i + 1 - lo))
    return out


@dataclass
class Curves:
    """Every panel of the training-curves figure: ``{quantity: [Series]}`` plus base references."""

    panels: dict[str, list[Series]]
    base: dict[str, float]
    notes: list[str]

    def as_dict(self) -> dict[str, Any]:
        return {"panels": {q: [s.as_dict() for s in ss] for q, ss in self.panels.items()},
                "base_reference": self.base, "notes": self.notes}


def reward_measure(stage: Stage) -> str:
    """How a stage's ``reward/mean`` was measured: its run's rollout temperature.

    Read from ``config.yaml`` beside the stage's metrics (``generation.temperature``; ES and
    GRPO runs both write it): temperature 0 is "greedy (temperature 0)", else "sampled
    (temperature t)". :data:`UNKNOWN_MEASURE` when the file or key is missing or unreadable.
    """
    import yaml

    if stage.metrics is None:
        return UNKNOWN_MEASURE
    path = stage.metrics.parent / "config.yaml"
    try:
        cfg = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return UNKNOWN_MEASURE
    t = cfg.get("generation", {}).get("temperature") if isinstance(cfg, dict) else None
    if isinstance(t, bool) or not isinstance(t, (int, float)):
        return UNKNOWN_MEASURE
    return "greedy (temperature 0)" if t == 0 else f"sampled (temperature {t:g})"


def series(exp: Experiment, method: str, key: str, measure: str | None = None) -> Series | None:
    """``key`` over the concatenated stages of ``method``; None when it never appears.

    ``measure``: keep only the stages whose :func:`reward_measure` is this one (the reward panels).
    """
    xs: list[int] = []
    ys: list[float] = []
    boundaries: list[int] = []
    for i, (stage, rows) in enumerate(exp.training(method)):
        if i > 0:
            boundaries.append(stage.offset)
        if measure is not None and reward_measure(stage) != measure:
            continue
        for row in rows:
            v = row.get(key)
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                xs.append(stage.offset + int(row["step"]))
                ys.append(float(v))
    if not xs:
        return None
    order = sorted(range(len(xs)), key=lambda j: xs[j])  # stable: stage order kept at equal x
    return Series(method, exp.label(method), [xs[j] for j in order], [ys[j] for j in order], boundaries)


def heldout_ks(exp: Experiment) -> list[int]:
    """Every K with a ``heldout/pass@K`` key in some training row, ascending."""
    ks: set[int] = set()
    for m in exp.methods:
        for _, rows in exp.training(m):
            for row in rows:
                for key in row:
                    match = _PASS_KEY.match(key)
                    if match:
                        ks.add(int(match.group(1)))
    return sorted(ks)


def base_reference(exp: Experiment, key: str) -> float | None:
    """The step-0 value of ``key`` in the first stage (offset 0) of a method that starts from base."""
    for m in exp.methods.values():
        if not m.training or m.training[0].offset != 0:
            continue
        stages = exp.training(m.key)
        if not stages or stages[0][0] is not m.training[0]:
            continue
        for row in stages[0][1]:
            if row.get("step") == 0 and isinstance(row.get(key), (int, float)):
                return float(row[key])
    return None


def panel_measure(key: str) -> str | None:
    """The measure of a reward panel key (``reward/mean|greedy (temperature 0)``), else None."""
    return key.split(MEASURE_SEP, 1)[1] if key.startswith(REWARD_KEY + MEASURE_SEP) else None


def training_curves(exp: Experiment) -> Curves | None:
    """Reward (one panel per measure), held-out entropy, held-out Pass@1 and Pass@K (largest K
    logged) per method."""
    trained = [m for m, spec in exp.methods.items() if spec.training]
    if not trained:
        return None
    measures: list[str] = []
    for m in trained:
        for stage, _ in exp.training(m):
            if (measure := reward_measure(stage)) not in measures:
                measures.append(measure)
    ks = heldout_ks(exp)
    keys = [REWARD_KEY + MEASURE_SEP + measure for measure in measures] or [REWARD_KEY]
    keys += ["heldout/entropy", "heldout/pass@1"]
    if ks and max(ks) > 1:
        keys.append(f"heldout/pass@{max(ks)}")
    panels: dict[str, list[Series]] = {}
    notes: list[str] = []
    for key in keys:
        measure = panel_measure(key)
        plain = REWARD_KEY if measure is not None else key
        lines = [s for m in trained if (s := series(exp, m, plain, measure)) is not None]
        if lines:
            panels[key] = lines
        elif measure is None:
            notes.append(f"no training run logged {key}; panel left out")
    if not panels:
        return None
    base = {k: v for k in keys if not k.startswith(REWARD_KEY) and (v := base_reference(exp, k)) is not None}
    return Curves(panels, base, notes)
