"""Reading an experiment directory written by ``esreason experiment run``.

Layout (paths inside ``experiment.json`` are relative to the experiment directory)::

    EXP/experiment.json                       kind "esreason-experiment", version 1: suites,
                                              protocol, train->test pairs, methods in display order
    EXP/<method eval>/summary.json            esreason eval summary (every task, every metric, CIs)
    EXP/<method eval>/<task>/problems.jsonl   per-problem metrics (paired bootstraps)
    EXP/<training stage metrics>.jsonl        one row per update ({"step": n, ...})

What must exist is checked eagerly: a missing ``experiment.json`` or a missing
``summary.json`` named by a method is a :class:`~esreason.errors.UserError` naming the
path. What may be missing degrades: a method without an ``eval`` entry, a task absent
from a summary, a metric absent from a task, a missing ``problems.jsonl`` or training
metrics file are left out and recorded in :attr:`Experiment.notes`.

Method roles. The paper compares five methods (Tables ``tab:rq1-instruct-final`` and
``tab:rq1-deepseek-math``): Base, GRPO, ES, ES->GRPO and GRPO->ES. A method's role is its
key when the key is one of those five (``base``, ``grpo``, ``es``, ``es_grpo``,
``grpo_es``), else its ``kind`` when that is one of them, else ``None`` (an extra row
that takes part in the all-method marks but in no Base/GRPO/ES comparison). So a released
checkpoint under the key ``grpo`` plays GRPO; a GRPO variant (``variant: true``, e.g. ``dapo``) plays
none, and its claims against ES join the family when its entry says ``family: true``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from esreason.errors import UserError
from esreason.report.cells import Cell  # noqa: F401  (re-exported: the report modules import it from here)
from esreason.report.seeds import SeedRun, mean_rows, pooled_summary
from esreason.report.stats import average as _average

EXPERIMENT_FILE = "experiment.json"
EXPERIMENT_KIND = "esreason-experiment"
SUMMARY_FILE = "summary.json"
PROBLEMS_FILE = "problems.jsonl"
ROLES = ("base", "grpo", "es", "es_grpo", "grpo_es")
REFERENCE_ROLES = ("base", "grpo", "es")


@dataclass(frozen=True)
class Stage:
    """One training stage of a method (a composition has two)."""

    method: str
    metrics: Path | None
    updates: int | None
    offset: int


@dataclass
class Method:
    """A row of the comparison: its label, role, evaluation and training stages."""

    key: str
    kind: str
    label: str
    role: str | None
    checkpoint: str | None
    eval_dir: Path | None
    training: list[Stage]
    summary: dict[str, Any] | None = None
    seeds: dict[str, SeedRun] = field(default_factory=dict)
    """Training seeds of a method trained with several (``experiment.json`` ``seeds``); then
    ``summary`` pools them (:func:`esreason.report.seeds.pooled_summary`) and ``training`` is the
    first seed's."""
    variant: bool = False
    """A GRPO variant (``experiment.json`` ``variant``): trained as GRPO, playing no role."""
    family: bool = False
    """A variant whose claims against ES are members of the report's family (``family``)."""


@dataclass
class Experiment:
    """A loaded experiment: suites, protocol, methods and their evaluation summaries."""

    root: Path
    name: str
    model: str
    train_task: str | None
    in_domain: list[str]
    held_out: list[str]
    protocol: dict[str, Any]
    pairs: list[tuple[str, str]]
    methods: dict[str, Method]
    notes: list[str] = field(default_factory=list)
    _problems: dict[tuple[str, str], dict[str, dict[str, Any]] | None] = field(default_factory=dict, repr=False)
    _seed_problems: dict[tuple[str, str], list[dict[str, dict[str, Any]]] | None] = field(
        default_factory=dict, repr=False)
    _training: dict[str, list[tuple[Stage, list[dict[str, Any]]]]] = field(default_factory=dict, repr=False)

    # ------------------------------------------------------------------ tasks and methods

    @property
    def tasks(self) -> list[str]:
        """In-domain tasks first, then held-out tasks (the paper's column order)."""
        return list(dict.fromkeys(self.in_domain + self.held_out))

    @property
    def ks(self) -> list[int]:
        """Protocol Ks (the table columns), ascending."""
        return sorted(int(k) for k in self.protocol.get("ks", []))

    def method_keys(self) -> list[str]:
        """Methods in display order (insertion order of ``experiment.json``)."""
        return list(self.methods)

    def by_role(self, role: str) -> str | None:
        """The key of the first method playing ``role`` (``base``, ``grpo``, ...), or None."""
        for key, m in self.methods.items():
            if m.role == role:
                return key
        return None

    def label(self, method: str) -> str:
        return self.methods[method].label

    def eval_ks(self, method: str | None = None) -> list[int]:
        """Every K the evaluation computed Pass@K for (summary ``ks``), ascending.

        None: the Ks common to all evaluated methods.
        """
        keys = [method] if method is not None else [k for k, m in self.methods.items() if m.summary]
        common: set[int] | None = None
        for key in keys:
            summary = self.methods[key].summary or {}
            ks = {int(k) for k in summary.get("ks", [])}
            common = ks if common is None else common & ks
        return sorted(common or [])

    # ------------------------------------------------------------------ numbers

    def cell(self, method: str, task: str, metric: str) -> Cell | None:
        """The summary's estimate of ``metric`` on ``task`` for ``method`` (None when absent)."""
        m = self.methods.get(method)
        if m is None or m.summary is None:
            return None
        entry = m.summary.get("tasks", {}).get(task, {}).get("metrics", {}).get(metric)
        return _cell(entry)

    def average_cell(self, method: str, metric: str) -> Cell | None:
        """The summary's own equal-weight average over its ``average.tasks``."""
        m = self.methods.get(method)
        if m is None or m.summary is None:
            return None
        return _cell(m.summary.get("average", {}).get("metrics", {}).get(metric))

    def summary_average_tasks(self, method: str) -> list[str]:
        m = self.methods.get(method)
        if m is None or m.summary is None:
            return []
        avg = m.summary.get("average", {})
        return list(avg.get("tasks") or m.summary.get("tasks", {}).keys())

    def value(self, method: str, task: str, metric: str) -> float | None:
        """Point estimate (fraction) of ``metric`` on ``task`` for ``method``; None when absent."""
        c = self.cell(method, task, metric)
        return None if c is None else c.value

    def ci(self, method: str, task: str, metric: str) -> tuple[float | None, float | None]:
        """(low, high) bootstrap interval from the summary; (None, None) when absent."""
        c = self.cell(method, task, metric)
        return (None, None) if c is None else (c.low, c.high)

    def average(self, method: str, metric: str, tasks: Sequence[str] | None = None) -> Cell | None:
        """Equal-weight average of ``metric`` over ``tasks`` (default: all tasks) with its interval.

        None when the method lacks the metric on one of the tasks
        (:func:`esreason.report.stats.average`).
        """
        return _average(self, method, self.tasks if tasks is None else list(tasks), metric)

    def bootstrap_settings(self) -> tuple[float, int, int]:
        """(level, resamples, seed) of the report's intervals: the evaluations' level and bootstrap
        seed (defaults 0.95 and 0), and the report's one resample count
        (:data:`esreason.report.resample.RESAMPLES`, whatever the evaluation used)."""
        from esreason.report.resample import RESAMPLES

        for m in self.methods.values():
            boot = (m.summary or {}).get("bootstrap") or {}
            if boot:
                return float(boot.get("level", 0.95)), RESAMPLES, int(boot.get("seed", 0))
        return 0.95, RESAMPLES, 0

    # ------------------------------------------------------------------ training seeds

    def seed_keys(self, method: str) -> list[str]:
        """The training seeds of ``method`` in order ([] when it was trained or evaluated once)."""
        m = self.methods.get(method)
        return [] if m is None else list(m.seeds)

    @property
    def n_seeds(self) -> int:
        """The most training seeds any method has (1 for an experiment without ``seeds``)."""
        return max([len(m.seeds) for m in self.methods.values()] + [1])

    def seed_cell(self, method: str, seed: str, task: str, metric: str) -> Cell | None:
        """``metric`` on ``task`` from one training seed's own summary (None when absent)."""
        run = self.methods[method].seeds.get(seed) if method in self.methods else None
        return None if run is None else _cell(run.summary.get("tasks", {}).get(task, {}).get("metrics", {})
                                              .get(metric))

    def seed_problems(self, method: str, task: str) -> list[dict[str, dict[str, Any]]] | None:
        """Per-problem rows of each training seed, in seed order (one entry for a method without
        seeds); None when a ``problems.jsonl`` is missing."""
        key = (method, task)
        if key not in self._seed_problems:
            m = self.methods.get(method)
            runs: list[dict[str, dict[str, Any]]] | None = None
            if m is not None and m.seeds:
                paths = [r.eval_dir / task / PROBLEMS_FILE for r in m.seeds.values()]
                runs = [read_problems(p) for p in paths] if all(p.is_file() for p in paths) else None
            elif m is not None:
                rows = self.problems(method, task)
                runs = None if rows is None else [rows]
            self._seed_problems[key] = runs
        return self._seed_problems[key]

    def problems(self, method: str, task: str) -> dict[str, dict[str, Any]] | None:
        """Per-problem metrics ``{problem_id: row}`` from ``problems.jsonl`` (None when absent);
        for a method with several training seeds, each problem's mean over the seeds."""
        key = (method, task)
        if key not in self._problems:
            m = self.methods.get(method)
            rows = None
            if m is not None and m.seeds:
                runs = self.seed_problems(method, task)
                rows = None if runs is None else mean_rows(runs)
            elif m is not None and m.eval_dir is not None:
                path = m.eval_dir / task / PROBLEMS_FILE
                if path.is_file():
                    rows = read_problems(path)
            self._problems[key] = rows
        return self._problems[key]

    def training(self, method: str) -> list[tuple[Stage, list[dict[str, Any]]]]:
        """Each training stage with its metrics rows (stages whose file is missing are skipped)."""
        if method not in self._training:
            out = []
            for stage in self.methods[method].training:
                if stage.metrics is None or not stage.metrics.is_file():
                    self.notes.append(f"{self.label(method)}: training metrics {stage.metrics} not found; "
                                      f"its {stage.method} stage is left out of the training curves")
                    continue
                out.append((stage, read_metrics_rows(stage.metrics)))
            self._training[method] = out
        return self._training[method]


# ---------------------------------------------------------------------- parsing helpers


def _num(x: Any) -> float | None:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def _cell(entry: Any) -> Cell | None:
    if not isinstance(entry, Mapping):
        return None
    value = _num(entry.get("value"))
    if value is None:
        return None
    n = entry.get("n")
    return Cell(value, _num(entry.get("ci_low")), _num(entry.get("ci_high")),
                int(n) if isinstance(n, int) and not isinstance(n, bool) else None)


def _read_json(path: Path, what: str) -> Any:
    if not path.is_file():
        raise UserError(f"{what} not found: {path}")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"{path} is not valid JSON ({type(exc).__name__}); rerun the command that wrote it") from None
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc}") from None


def read_problems(path: Path) -> dict[str, dict[str, Any]]:
    """``problems.jsonl`` as ``{problem_id: row}``; UserError naming the file and line when malformed."""
    out: dict[str, dict[str, Any]] = {}
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            if not raw.strip():
                continue
            try:
                row = json.loads(raw.decode("utf-8"))
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise UserError(f"{path}:{lineno}: not a JSON line ({type(exc).__name__}); "
                                "rerun the evaluation to rewrite it") from None
            if not isinstance(row, dict) or "problem_id" not in row:
                raise UserError(f"{path}:{lineno}: expected an object with a 'problem_id'")
            out[str(row["problem_id"])] = row
    return out


def read_metrics_rows(path: Path) -> list[dict[str, Any]]:
    """Rows of a run's ``metrics.jsonl`` (via :func:`esreason.io.metrics.read_metrics`: a torn tail is skipped)."""
    from esreason.io.metrics import read_metrics

    return read_metrics(path)


def _str_list(value: Any, where: str, path: Path) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise UserError(f"{path}: {where} must be a list of task names, got {value!r}")
    return list(value)


def _parse_protocol(raw: Any, path: Path) -> dict[str, Any]:
    if not isinstance(raw, Mapping):
        raise UserError(f"{path}: 'protocol' must be an object, got {raw!r}")
    ks = raw.get("ks")
    if (not isinstance(ks, list) or not ks
            or not all(isinstance(k, int) and not isinstance(k, bool) and k >= 1 for k in ks)):
        raise UserError(f"{path}: protocol.ks must be a non-empty list of integers >= 1, got {ks!r}")
    return dict(raw)


def _parse_stage(raw: Any, root: Path, where: str, path: Path) -> Stage:
    if not isinstance(raw, Mapping) or not isinstance(raw.get("method"), str):
        raise UserError(f"{path}: {where} must be an object with a 'method', got {raw!r}")
    metrics = raw.get("metrics")
    if metrics is not None and not isinstance(metrics, str):
        raise UserError(f"{path}: {where}.metrics must be a path, got {metrics!r}")
    offset = raw.get("offset", 0)
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise UserError(f"{path}: {where}.offset must be an integer >= 0, got {offset!r}")
    updates = raw.get("updates")
    if updates is not None and (isinstance(updates, bool) or not isinstance(updates, int) or updates < 0):
        raise UserError(f"{path}: {where}.updates must be an integer >= 0, got {updates!r}")
    return Stage(raw["method"], root / metrics if metrics else None, updates, offset)


def _parse_method(key: str, raw: Any, root: Path, path: Path, notes: list[str]) -> Method:
    where = f"methods.{key}"
    if not isinstance(raw, Mapping):
        raise UserError(f"{path}: {where} must be an object, got {raw!r}")
    kind = raw.get("kind", key)
    if not isinstance(kind, str):
        raise UserError(f"{path}: {where}.kind must be a string, got {kind!r}")
    label = raw.get("label", key)
    if not isinstance(label, str) or not label:
        raise UserError(f"{path}: {where}.label must be a non-empty string, got {label!r}")
    variant = raw.get("variant") is True
    role = key if key in ROLES else (kind if kind in ROLES and not variant else None)
    training = raw.get("training", []) or []
    if not isinstance(training, list):
        raise UserError(f"{path}: {where}.training must be a list, got {training!r}")
    stages = [_parse_stage(s, root, f"{where}.training[{i}]", path) for i, s in enumerate(training)]
    eval_rel = raw.get("eval")
    eval_dir = None
    summary = None
    seeds = _parse_seeds(raw.get("seeds"), root, where, path)
    if seeds:
        summary = pooled_summary(list(seeds.values()), _seed_rows(list(seeds.values())))
        stages = stages or list(next(iter(seeds.values())).training)
    elif eval_rel is None:
        notes.append(f"{label}: no 'eval' entry in {path.name}; left out of every table")
    elif not isinstance(eval_rel, str) or not eval_rel:
        raise UserError(f"{path}: {where}.eval must be a path, got {eval_rel!r}")
    else:
        eval_dir = root / eval_rel
        summary = _read_summary(eval_dir, f"evaluation summary of method {key!r} ({where}.eval)")
    checkpoint = raw.get("checkpoint")
    return Method(key, kind, label, role, str(checkpoint) if checkpoint is not None else None,
                  eval_dir, stages, summary, seeds, variant, variant and raw.get("family") is True)


def _read_summary(eval_dir: Path, what: str) -> dict[str, Any]:
    summary = _read_json(eval_dir / SUMMARY_FILE, what)
    if not isinstance(summary, dict) or not isinstance(summary.get("tasks"), dict):
        raise UserError(f"{eval_dir / SUMMARY_FILE}: not an esreason eval summary (no 'tasks' object)")
    return summary


def _parse_seeds(raw: Any, root: Path, where: str, path: Path) -> dict[str, SeedRun]:
    """``methods.<m>.seeds``: ``{seed: {eval, checkpoint, training}}`` -> SeedRun per seed."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping) or not raw:
        raise UserError(f"{path}: {where}.seeds must be a non-empty object seed -> run, got {raw!r}")
    out = {}
    for seed, entry in raw.items():
        w = f"{where}.seeds.{seed}"
        if not isinstance(entry, Mapping) or not isinstance(entry.get("eval"), str) or not entry["eval"]:
            raise UserError(f"{path}: {w} must be an object with an 'eval' path, got {entry!r}")
        training = entry.get("training", []) or []
        if not isinstance(training, list):
            raise UserError(f"{path}: {w}.training must be a list, got {training!r}")
        eval_dir = root / entry["eval"]
        out[str(seed)] = SeedRun(str(seed), eval_dir, _read_summary(eval_dir, f"evaluation summary ({w}.eval)"),
                                 [_parse_stage(s, root, f"{w}.training[{i}]", path) for i, s in enumerate(training)])
    return out


def _seed_rows(runs: list[SeedRun]) -> dict[str, list[dict[str, dict[str, Any]]] | None]:
    """``{task: [problem rows of each seed]}`` for the pooled summary (None: a file is missing)."""
    tasks = dict.fromkeys(t for r in runs for t in r.summary.get("tasks", {}))
    out: dict[str, list[dict[str, dict[str, Any]]] | None] = {}
    for t in tasks:
        paths = [r.eval_dir / t / PROBLEMS_FILE for r in runs]
        out[t] = [read_problems(p) for p in paths] if all(p.is_file() for p in paths) else None
    return out


def load_experiment(directory: str | Path) -> Experiment:
    """Load ``directory/experiment.json`` and every evaluation summary it names.

    UserError (naming the path or key) for a missing or malformed ``experiment.json``, a
    missing ``summary.json`` of a method, or values of the wrong type.
    """
    root = Path(directory)
    if not root.is_dir():
        raise UserError(f"experiment directory not found: {root}")
    path = root / EXPERIMENT_FILE
    raw = _read_json(path, f"{EXPERIMENT_FILE} (is {root} an experiment directory?)")
    if not isinstance(raw, dict) or raw.get("kind") != EXPERIMENT_KIND:
        got = raw.get("kind") if isinstance(raw, dict) else type(raw).__name__
        raise UserError(f"{path}: kind must be {EXPERIMENT_KIND!r}, got {got!r}")
    if raw.get("version") != 1:
        raise UserError(f"{path}: unsupported version {raw.get('version')!r} (this esreason reads version 1)")
    suites = raw.get("suites")
    if not isinstance(suites, Mapping):
        raise UserError(f"{path}: 'suites' must be an object with 'in_domain' and 'held_out', got {suites!r}")
    in_domain = _str_list(suites.get("in_domain", []), "suites.in_domain", path)
    held_out = _str_list(suites.get("held_out", []), "suites.held_out", path)
    if not in_domain and not held_out:
        raise UserError(f"{path}: suites.in_domain and suites.held_out are both empty")
    protocol = _parse_protocol(raw.get("protocol"), path)
    pairs_raw = raw.get("pairs", []) or []
    if not isinstance(pairs_raw, list) or not all(
            isinstance(p, (list, tuple)) and len(p) == 2 and all(isinstance(t, str) for t in p) for p in pairs_raw):
        raise UserError(f"{path}: 'pairs' must be a list of [train_task, test_task], got {pairs_raw!r}")
    methods_raw = raw.get("methods")
    if not isinstance(methods_raw, Mapping) or not methods_raw:
        raise UserError(f"{path}: 'methods' must be a non-empty object, got {methods_raw!r}")
    notes: list[str] = []
    methods = {str(k): _parse_method(str(k), v, root, path, notes) for k, v in methods_raw.items()}
    exp = Experiment(root=root, name=str(raw.get("name", root.name)), model=str(raw.get("model", "")),
                     train_task=raw.get("train_task") if isinstance(raw.get("train_task"), str) else None,
                     in_domain=in_domain, held_out=held_out, protocol=protocol,
                     pairs=[(str(a), str(b)) for a, b in pairs_raw], methods=methods, notes=notes)
    _note_missing(exp)
    return exp


def _note_missing(exp: Experiment) -> None:
    """Record which tasks each evaluated method lacks, and which roles are absent."""
    for key, m in exp.methods.items():
        if m.summary is None:
            continue
        missing = [t for t in exp.tasks if t not in m.summary.get("tasks", {})]
        if missing:
            exp.notes.append(f"{m.label}: {m.eval_dir / SUMMARY_FILE} has no results for "
                             f"{', '.join(missing)}; those cells are empty")
    for role in ROLES:
        if exp.by_role(role) is None:
            exp.notes.append(f"no {role} method in the experiment; comparisons that need it are left out")


def evaluated(exp: Experiment, keys: Sequence[str] | None = None) -> list[str]:
    """Method keys (in display order) that have an evaluation summary."""
    keys = exp.method_keys() if keys is None else list(keys)
    return [k for k in keys if exp.methods[k].summary is not None]
