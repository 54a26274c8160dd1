"""Off-task drift of every method of an experiment: token KL from the base model on the off-task set.

Run by ``esreason experiment run`` after the evaluations when the experiment names
``analysis.offtask`` (docs/offtask.md). Files (paths relative to the experiment directory)::

    EXP/offtask/set.jsonl, set.json       the off-task rows (:mod:`esreason.analysis.offtask.data`)
    EXP/offtask/<method>.json             one per method other than Base (per seed: <method>/seed<s>.json):
                                          per row {id, kl_sum, tokens}, the means per sequence and
                                          per token, relative L2 drift

The measure is the full-vocabulary KL(base || tuned) at each scored position, both models
teacher-forced on the same tokens (:class:`esreason.backends.kl_scoring.TokenKLScorer`), reported two
ways: **per sequence**, the mean over rows of each row's sum over its tokens (``mean_sequence_kl``, nats
per response: the estimate of the sequence-level KL below), and **per token**, the mean over rows of
kl_sum / tokens (``mean_token_kl``, nats per token: length-normalised, so two rows whose sums are equal but
whose lengths differ get different values). Each prompt or text weighs the same, as each problem does in
Pass@1; the token-weighted mean is stored beside them. Why base || tuned:
the rows are the base model's own samples, and for y ~ p_base the chain rule gives
E_y[sum_t KL(p_base(. | y_<t) || p_tuned(. | y_<t))] = KL(P_base || P_tuned) over whole responses,
so the per-token full-vocabulary sum on base samples estimates the sequence-level divergence of what
the base model would say off-task from what the tuned model would say, with the inner expectation
exact (no sampled log-ratio). The reverse direction would need samples from every tuned model.

Reruns reuse what matches: the set when its settings are unchanged, a method's file when its
checkpoint and the set are unchanged.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from esreason.analysis.offtask.data import SET_META, Row, build_rows, load_set, save_set, settings_record

DIRECTION = "KL(base || tuned)"
OFFTASK_DIR = "offtask"


def score_method(base: Any, tuned: Any, rows: list[Row]) -> dict[str, Any]:
    """Per-row KL sums of ``tuned`` against ``base`` on ``rows``, the means per sequence and per token (and
    token-weighted), and the relative L2 drift."""
    from esreason.backends.kl_scoring import TokenKLScorer, relative_l2

    sums = TokenKLScorer(base, tuned).kl_sums([r.prompt_ids for r in rows], [r.response_ids for r in rows])
    per_row = [{"id": r.id, "kl_sum": kl, "tokens": n} for r, (kl, n) in zip(rows, sums)]
    total_tokens = sum(n for _, n in sums)
    return {"direction": DIRECTION, "rows": per_row,
            "mean_sequence_kl": sum(kl for kl, _ in sums) / len(sums),
            "mean_token_kl": sum(kl / n for kl, n in sums) / len(sums),
            "token_weighted_kl": sum(kl for kl, _ in sums) / total_tokens,
            "relative_l2": relative_l2(base, tuned)}


def _targets(exp: Path, record: dict[str, Any]) -> list[tuple[str, str | None, str, str | None]]:
    """(method, seed or None, model path or hub id, tensor hash or None) of every method but Base."""
    out = []
    for key, entry in record.get("methods", {}).items():
        if entry.get("kind") == "base":
            continue
        runs = [(s, e) for s, e in entry["seeds"].items()] if "seeds" in entry else [(None, entry)]
        for seed, e in runs:
            ckpt = e.get("checkpoint")
            if ckpt:
                path = exp / ckpt
                out.append((key, seed, str(path) if path.exists() else str(ckpt), e.get("sha256_tensors")))
    return out


def _reusable(path: Path, model: str, digest: str | None, set_sha: str) -> bool:
    try:
        old = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return old.get("set_sha256") == set_sha and old.get("checkpoint") == model and old.get("sha256_tensors") == digest


def run_offtask(spec: Any, exp: Path, record: dict[str, Any], *, log: Any = print) -> dict[str, Any]:
    """Build (or reuse) the off-task set and score every method of ``record``; returns the index that
    ``experiment.json`` stores under ``offtask``."""
    from esreason.backends.hf import load_model
    from esreason.io.atomic import atomic_write_json

    settings = spec.analysis.offtask
    device, dtype = spec.eval_settings()  # the experiment's evaluation device and dtype (ExperimentSpec)
    out = exp / OFFTASK_DIR
    base, tok = load_model(spec.model, dtype, device)
    wanted = settings_record(settings, spec.model)
    stored = load_set(out, wanted)
    if stored is None:
        log(f"off-task set: {settings.source} {getattr(settings, settings.source)!r} -> {out}")
        rows = build_rows(settings, base, tok)
        meta = save_set(out, rows, wanted)
    else:
        rows, meta = stored
    index: dict[str, Any] = {"set": f"{OFFTASK_DIR}/{SET_META}", "direction": DIRECTION, "rows": meta["rows"],
                             "tokens": meta["tokens"], "source": settings.source, "methods": {}}
    for method, seed, model, digest in _targets(exp, record):
        rel = f"{OFFTASK_DIR}/{method}.json" if seed is None else f"{OFFTASK_DIR}/{method}/seed{seed}.json"
        path = exp / rel
        if not _reusable(path, model, digest, meta["sha256"]):
            log(f"off-task KL: {method}{'' if seed is None else f' (seed {seed})'} on {meta['rows']} rows")
            t0 = time.perf_counter()
            tuned, _ = load_model(model, dtype, device)
            result = score_method(base, tuned, rows)
            del tuned
            atomic_write_json(path, {"kind": "esreason-offtask", "version": 1, "method": method, "seed": seed,
                                     "checkpoint": model, "sha256_tensors": digest, "set_sha256": meta["sha256"],
                                     "seconds": round(time.perf_counter() - t0, 2), **result})
        entry = index["methods"].setdefault(method, {})
        if seed is None:
            entry["file"] = rel
        else:
            entry.setdefault("seeds", {})[str(seed)] = rel
    return index
