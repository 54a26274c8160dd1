"""``esreason experiment sweep``: one ES config key over several values, one directory.

Reproduces the paper's RQ3 studies (§"Reward Normalization, Perturbation Scale, and
Population-Size Scaling", §"Why Two-Point ZO Intuition Does Not Directly Transfer",
appendix "Population-Size Scaling Trajectories"):

1. plan: the base config (YAML, ``--set`` overrides) with ``PARAM = value`` for every
   value is built and validated *before anything is trained*; a bad value is a
   :class:`~esreason.errors.UserError` naming the key and the value;
2. train: one ES run per value under ``OUTPUT/runs/<param>=<value>/`` via
   :func:`esreason.es_loop.run.run_es`; finished runs are skipped, partial ones resumed;
3. smooth: per-update mean reward ``reward/mean`` -> the paper's debiased exponential
   smoothing (weight 0.99) and the residual band (:mod:`esreason.experiments.smoothing`);
4. report: the checkpoint table (paper: updates 100/200/300, values within 0.01 of the
   N = 64 reference shaded, gap = reference - value) as markdown, LaTeX and JSON; the
   trajectory plot; with a held-out suite, every endpoint evaluated by
   :func:`esreason.eval.harness.evaluate` (the paper's two-point ablation reports no
   held-out advantage).

A sweep config is a normal ES config plus an optional ``sweep:`` section
(``param``, ``values``, ``reference``, ``checkpoints``, ``heldout_suite``, ``tolerance``,
``band_window``); command-line flags override it. See docs/sweeps.md.
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import yaml

from esreason.config import RunConfig, build, merge, parse_overrides, read_yaml, to_dict
from esreason.errors import UserError
from esreason.experiments.smoothing import (PAPER_BETA, PAPER_CHECKPOINTS, PAPER_TOLERANCE, CheckpointTable,
                                            checkpoint_table, debiased_ema, residual_band)
from esreason.experiments.sweep_report import (Trajectory, heldout_markdown, heldout_rows,
                                               plot_trajectories, table_latex, table_markdown)

DEFAULT_BAND_WINDOW = 21
"""Residual-band window (updates, centred); the paper does not state its window."""
DONE_FILE = "sweep_complete.json"
"""Written into a run directory once its ES run has returned; marks it finished."""
REWARD_KEY = "reward/mean"


# --------------------------------------------------------------------------- the spec


@dataclass(frozen=True)
class SweepSpec:
    """The ``sweep:`` section of a sweep config (an ES run config plus this section), after the
    command-line flags of the same names are applied (flags win). See docs/sweeps.md."""

    param: str
    """Dotted ES config key to sweep (``es.sigma``); required here or as ``--param``."""
    values: tuple[Any, ...]
    """Values of ``param`` in column order (YAML scalars); required here or as ``--values``."""
    reference: Any | None = None
    """The value the others are compared with in the checkpoint table (None: the last value, as the
    paper's N = 64)."""
    checkpoints: tuple[int, ...] = PAPER_CHECKPOINTS
    """Updates (1-based) of the checkpoint table (the paper's 100, 200, 300)."""
    heldout_suite: str | None = None
    """Evaluate every value's final checkpoint on this suite (None: no held-out evaluation)."""
    tolerance: float = PAPER_TOLERANCE
    """A value within this of the reference's smoothed reward is shaded "within" (the paper's 0.01)."""
    band_window: int = DEFAULT_BAND_WINDOW
    """Residual-band window in updates, centred (:func:`esreason.experiments.smoothing.residual_band`)."""
    seeds: tuple[int, ...] | None = None
    """Training seeds (``sweep.seeds`` / ``--seeds``): every value trained once per seed into
    ``runs/<param>=<value>/seed<s>/``; the table uses the mean reward over seeds. None: one run
    per value with the config's ``train.seed``."""


SWEEP_KEYS = tuple(f.name for f in dataclasses.fields(SweepSpec))


@dataclass(frozen=True)
class SweepPoint:
    """One value of the sweep: its label, the coerced value, its config and run directory."""

    label: str
    value: Any
    cfg: RunConfig
    run_dir: Path
    seed: int | None = None
    """The training seed of this run (sweeps with ``seeds``), else None."""

    @property
    def key(self) -> str:
        """The run's name in logs and ``sweep.json``: the value's label, plus ``/seed<s>``."""
        return self.label if self.seed is None else f"{self.label}/seed{self.seed}"


@dataclass(frozen=True)
class SweepPlan:
    """Validated sweep: nothing is trained before a plan exists."""

    spec: SweepSpec
    base: dict[str, Any]
    points: tuple[SweepPoint, ...]
    reference: str
    output: Path
    heldout_tasks: tuple[str, ...]


def parse_values(text: str) -> tuple[Any, ...]:
    """``"8,16,32"`` -> (8, 16, 32); every item parsed as a YAML scalar ("none" stays a string)."""
    items = [t.strip() for t in text.split(",")]
    if not text.strip() or any(not t for t in items):
        raise UserError(f"--values: expected a comma-separated list such as 8,16,32, got {text!r}")
    return tuple(_scalar(t) for t in items)


def _scalar(text: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def parse_checkpoints(raw: Any, where: str) -> tuple[int, ...]:
    """Updates of the checkpoint table: a list or ``"100,200,300"``; positive, increasing integers."""
    items = raw.split(",") if isinstance(raw, str) else raw
    if not isinstance(items, (list, tuple)) or not items:
        raise UserError(f"{where}: expected a list of updates such as 100,200,300, got {raw!r}")
    out = []
    for item in items:
        value = _scalar(item.strip()) if isinstance(item, str) else item
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise UserError(f"{where}: {item!r} is not an update number >= 1")
        out.append(value)
    if out != sorted(set(out)):
        raise UserError(f"{where}: updates must be distinct and increasing, got {out}")
    return tuple(out)


def make_spec(section: Mapping[str, Any] | None, *, param: str | None = None, values: str | None = None,
              reference: str | None = None, checkpoints: str | None = None, heldout_suite: str | None = None,
              tolerance: float | None = None, band_window: int | None = None, seeds: str | None = None) -> SweepSpec:
    """Merge the config's ``sweep:`` section with command-line flags (flags win)."""
    section = dict(section or {})
    unknown = sorted(set(section) - set(SWEEP_KEYS))
    if unknown:
        raise UserError(f"unknown config key 'sweep.{unknown[0]}'; known keys under sweep: {', '.join(SWEEP_KEYS)}")
    name = param if param is not None else section.get("param")
    if not isinstance(name, str) or not name.strip():
        raise UserError("no sweep parameter: pass --param KEY or set sweep.param in the config")
    if values is not None:
        vals = parse_values(values)
    else:
        raw = section.get("values")
        if isinstance(raw, str):
            vals = parse_values(raw)
        elif isinstance(raw, list) and raw:
            vals = tuple(raw)
        else:
            raise UserError("no sweep values: pass --values V1,V2 or set sweep.values to a non-empty list")
    ref = _scalar(reference) if reference is not None else section.get("reference")
    cps = parse_checkpoints(checkpoints, "--checkpoints") if checkpoints is not None else (
        parse_checkpoints(section["checkpoints"], "sweep.checkpoints") if "checkpoints" in section
        else PAPER_CHECKPOINTS)
    suite = heldout_suite if heldout_suite is not None else section.get("heldout_suite")
    if suite is not None and (not isinstance(suite, str) or not suite):
        raise UserError(f"sweep.heldout_suite: expected a suite name, got {suite!r}")
    tol = tolerance if tolerance is not None else section.get("tolerance", PAPER_TOLERANCE)
    if isinstance(tol, bool) or not isinstance(tol, (int, float)) or tol < 0:
        raise UserError(f"sweep.tolerance: expected a number >= 0, got {tol!r}")
    win = band_window if band_window is not None else section.get("band_window", DEFAULT_BAND_WINDOW)
    if isinstance(win, bool) or not isinstance(win, int) or win < 1:
        raise UserError(f"sweep.band_window: expected an integer >= 1, got {win!r}")
    from esreason.experiments.spec import parse_seeds

    seed_list = parse_seeds(parse_values(seeds) if seeds is not None else section.get("seeds"),
                            "--seeds" if seeds is not None else "sweep.seeds")
    return SweepSpec(name.strip(), vals, ref, cps, suite, float(tol), win, seed_list)


# --------------------------------------------------------------------------- planning


def format_value(value: Any) -> str:
    """Label of a coerced config value: ``8``, ``zscore``, ``0.001``, ``true``."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, tuple):
        return ",".join(format_value(v) for v in value)
    return "null" if value is None else str(value)


def _nest(dotted: str, value: Any) -> dict[str, Any]:
    node: Any = value
    for part in reversed(dotted.split(".")):
        node = {part: node}
    return node


def check_param(param: str) -> None:
    """UserError unless ``param`` names a leaf key of :class:`RunConfig` (e.g. ``es.shaping``)."""
    cls: Any = RunConfig
    parts = param.split(".")
    for i, part in enumerate(parts):
        fields = {f.name: f for f in dataclasses.fields(cls)}
        where = ".".join(parts[:i]) or "top level"
        if part not in fields:
            raise UserError(f"sweep param '{param}' is not a config key; known keys under {where}: "
                            f"{', '.join(fields)}")
        hint = typing.get_type_hints(cls)[part]
        if dataclasses.is_dataclass(hint):
            if i == len(parts) - 1:
                raise UserError(f"sweep param '{param}' is a config section; name one of its keys, e.g. "
                                f"{param}.{dataclasses.fields(hint)[0].name}")
            cls = hint
        elif i < len(parts) - 1:
            raise UserError(f"sweep param '{param}': '{'.'.join(parts[:i + 1])}' is not a section")


def lookup(cfg: Any, dotted: str) -> Any:
    """``lookup(cfg, "es.population_size")`` -> cfg.es.population_size."""
    for part in dotted.split("."):
        cfg = getattr(cfg, part)
    return cfg


def _dirname(param: str, label: str) -> str:
    return re.sub(r"[^A-Za-z0-9._=+-]", "_", f"{param}={label}")


def plan_sweep(base: Mapping[str, Any], spec: SweepSpec, output: str | Path) -> SweepPlan:
    """Build and validate every run of the sweep; raises before anything is trained.

    base: the ES config mapping (YAML without its ``sweep:`` section, ``--set`` applied).
    """
    check_param(spec.param)
    base = dict(base)
    build(RunConfig, base)  # the base config itself must be valid (errors name its key)
    points: list[SweepPoint] = []
    out = Path(output)
    for raw in spec.values:
        try:
            cfg = build(RunConfig, merge(base, _nest(spec.param, raw)))
        except UserError as exc:
            raise UserError(f"sweep value {spec.param}={format_value(raw)}: {exc}") from None
        label = format_value(lookup(cfg, spec.param))
        if any(p.label == label for p in points):
            raise UserError(f"sweep value {spec.param}={format_value(raw)} is given twice (as {label})")
        run_dir = out / "runs" / _dirname(spec.param, label)
        if spec.seeds is None:
            points.append(SweepPoint(label, lookup(cfg, spec.param), cfg, run_dir))
        for seed in spec.seeds or ():
            seeded = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, seed=seed))
            points.append(SweepPoint(label, lookup(cfg, spec.param), seeded, run_dir / f"seed{seed}", seed))
    reference = _reference_label(base, spec, points)
    tasks: tuple[str, ...] = ()
    if spec.heldout_suite is not None:
        from esreason.tasks import suite

        tasks = tuple(suite(spec.heldout_suite))
    steps = [p.cfg.train.max_steps for p in points]
    if all(s is not None for s in steps) and spec.checkpoints[-1] > max(steps):  # type: ignore[type-var]
        raise UserError(f"sweep.checkpoints: update {spec.checkpoints[-1]} is beyond train.max_steps="
                        f"{max(steps)} (every run stops earlier); choose updates <= {max(steps)}")
    return SweepPlan(spec, base, tuple(points), reference, out, tasks)


def _reference_label(base: Mapping[str, Any], spec: SweepSpec, points: Sequence[SweepPoint]) -> str:
    if spec.reference is None:
        return points[-1].label
    try:
        value = lookup(build(RunConfig, merge(dict(base), _nest(spec.param, spec.reference))), spec.param)
    except UserError as exc:
        raise UserError(f"sweep reference {spec.param}={format_value(spec.reference)}: {exc}") from None
    label = format_value(value)
    if label not in [p.label for p in points]:
        raise UserError(f"sweep reference {spec.param}={label} is not one of the values "
                        f"{', '.join(p.label for p in points)}")
    return label


def load_sweep_config(path: str | Path, overrides: Sequence[str] = ()) -> tuple[dict[str, Any], dict[str, Any]]:
    """(ES config mapping with ``--set`` applied, ``sweep:`` section) of a sweep config file;
    ``--set sweep.KEY=V`` (e.g. ``sweep.seeds=[0,1,2]``) overrides the section."""
    data = read_yaml(path)
    section = data.pop("sweep", None)
    if section is not None and not isinstance(section, dict):
        raise UserError(f"config key 'sweep': expected a mapping, got {section!r}")
    over = parse_overrides(overrides)
    section_over = over.pop("sweep", None) or {}
    if not isinstance(section_over, dict):
        raise UserError("--set sweep: name a key of the sweep section, e.g. --set sweep.seeds=[0,1,2]")
    return merge(data, over), {**(section or {}), **section_over}


# --------------------------------------------------------------------------- training


def _flat(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        out.update(_flat(v, key) if isinstance(v, Mapping) else {key: v})
    return out


def is_finished(point: SweepPoint) -> bool:
    """True when ``point``'s run returned before with this exact config (UserError if another config)."""
    marker = point.run_dir / DONE_FILE
    if not marker.is_file():
        return False
    from esreason.config_logging import without_logging

    saved = _flat(without_logging(json.loads(marker.read_text())["config"]))
    now = _flat(without_logging(to_dict(point.cfg)))
    diffs = [f"{k}: {saved.get(k)!r} -> {now.get(k)!r}" for k in sorted(set(saved) | set(now))
             if saved.get(k) != now.get(k)]
    if diffs:
        raise UserError(f"{point.run_dir} holds a finished run with another config ({'; '.join(diffs[:3])}); "
                        "choose another --output")
    return True


def train_point(point: SweepPoint, progress: bool) -> str:
    """Train (or resume) one run unless finished; returns 'skipped', 'resumed' or 'trained'."""
    from esreason.es_loop.run import run_es
    from esreason.experiments.memplan_engines import resolve_at_run
    from esreason.io import atomic_write_json

    if is_finished(point):
        return "skipped"
    from esreason.io.lock import has_content

    resume = has_content(point.run_dir)  # a lock file left by a killed run is not a run
    result = run_es(point.cfg, point.run_dir, resume=resume, progress=progress, resolve_engines=resolve_at_run)
    atomic_write_json(point.run_dir / DONE_FILE, {"steps": result.steps, "config": to_dict(point.cfg),
                                                  "final_checkpoint": str(result.final_checkpoint)})
    return "resumed" if resume else "trained"


def load_rewards(run_dir: Path) -> tuple[np.ndarray, float]:
    """(x_1..x_T from ``reward/mean``, summed ``time/step`` seconds) of a run directory."""
    from esreason.io import read_metrics

    path = run_dir / "metrics.jsonl"
    rows = [r for r in read_metrics(path) if REWARD_KEY in r]
    steps = [r["step"] for r in rows]
    if steps != list(range(1, len(rows) + 1)):
        raise UserError(f"{path}: '{REWARD_KEY}' rows are not the updates 1..{len(rows)} in order")
    return (np.array([float(r[REWARD_KEY]) for r in rows], dtype=np.float64),
            float(sum(float(r.get("time/step", 0.0)) for r in rows)))


def trajectory(raw: np.ndarray, window: int) -> Trajectory:
    """Smoothing and band of one run (paper weight 0.99)."""
    smoothed = debiased_ema(raw, PAPER_BETA)
    return Trajectory(raw, smoothed, residual_band(raw, smoothed, window))


def seed_mean_trajectories(plan: SweepPlan, raws: Mapping[str, np.ndarray]
                           ) -> tuple[dict[str, Trajectory], dict[str, list[Trajectory]]]:
    """Per value: the trajectory of the per-update mean reward over its seeds (the run itself
    without seeds), and each seed's own trajectory (empty without seeds). Seeds of one value
    must have run the same number of updates."""
    by_label: dict[str, list[SweepPoint]] = {}
    for p in plan.points:
        by_label.setdefault(p.label, []).append(p)
    trajs, per_seed = {}, {}
    for label, points in by_label.items():
        runs = [raws[p.key] for p in points]
        if len({len(r) for r in runs}) > 1:
            raise UserError(f"sweep value {plan.spec.param}={label}: its seeds ran different numbers of updates "
                            f"({', '.join(f'{p.key}: {len(raws[p.key])}' for p in points)})")
        trajs[label] = trajectory(np.mean(np.stack(runs), axis=0), plan.spec.band_window)
        per_seed[label] = [trajectory(r, plan.spec.band_window) for r in runs] if plan.spec.seeds else []
    return trajs, per_seed


def evaluate_endpoint(point: SweepPoint, suite: str, tasks: Sequence[str], progress: bool) -> Any:
    """Evaluate the run's last checkpoint on ``tasks`` into ``RUN/eval/<suite>`` (resumable).

    The protocol is the run config's ``eval:`` section (samples, temperature, ks, limit,
    greedy, split); max new tokens: ``eval.max_new_tokens`` or ``generation.max_new_tokens``.
    """
    from esreason.eval.harness import evaluate
    from esreason.io import RunDir

    latest = RunDir(point.run_dir).latest_checkpoint()
    if latest is None:
        raise UserError(f"{point.run_dir}: no checkpoint to evaluate on {suite}")
    ev, cfg = point.cfg.eval, point.cfg
    return evaluate(str(latest[1]), list(tasks), output_dir=point.run_dir / "eval" / suite, samples=ev.samples,
                    temperature=ev.temperature, top_p=cfg.generation.top_p,
                    max_new_tokens=ev.max_new_tokens or cfg.generation.max_new_tokens, ks=ev.ks,
                    greedy=ev.greedy, limit=ev.limit, data_dir=cfg.data_dir, seed=cfg.train.seed,
                    batch_size=cfg.generation.batch_size, split=ev.split, progress=progress,
                    device=cfg.device, dtype=cfg.dtype, suite=suite)


# --------------------------------------------------------------------------- the whole sweep


@dataclass(frozen=True)
class SweepResult:
    """Paths and numbers of a finished sweep (also in ``OUTPUT/sweep.json``)."""

    output: Path
    status: dict[str, str]
    table: CheckpointTable
    trajectories: dict[str, Trajectory]
    heldout: list[tuple[str, str, dict[str, dict[str, Any]]]]
    files: dict[str, Path]


def run_sweep(plan: SweepPlan, *, progress: bool = True, log: Any = print) -> SweepResult:
    """Train every value of ``plan`` (skip/resume), then write tables, plot and JSON, holding the sweep
    directory's lock (each point's run takes its own; :mod:`esreason.io.lock`)."""
    from esreason.io.lock import directory_lock

    with directory_lock(plan.output, what="sweep directory"):
        return _run_sweep(plan, progress, log)


def _run_sweep(plan: SweepPlan, progress: bool, log: Any) -> SweepResult:
    from esreason.io import atomic_write_json, atomic_write_text

    spec, out = plan.spec, plan.output
    status: dict[str, str] = {}
    seconds: dict[str, float] = {}
    for i, point in enumerate(plan.points, start=1):
        t0 = time.perf_counter()
        log(f"[{i}/{len(plan.points)}] {spec.param}={point.key} -> {point.run_dir}")
        status[point.key] = train_point(point, progress)
        seconds[point.key] = time.perf_counter() - t0
        log(f"    {status[point.key]} ({seconds[point.key]:.0f} s)")
    raws: dict[str, np.ndarray] = {}
    train_s: dict[str, float] = {}
    for point in plan.points:
        raws[point.key], train_s[point.key] = load_rewards(point.run_dir)
    trajs, seed_trajs = seed_mean_trajectories(plan, raws)
    table = checkpoint_table({k: t.smoothed for k, t in trajs.items()}, spec.checkpoints, plan.reference,
                             spec.tolerance)
    heldout: list[tuple[str, str, dict[str, dict[str, Any]]]] = []
    if spec.heldout_suite is not None:
        summaries = {}
        for point in plan.points:
            log(f"held-out {spec.heldout_suite}: {spec.param}={point.key}")
            summaries[point.key] = evaluate_endpoint(point, spec.heldout_suite, plan.heldout_tasks, progress)
        heldout = heldout_rows(summaries)

    files = {"table_md": out / "table.md", "table_tex": out / "table.tex", "plot": out / "trajectories.png",
             "json": out / "sweep.json", "report": out / "report.md"}
    md = table_markdown(table, spec.param)
    atomic_write_text(files["table_md"], md)
    atomic_write_text(files["table_tex"], table_latex(table, spec.param))
    plot_trajectories(trajs, plan.reference, spec.param, spec.checkpoints, spec.band_window, files["plot"],
                      {k: [t.smoothed for t in v] for k, v in seed_trajs.items()})
    seeds_line = "" if spec.seeds is None else (
        f"training seeds: {', '.join(map(str, spec.seeds))} (table and thick lines: the mean reward over seeds; "
        f"thin lines: each seed)\n")
    report = [f"# Sweep over {spec.param}\n", f"values: {', '.join(trajs)}; "
              f"reference: {plan.reference}\n", seeds_line, "## Checkpoint table\n", md,
              "![trajectories](trajectories.png)\n"]
    if heldout:
        files["heldout_md"] = out / "heldout.md"
        hmd = heldout_markdown(heldout, plan.reference)
        atomic_write_text(files["heldout_md"], hmd)
        report += [f"## Held-out endpoints ({spec.heldout_suite})\n", hmd]
    atomic_write_text(files["report"], "\n".join(report))
    atomic_write_json(files["json"], {
        "param": spec.param, "values": list(trajs), "reference": plan.reference,
        "seeds": None if spec.seeds is None else list(spec.seeds),
        "checkpoints": list(spec.checkpoints), "tolerance": spec.tolerance, "beta": PAPER_BETA,
        "band_window": spec.band_window, "heldout_suite": spec.heldout_suite, "base_config": plan.base,
        "runs": {p.key: {"run_dir": str(p.run_dir), "status": status[p.key], "seed": p.seed,
                         "wall_seconds_this_call": round(seconds[p.key], 2),
                         "train_seconds": round(train_s[p.key], 2), "updates": len(raws[p.key]),
                         "final_smoothed": float(trajectory(raws[p.key], spec.band_window).smoothed[-1])
                         if len(raws[p.key]) else None}
                 for p in plan.points},
        "table": table.as_dict(),
        "trajectories": {k: {"raw": t.raw.tolist(), "smoothed": t.smoothed.tolist(), "band": t.band.tolist()}
                         for k, t in trajs.items()},
        "heldout": [{"task": t, "metric": m, "values": v} for t, m, v in heldout],
    })
    return SweepResult(out, status, table, trajs, heldout, files)
