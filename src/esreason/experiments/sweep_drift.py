"""``esreason experiment sweep-drift SWEEP --protocol EXP.yaml``: a sweep's endpoints on the gain-vs-forgetting plane.

A sweep (:mod:`esreason.experiments.sweep`) trains one ES run per value of a key, e.g.
``es.anchor_decay`` (anchored ES, configs/sweeps/demo/anchor.yaml). This command places every
endpoint where the experiment report places a method (report section 9, :mod:`esreason.report.drift`):

1. the protocol is an experiment file's ``model``, ``eval`` section (tasks, samples, temperature, ...)
   and ``analysis.offtask`` (nothing of its ``methods`` or ``configs`` is trained); its model must be
   the sweep's;
2. ``OUTPUT`` (default ``SWEEP/drift``) becomes an ordinary experiment directory: ``experiment.json``
   with Base and one method per sweep value (``kind: checkpoint``: its final checkpoint; with sweep
   seeds, one entry per seed), ``eval/<method>[/seed<s>]`` from the evaluation harness with the
   protocol's sampling seed (common random numbers, as ``experiment run``), ``offtask/``
   (:mod:`esreason.analysis.offtask.run`) and ``report/`` (:func:`esreason.report.build_report`);
3. section 9's table (in-domain Pass@1 gain, held-out Pass@1 change, off-task KL, relative L2 drift,
   with the report's intervals: paired problem bootstrap with one seed, seed-level t-intervals with
   several) is written to ``OUTPUT/drift.md`` and printed.

Resumable like ``experiment run``: the harness skips answered problems, the off-task files are reused
while their checkpoint and set are unchanged.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from esreason.errors import UserError


def _endpoints(sweep: Path) -> tuple[dict[str, Any], list[tuple[str, str, str | None, Path, Path]]]:
    """(sweep.json, [(value label, method key, seed or None, final checkpoint, run dir)]) of a finished sweep."""
    path = sweep / "sweep.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise UserError(f"{path}: not a finished sweep ({exc}); run `esreason experiment sweep` first") from None
    out = []
    for i, value in enumerate(data["values"]):
        keys = [k for k in data["runs"] if k == value or k.startswith(f"{value}/seed")]
        for key in keys:
            run = Path(data["runs"][key]["run_dir"])
            run = run if run.is_absolute() or run.exists() else sweep / run
            try:
                ckpt = Path(json.loads((run / "sweep_complete.json").read_text())["final_checkpoint"])
            except (OSError, ValueError, KeyError):
                raise UserError(f"{run}: no sweep_complete.json with a final checkpoint (an unfinished run)") from None
            seed = data["runs"][key].get("seed")
            out.append((value, f"v{i}", None if seed is None else str(seed), ckpt, run))
    return data, out


def _rel(path: Path, root: Path) -> str:
    return os.path.relpath(path.resolve(), root.resolve())


def run_sweep_drift(sweep: str | Path, protocol: Any, output: str | Path | None = None, *,
                    progress: bool = True, log: Any = print) -> Path:
    """Evaluate and score every endpoint of ``sweep`` under ``protocol`` (an ExperimentSpec); returns drift.md."""
    from esreason.experiments.runner import EXPERIMENT_FILE, KIND, _evaluate
    from esreason.io.atomic import atomic_write_json, atomic_write_text
    from esreason.io.lock import directory_lock
    from esreason.report import build_report
    from esreason.report.drift import caption, drift_rows, drift_table, seeds_text
    from esreason.report import markdown

    sweep = Path(sweep)
    data, points = _endpoints(sweep)
    from esreason.backends.hf import resolve_model_path

    model = data.get("base_config", {}).get("model")
    if not isinstance(model, str) or resolve_model_path(model) != resolve_model_path(protocol.model):
        raise UserError(f"--protocol: its model {protocol.model!r} is not the sweep's ({model!r}); the gain and "
                        "the drift are measured from the sweep's start model")
    exp = Path(output) if output is not None else sweep / "drift"
    p = protocol.eval
    with directory_lock(exp, what="experiment directory"):
        record: dict[str, Any] = {
            "kind": KIND, "version": 1, "name": f"{protocol.name}-{sweep.name}", "model": protocol.model,
            "train_task": data.get("base_config", {}).get("task"),
            "suites": {"in_domain": list(p.in_domain), "held_out": list(p.held_out)},
            "protocol": {"samples": p.samples, "ks": list(p.ks), "temperature": p.temperature, "top_p": p.top_p,
                         "max_new_tokens": p.max_new_tokens, "greedy": p.greedy, "limit": p.limit, "seed": p.seed},
            "pairs": [], "sweep": {"dir": str(sweep), "param": data["param"]}, "timings": {},
            "methods": {"base": {"kind": "base", "label": "Base", "checkpoint": protocol.model, "eval": "eval/base",
                                 "training": []}}}
        log(f"Base: evaluating on {', '.join(p.tasks)}")
        record["timings"]["eval/base"] = round(_evaluate(protocol.model, protocol, exp / "eval" / "base", progress), 1)
        for value, key, seed, ckpt, run in points:
            name = key if seed is None else f"{key}/seed{seed}"
            entry = {"eval": f"eval/{name}", "checkpoint": _rel(ckpt, exp),
                     "training": [{"method": "es", "metrics": _rel(run / "metrics.jsonl", exp), "offset": 0}]}
            log(f"{data['param']}={value}{'' if seed is None else f' (seed {seed})'}: evaluating {ckpt}")
            record["timings"][f"eval/{name}"] = round(_evaluate(str(ckpt), protocol, exp / entry["eval"], progress), 1)
            label = f"{data['param'].split('.')[-1]}={value}"  # es.anchor_decay -> anchor_decay=10
            method = record["methods"].setdefault(key, {"kind": "checkpoint", "label": label, "training": []})
            if seed is None:
                method.update(entry)
            else:
                method.setdefault("seeds", {})[seed] = entry
        atomic_write_json(exp / EXPERIMENT_FILE, record)
        if protocol.analysis is not None and protocol.analysis.offtask is not None:
            from esreason.analysis.offtask.run import run_offtask

            record["offtask"] = run_offtask(protocol, exp, record, log=log)
            atomic_write_json(exp / EXPERIMENT_FILE, record)
        result = build_report(exp)
    table = drift_table(result.experiment)
    if table is None:
        raise UserError(f"{exp}: no endpoint could be compared with Base")
    text = "\n".join([f"# Gain vs drift over {data['param']} ({sweep})", "",
                      markdown.simple_markdown(*drift_rows(table)), "", caption(table), "", *seeds_text(table),
                      f"Full report: {result.markdown}", ""])
    atomic_write_text(exp / "drift.md", text)
    return exp / "drift.md"


def register(actions: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``sweep-drift`` to the ``esreason experiment`` action group."""
    p = actions.add_parser(
        "sweep-drift", help="a sweep's endpoints against Base: in-domain gain, held-out change, off-task KL",
        description="Evaluate every final checkpoint of a finished sweep and the base model under an experiment "
                    "file's protocol (eval section, analysis.offtask), and write the report's gain-vs-forgetting "
                    "table (docs/offtask.md).")
    p.add_argument("sweep", help="sweep directory (esreason experiment sweep --output)")
    p.add_argument("--protocol", required=True, help="experiment YAML whose model, eval and analysis sections are used")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a key of the protocol file")
    p.add_argument("--output", help="experiment directory to write (default: SWEEP/drift)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=_command)
    return p


def _command(args: argparse.Namespace) -> int:
    from esreason.experiments.spec import load_spec

    spec = load_spec(args.protocol, args.set or [])
    path = run_sweep_drift(args.sweep, spec, args.output, progress=not args.no_progress)
    print(path.read_text())
    return 0
