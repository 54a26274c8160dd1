"""What ``esreason experiment plan --calibrate`` measured: the constants read from the records of the
calibration's short run (:mod:`esreason.experiments.calibrate` runs it and prices the plan).

**Work apart from speed.** A constant such as "seconds of generation per update" mixes two things:
the work (how many tokens the update generated: fixed by the models, seeds and prompts, the same in
every calibration) and the machine's speed at that moment (what varies between calibrations). The
calibration keeps them apart where the records allow:

- **ES and GRPO generation** (``time/generate``, ``time/rollout`` of RUN/metrics.jsonl): one sample
  per steady-state update of *seconds per generated token* (the row's ``tokens``); the plan's
  seconds per update are its median times the calibration's mean tokens per update.
- **evaluation calls** (each evaluated model's ``summary.json`` ``timings``): one sample per
  evaluated model *and task* of seconds per generated token, pooled over the tasks (3 models x 3
  tasks give 9 samples where per-task medians had 3); a task's seconds per call are that median
  times its mean tokens per call.
- **the rest** as before: the non-generation share of each update (``update`` / ``train``), each
  held-out evaluation, each checkpoint write, verification per problem: medians of their samples.
- **start**: a stage's wall time minus the seconds its updates, held-out evaluations and checkpoints
  actually took (their sums, not their medians times their counts: an update stalled by another
  process stays an update, and the per-update medians are robust to it), plus the warm-up updates'
  excess over a steady update.

The spread of each constant and the plan's own interval are in :mod:`esreason.experiments.calibrate_check`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import platform
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from esreason.errors import UserError
from esreason.experiments import calibrate_check as check

#: Updates at the start of each calibration run that are warm-up, not samples (their excess is ``start``).
WARMUP_UPDATES = 1
#: Times the calibration writes and hashes a checkpoint (samples of the checkpoint constant).
CHECKPOINT_REPEATS = 3
#: Bytes per read/write when the calibration copies and hashes a checkpoint.
CHUNK = 64 * 2**20


@dataclass(frozen=True)
class TrainRates:
    """Measured constants of one training kind (ES or GRPO) on this machine (medians of ``samples``)."""

    start_s: float
    """Stage wall time not explained by updates, held-out evaluations and checkpoints (warm-up included)."""
    decode_s: float
    """Seconds of generation per update (ES: all members' rollouts; GRPO: the rollout batch):
    ``token_s`` x ``tokens_per_update`` where the run counted tokens."""
    update_s: float
    """Seconds per update outside generation (ES: perturb, reward, restore, update; GRPO: the
    optimizer steps, loss and reward computation)."""
    heldout_s: float
    """Seconds per periodic held-out evaluation (0 when the config has ``eval.every: 0``)."""
    checkpoint_s: float
    """Seconds to write one checkpoint and read it back for its sha256."""
    warmup_s: float = 0.0
    """The warm-up updates' seconds beyond a steady update (part of ``start_s``; shown, not added)."""
    samples: dict[str, list[float]] = dataclasses.field(default_factory=dict)
    """Samples per constant: ``token`` (seconds per generated token, per update; ``decode``, seconds
    per update, where no tokens were counted), ``update``, ``heldout``, ``checkpoint`` (seconds)."""
    token_s: float = 0.0
    """Seconds per generated token (median over the steady updates); 0 where no tokens were counted."""
    tokens_per_update: float = 0.0
    """Generated tokens per update, the mean over all the calibration's updates (the work, not the speed)."""


@dataclass(frozen=True)
class EvalRates:
    """Measured constants of the evaluation harness on this machine (medians over evaluated models)."""

    start_s: float
    """Evaluation wall time not explained by generate calls and verification (model load,
    bootstrap set-up, writing the summary)."""
    call_s: dict[str, float]
    """Seconds per generate call, per task (a sampled call and a greedy call averaged):
    ``token_s`` x ``tokens_per_call``."""
    verify_s: dict[str, float]
    """Seconds of verification and aggregation per problem, per task."""
    samples: dict[str, list[float]] = dataclasses.field(default_factory=dict)
    """Samples per constant: ``token`` (seconds per generated token, one per evaluated model and task),
    ``verify.<task>`` and ``start`` (one per evaluated model)."""
    token_s: float = 0.0
    """Seconds per generated token of the evaluation's generate calls (median over models and tasks)."""
    tokens_per_call: dict[str, float] = dataclasses.field(default_factory=dict)
    """Generated tokens per generate call, per task (mean over the evaluated models)."""


def rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def checkpoint_seconds(directories: list[Path], work: Path) -> float:
    """Write the checkpoint's bytes once more (fsync'd) and hash them back, as a checkpoint write does."""
    files = [p for d in directories for p in sorted(d.rglob("*")) if p.is_file()]
    t0 = time.perf_counter()
    target = work / "checkpoint-copy"
    target.mkdir(parents=True)
    for i, src in enumerate(files):  # streamed: a 7B checkpoint is 15 GB
        with open(src, "rb") as fin, open(target / f"f{i}", "wb") as fout:
            shutil.copyfileobj(fin, fout, CHUNK)
            fout.flush()
            os.fsync(fout.fileno())
    for i in range(len(files)):
        digest = hashlib.sha256()
        with open(target / f"f{i}", "rb") as fh:
            while block := fh.read(CHUNK):
                digest.update(block)
    shutil.rmtree(target)
    return time.perf_counter() - t0


def train_rates(run: Path, seconds: float, kind: str, work: Path, writes: Any = None) -> TrainRates:
    """The constants of one calibration run: medians over the steady-state updates (after
    WARMUP_UPDATES), over its held-out evaluations and over CHECKPOINT_REPEATS checkpoint writes
    (``writes``: the write-and-hash function, :func:`checkpoint_seconds` unless given)."""
    records = rows(run / "metrics.jsonl")
    steps = [r for r in records if "time/step" in r]
    if len(steps) < WARMUP_UPDATES + 2:
        raise UserError(f"calibration: {run / 'metrics.jsonl'} has {len(steps)} timed updates; expected more than "
                        f"{WARMUP_UPDATES + 1}")
    gen_key = "time/generate" if kind == "es" else "time/rollout"
    warm, steady = steps[:WARMUP_UPDATES], steps[WARMUP_UPDATES:]
    decode = [float(r.get(gen_key, 0.0)) for r in steady]
    update = [float(r["time/step"]) - float(r.get(gen_key, 0.0)) for r in steady]
    counted = all(float(r.get("tokens", 0)) > 0 for r in steps)
    token = [d / float(r["tokens"]) for d, r in zip(decode, steady)] if counted else []
    tokens_per_update = sum(float(r["tokens"]) for r in steps) / len(steps) if counted else 0.0
    decode_s = check.median(token) * tokens_per_update if counted else check.median(decode)
    if kind == "es":
        held = [r["heldout/time/generate_s"] + r.get("heldout/time/verify_s", 0.0) + r.get("heldout/time/aggregate_s", 0.0)
                for r in records if "heldout/time/generate_s" in r]
    else:
        held = [r["time/heldout"] for r in records if "time/heldout" in r]
    from esreason.io.rundir import RunDir

    latest = RunDir(run).latest_checkpoint()
    if latest is None:
        raise UserError(f"calibration: no checkpoint under {run}")
    n_ckpt = len([p for p in (run / "checkpoints").iterdir() if p.name.startswith("step_")])
    # GRPO writes TRL's checkpoint (weights, optimizer, RNG) beside ours at every period
    directories = [latest[1]] + ([run / "trl" / f"checkpoint-{latest[0]}"] if kind == "grpo" else [])
    write = writes or checkpoint_seconds
    ckpt = [write([d for d in directories if d.is_dir()], work / f"ckpt-{kind}-{i}") for i in range(CHECKPOINT_REPEATS)]
    step_s = decode_s + check.median(update)
    heldout_s, ckpt_s = check.median(held), check.median(ckpt)
    warmup_s = sum(float(r["time/step"]) for r in warm) - len(warm) * step_s
    # the rest of the stage's time: what its updates, held-out evaluations and checkpoints took is
    # subtracted as measured, and the warm-up's excess over a steady update stays in
    start_s = seconds - sum(float(r["time/step"]) for r in steps) - sum(held) - n_ckpt * ckpt_s + warmup_s
    samples = {("token" if counted else "decode"): token if counted else decode, "update": update, "heldout": held,
               "checkpoint": ckpt}
    return TrainRates(start_s=max(0.0, start_s), decode_s=decode_s, update_s=check.median(update),
                      heldout_s=heldout_s, checkpoint_s=ckpt_s, warmup_s=warmup_s, samples=samples,
                      token_s=check.median(token), tokens_per_update=tokens_per_update)


def eval_rates(exp: Path, record: dict[str, Any]) -> EvalRates:
    """Seconds per generated token pooled over the evaluated models and tasks, tokens per call per task
    (mean over the models), verification per problem per task (median over the models)."""
    token: list[float] = []
    per_call: dict[str, list[float]] = {}
    verify: dict[str, list[float]] = {}
    starts = []
    for name in record["methods"]:
        summary = json.loads((exp / "eval" / name / "summary.json").read_text())
        # streamed (eval.streamed): verification overlaps generation, inside each task's generate_s share
        overlapped = summary["timings"].get("total", {}).get("schedule") == "stream"
        explained = 0.0
        for task, t in summary["timings"].items():
            if task == "total":
                continue
            calls = max(1, t["generate_calls"])
            per_call.setdefault(task, []).append(t["tokens"] / calls)
            if t["tokens"] > 0:
                token.append(t["generate_s"] / t["tokens"])
            problems = max(1, t["responses"] // (summary["protocol"]["samples"] + (1 if summary["protocol"].get("greedy") else 0)))
            serial = t.get("aggregate_s", 0.0) + (0.0 if overlapped else t["verify_s"])
            verify.setdefault(task, []).append(serial / problems)
            explained += t["generate_s"] + serial
        starts.append(record["timings"][f"eval/{name}"] - explained)
    tokens_per_call = {k: sum(v) / len(v) for k, v in per_call.items()}
    token_s = check.median(token)
    samples = {"token": token, **{f"verify.{k}": v for k, v in verify.items()}, "start": starts}
    return EvalRates(start_s=max(0.0, check.median(starts)),
                     call_s={k: token_s * n for k, n in tokens_per_call.items()},
                     verify_s={k: check.median(v) for k, v in verify.items()}, samples=samples,
                     token_s=token_s, tokens_per_call=tokens_per_call)


def machine() -> str:
    """This machine in one line: CPU model, cores, torch's intra-op threads, or the GPU."""
    import torch

    if torch.cuda.is_available():
        return f"{torch.cuda.get_device_name(0)} x {torch.cuda.device_count()}"
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    from esreason import openmp

    return f"{cpu}, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads, {openmp.describe()}"


def load_average() -> list[float] | None:
    """The machine's 1, 5 and 15-minute load averages (None where the OS has none)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


__all__ = ["CHECKPOINT_REPEATS", "CHUNK", "WARMUP_UPDATES", "EvalRates", "TrainRates", "checkpoint_seconds",
           "eval_rates", "load_average", "machine", "rows", "train_rates"]
