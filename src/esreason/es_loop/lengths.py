"""Response lengths of an ES run: per update and member in metrics.jsonl, the run's in the manifest.

Every update logs, beside its rewards (``length/*`` keys of RUN/metrics.jsonl):

- ``length/mean``, ``length/p50``, ``length/p90``, ``length/p99``, ``length/max``: generated tokens of
  the update's N x B responses (stop token excluded);
- ``length/at_cap``: the share that ended at ``generation.max_new_tokens`` (no stop token before the
  cap: a runaway or an answer cut short);
- ``length/member_mean``, ``length/member_max``, ``length/member_at_cap``: the same per member, in
  population order (lists of N);
- ``length/responses``: every response's length, N lists of B (what ``esreason experiment plan
  --lengths RUN`` reads: :func:`esreason.experiments.lengths.read_lengths`).

The scalars also go to TensorBoard and W&B; the lists only to the JSONL file. At the end of a run
(and of every resumed part) the manifest's ``response_lengths`` summarises all updates so far:
:func:`summary`. Every backend reports the lengths (hf, batched, ray, vllm); an evaluator that does
not gives an update without ``length/*`` keys.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

import numpy as np

RESPONSES_KEY = "length/responses"
MANIFEST_KEY = "response_lengths"
QUANTILES = (0.5, 0.9, 0.99)


def _quantiles(values: np.ndarray) -> dict[str, int]:
    """p50, p90, p99 as response lengths (the smallest length with at least that share at or below it)."""
    return {f"p{round(100 * q)}": int(np.quantile(values, q, method="inverted_cdf")) for q in QUANTILES}


def length_metrics(lengths: np.ndarray | None, cap: int) -> dict[str, Any]:
    """The ``length/*`` metrics of one update from its [N, B] response lengths ({} without them)."""
    if lengths is None:
        return {}
    tokens = np.asarray(lengths, dtype=np.int64)
    at_cap = tokens >= cap
    out: dict[str, Any] = {"length/mean": float(tokens.mean()),
                           **{f"length/{k}": v for k, v in _quantiles(tokens.ravel()).items()},
                           "length/max": int(tokens.max()), "length/at_cap": float(at_cap.mean()),
                           "length/member_mean": [round(float(x), 2) for x in tokens.mean(axis=1)],
                           "length/member_max": [int(x) for x in tokens.max(axis=1)],
                           "length/member_at_cap": [float(x) for x in at_cap.mean(axis=1)],
                           RESPONSES_KEY: tokens.tolist()}
    return out


def summary(rows: Iterable[dict[str, Any]], cap: int) -> dict[str, Any] | None:
    """The run's response lengths from its metrics rows: their distribution over every update, the
    share at the cap, and per update its mean, its share at the cap and its worst member's share
    (None when no update recorded lengths)."""
    per_update = [(int(r["step"]), np.asarray(r[RESPONSES_KEY], dtype=np.int64)) for r in rows if RESPONSES_KEY in r]
    if not per_update:
        return None
    every = np.concatenate([x.ravel() for _, x in per_update])
    return {"cap": int(cap), "updates": len(per_update), "responses": int(every.size),
            "mean": round(float(every.mean()), 2), **_quantiles(every), "max": int(every.max()),
            "at_cap": round(float((every >= cap).mean()), 6),
            "per_update": {"step": [s for s, _ in per_update],
                           "mean": [round(float(x.mean()), 2) for _, x in per_update],
                           "at_cap": [round(float((x >= cap).mean()), 6) for _, x in per_update],
                           "worst_member_at_cap": [round(float((x >= cap).mean(axis=1).max()), 6)
                                                   for _, x in per_update]}}


def record_in_manifest(run_dir: str | Path, cap: int) -> None:
    """Write :func:`summary` of RUN/metrics.jsonl into RUN/manifest.json as ``response_lengths``."""
    from esreason.io.atomic import atomic_write_json
    from esreason.io.manifest import MANIFEST_FILE
    from esreason.io.metrics import METRICS_FILE, read_metrics
    from esreason.io.verify import DamagedFile, read_json_object

    path = Path(run_dir) / MANIFEST_FILE
    try:
        manifest = read_json_object(path)
    except DamagedFile:
        return  # rebuilt on the next resume, which records the lengths again
    found = summary(read_metrics(Path(run_dir) / METRICS_FILE), cap)
    if found is None:
        return
    manifest[MANIFEST_KEY] = found
    atomic_write_json(path, manifest)


__all__ = ["MANIFEST_KEY", "RESPONSES_KEY", "length_metrics", "record_in_manifest", "summary"]
