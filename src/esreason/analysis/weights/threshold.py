"""Magnitude-thresholded checkpoints and the thresholding sweep (paper §RQ2, appendix
"Complete Results for Magnitude-Thresholded ES").

For a threshold tau the paper builds a checkpoint "by setting Delta theta_i = 0 for
coordinates satisfying 0 < |Delta theta_i| <= tau", i.e. resetting them to the base
model; coordinates with zero change are in neither the ablated set nor the sparsity
denominator, and s_tau is then the checkpoint's *update sparsity*.

:func:`write_thresholded` streams both checkpoints and writes, per coordinate,
``tuned if |Delta| > tau else base`` in the tuned checkpoint's dtype (base values are
cast to it when the two dtypes differ -- then |Delta| includes the cast, a case the
paper does not have). The output is a loadable HF directory: the tuned checkpoint's
config, tokenizer and generation files, one ``model.safetensors`` written by the
streaming writer, and ``threshold.json`` (provenance and statistics). It is written into
a temporary directory renamed into place at the end (atomic). Every stored tensor name
is kept, so a checkpoint that stores a tied LM head keeps it (thresholded identically).

:func:`run_sweep` evaluates Pass@1 across thresholds with :func:`esreason.eval.evaluate`
(paper: 32 responses per problem, temperature 0.6) and builds the appendix table (tau,
update sparsity, Pass@1, Delta vs Full ES, with Full ES and Base Model rows) and the
figure (Pass@1 against update sparsity; base as a dashed line and the 100% endpoint).
"""

from __future__ import annotations

import json
import math
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch

from esreason.analysis.weights.checkpoints import DEFAULT_CHUNK_ELEMS, Checkpoint, SafetensorsStreamWriter, check_compatible
from esreason.errors import UserError

THRESHOLD_INFO = "threshold.json"


@dataclass
class ThresholdStats:
    """What a thresholded checkpoint kept: counts over analysed coordinates (tied weights once)."""

    tau: float
    tau_label: str
    num_coordinates: int = 0
    num_changed: int = 0
    num_reset: int = 0        # 0 < |Delta| <= tau, set back to base
    num_kept: int = 0         # |Delta| > tau
    sq_base: float = 0.0
    sq_kept: float = 0.0
    sq_full: float = 0.0

    @property
    def update_sparsity(self) -> float | None:
        """s_tau (paper Eq. rq2-update-sparsity); None when nothing changed."""
        return self.num_reset / self.num_changed if self.num_changed else None

    @property
    def relative_l2(self) -> float | None:
        """D_rel of the thresholded checkpoint against base."""
        return math.sqrt(self.sq_kept) / math.sqrt(self.sq_base) if self.sq_base > 0 else None

    @property
    def full_relative_l2(self) -> float | None:
        return math.sqrt(self.sq_full) / math.sqrt(self.sq_base) if self.sq_base > 0 else None

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "update_sparsity": self.update_sparsity, "relative_l2": self.relative_l2,
                "full_relative_l2": self.full_relative_l2}


def check_tau(tau: float) -> float:
    if not isinstance(tau, (int, float)) or isinstance(tau, bool) or not math.isfinite(tau) or tau <= 0:
        raise UserError(f"tau must be a finite number > 0 (got {tau})")
    return float(tau)


def write_thresholded(base: str | Path | Checkpoint, tuned: str | Path | Checkpoint, tau: float,
                      out: str | Path, *, tau_label: str | None = None,
                      chunk_elems: int = DEFAULT_CHUNK_ELEMS) -> ThresholdStats:
    """Write the magnitude-thresholded checkpoint to ``out`` (atomically) and return its statistics."""
    from esreason.io.atomic import atomic_directory, atomic_write_json

    tau = check_tau(tau)
    b = base if isinstance(base, Checkpoint) else Checkpoint(base, "base")
    t = tuned if isinstance(tuned, Checkpoint) else Checkpoint(tuned, "tuned")
    check_compatible(b, t)
    out = Path(out)
    if out.resolve() in (b.path.resolve(), t.path.resolve()):
        raise UserError(f"--out {out} would overwrite an input checkpoint")
    stats = ThresholdStats(tau, tau_label or repr(tau))
    stored = t.stored_names
    specs = [(n, t.infos[n].dtype, t.infos[n].shape) for n in stored]
    with atomic_directory(out) as tmp:
        for f in t.extra_files():
            shutil.copy2(f, tmp / f.name)
        writer = SafetensorsStreamWriter(tmp / "model.safetensors", specs, {"format": "pt"})
        try:
            with b.reader(chunk_elems) as rb, t.reader(chunk_elems) as rt:
                for name in stored:
                    canon = t.tied_alias.get(name, name)   # the base may store the tied head only once
                    ib, it = b.infos[canon], t.infos[name]
                    count = name == canon
                    for (_, xb), (_, xt) in zip(rb.chunks(ib), rt.chunks(it)):
                        if not it.is_float:
                            writer.write(name, xt)
                            continue
                        writer.write(name, _threshold_chunk(xb, xt, tau, stats if count else None, name))
        except BaseException:
            writer.abort()
            raise
        writer.close()
        atomic_write_json(tmp / THRESHOLD_INFO, {"base": str(b.path), "tuned": str(t.path),
                                                 "rule": "tuned where |delta| > tau, base elsewhere",
                                                 "tied_weights_counted_once": t.tied_alias, **stats.to_json()})
    return stats


def _threshold_chunk(xb: torch.Tensor, xt: torch.Tensor, tau: float, stats: ThresholdStats | None,
                     name: str) -> torch.Tensor:
    """tuned where |tuned - base| > tau else base, in the tuned dtype. xb, xt: [n] stored dtypes."""
    b64, t64 = xb.to(torch.float64), xt.to(torch.float64)
    d = t64 - b64                                  # [n] float64 Delta
    if not bool(torch.isfinite(d).all()):
        raise UserError(f"tensor {name!r} holds non-finite values (inf/nan)")
    a = d.abs()
    keep = a > tau                                 # [n] bool
    if stats is not None:
        changed = a > 0
        stats.num_coordinates += a.numel()
        stats.num_changed += int(changed.sum())
        stats.num_kept += int(keep.sum())
        stats.num_reset += int((changed & ~keep).sum())
        sq = d * d
        stats.sq_base += float((b64 * b64).sum())
        stats.sq_full += float(sq.sum())
        stats.sq_kept += float(sq[keep].sum())
    return torch.where(keep, xt, xb.to(xt.dtype))


# --------------------------------------------------------------------------- sweep


@dataclass
class EvalSettings:
    """Evaluation protocol of the sweep (paper: 32 samples per problem, temperature 0.6)."""

    tasks: list[str]
    suite: str | None = None
    samples: int = 32
    temperature: float = 0.6
    top_p: float = 1.0
    max_new_tokens: int = 2048
    limit: int | None = None
    data_dir: str | None = None
    split: str = "test"
    seed: int = 0
    batch_size: int = 256
    device: str | None = None
    dtype: str = "float32"
    bootstrap: int = 1000


@dataclass
class SweepRow:
    label: str            # "Full ES", a tau label, "Base Model"
    tau: float | None
    sparsity: float       # update sparsity in [0, 1]
    pass1: float | None   # Pass@1 in [0, 1] (equal-weight average over tasks)
    ci: tuple[float | None, float | None] = (None, None)
    per_task: dict[str, float | None] = field(default_factory=dict)
    relative_l2: float | None = None


def _evaluate(model_dir: Path, settings: EvalSettings, out_dir: Path, progress: bool) -> dict[str, Any]:
    from esreason.eval import evaluate

    s = evaluate(str(model_dir), settings.tasks, output_dir=out_dir, samples=settings.samples,
                 temperature=settings.temperature, top_p=settings.top_p, max_new_tokens=settings.max_new_tokens,
                 ks=[1], greedy=False, limit=settings.limit, data_dir=settings.data_dir, seed=settings.seed,
                 batch_size=settings.batch_size, split=settings.split, progress=progress, device=settings.device,
                 dtype=settings.dtype, ci_resamples=settings.bootstrap, suite=settings.suite)
    avg = s.estimates["__average__"]["pass@1"] if "__average__" in s.estimates else None
    est = avg if avg is not None else s.estimates[settings.tasks[0]]["pass@1"]
    return {"pass1": est.value, "ci": (est.low, est.high),
            "per_task": {t: s.value("pass@1", t) for t in settings.tasks}}


def run_sweep(base: str | Path, tuned: str | Path, taus: Sequence[tuple[str, float]], settings: EvalSettings,
              out: str | Path, *, keep_checkpoints: bool = False, chunk_elems: int = DEFAULT_CHUNK_ELEMS,
              progress: bool = True) -> list[SweepRow]:
    """Evaluate Full ES, each thresholded checkpoint and the base model; rows in table order.

    Evaluations go to ``out/eval/<label>/`` (the harness resumes them when rerun with the
    same protocol); thresholded checkpoints to ``out/checkpoints/tau_<label>/`` (deleted
    after evaluation unless ``keep_checkpoints``).
    """
    import sys

    out = Path(out)
    b, t = Checkpoint(base, "base"), Checkpoint(tuned, "tuned")
    check_compatible(b, t)
    if not settings.tasks:
        raise UserError("the sweep needs tasks to evaluate (--suite NAME or --tasks a,b)")
    for _, v in taus:
        check_tau(v)
    rows: list[SweepRow] = []

    def say(msg: str) -> None:
        if progress:
            print(msg, file=sys.stderr, flush=True)

    say("[sweep] evaluating Full ES")
    full = _evaluate(t.path, settings, out / "eval" / "full", progress)
    rows.append(SweepRow("Full ES", None, 0.0, full["pass1"], full["ci"], full["per_task"]))
    for lab, tau in taus:
        ck = out / "checkpoints" / f"tau_{lab}"
        say(f"[sweep] tau={lab}: writing the thresholded checkpoint")
        stats = write_thresholded(b, t, tau, ck, tau_label=lab, chunk_elems=chunk_elems)
        say(f"[sweep] tau={lab}: update sparsity {100 * (stats.update_sparsity or 0):.2f}%, evaluating")
        res = _evaluate(ck, settings, out / "eval" / f"tau_{lab}", progress)
        rows.append(SweepRow(lab, tau, stats.update_sparsity or 0.0, res["pass1"], res["ci"], res["per_task"],
                             stats.relative_l2))
        if rows[0].relative_l2 is None:
            rows[0].relative_l2 = stats.full_relative_l2
        if not keep_checkpoints:
            shutil.rmtree(ck, ignore_errors=True)
    if not keep_checkpoints and (out / "checkpoints").is_dir() and not any((out / "checkpoints").iterdir()):
        (out / "checkpoints").rmdir()
    say("[sweep] evaluating the base model")
    base_res = _evaluate(b.path, settings, out / "eval" / "base", progress)
    rows.append(SweepRow("Base Model", None, 1.0, base_res["pass1"], base_res["ci"], base_res["per_task"], 0.0))
    return rows


def sweep_payload(rows: Sequence[SweepRow], settings: EvalSettings, base: str, tuned: str) -> dict[str, Any]:
    full = rows[0].pass1
    return {
        "base": str(base), "tuned": str(tuned), "eval": asdict(settings),
        "rows": [{"label": r.label, "tau": r.tau, "update_sparsity": r.sparsity, "pass1": r.pass1,
                  "pass1_ci": list(r.ci), "delta_vs_full_es": (None if r.label == "Base Model" or r.pass1 is None
                                                              or full is None else r.pass1 - full),
                  "relative_l2": r.relative_l2, "per_task_pass1": r.per_task} for r in rows],
        "notes": "Pass@1 = mean over problems of c/M (M = eval.samples), equal weight per task; "
                 "delta vs Full ES in percentage points on the same scale",
    }


def read_threshold_info(ckpt: str | Path) -> dict[str, Any]:
    return json.loads((Path(ckpt) / THRESHOLD_INFO).read_text())

