"""The report's response lengths: every ES training stage's generated tokens per response and the
share that ran to ``max_new_tokens``, from the lengths each run records (:mod:`esreason.es_loop.lengths`).

These are the figures ``esreason experiment plan X --lengths EXP`` plans the decode and tail terms
with, instead of the table's assumed runaway share and lognormal tail (docs/planning.md).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

from esreason.report import markdown


def _es_stages(root: Path) -> Iterator[tuple[str, Path]]:
    """(label, run directory) of every ES training stage in ``experiment.json`` (seeds included)."""
    record = json.loads((root / "experiment.json").read_text())
    for name, m in record.get("methods", {}).items():
        runs = [("", m)] + [(f" (seed {s})", r) for s, r in (m.get("seeds") or {}).items()]
        for seed, run in runs:
            for t in run.get("training") or []:
                if t.get("method") == "es":
                    stage = "" if len(run["training"]) == 1 else f", {Path(t['metrics']).parent.name}"
                    yield f"{m.get('label', name)}{seed}{stage}", (root / t["metrics"]).parent


def _summary(run: Path) -> dict[str, Any] | None:
    """The run's ``response_lengths`` (its manifest, or computed from its metrics while it has none)."""
    from esreason.es_loop.lengths import MANIFEST_KEY, summary
    from esreason.io.metrics import read_metrics

    manifest = run / "manifest.json"
    if manifest.is_file():
        found = json.loads(manifest.read_text()).get(MANIFEST_KEY)
        if found is not None:
            return found
    config = run / "config.yaml"
    if not (run / "metrics.jsonl").is_file() or not config.is_file():
        return None
    import yaml

    cap = int((yaml.safe_load(config.read_text()).get("generation") or {}).get("max_new_tokens", 0)) or None
    return summary(read_metrics(run / "metrics.jsonl"), cap) if cap else None


def lengths_md(root: Path) -> list[str]:
    """The report section: per ES training stage, its response lengths and share at the cap."""
    head = ["## Response lengths during training", ""]
    rows = []
    for label, run in _es_stages(root):
        s = _summary(run)
        if s is None:
            rows.append([label] + ["—"] * 9)
            continue
        per = s["per_update"]
        rows.append([label, f"{s['cap']:,}", f"{s['responses']:,}", f"{s['mean']:.1f}", str(s["p50"]), str(s["p90"]),
                     str(s["p99"]), str(s["max"]), f"{100 * s['at_cap']:.2f} %",
                     f"{100 * max(per['at_cap']):.1f} % / {100 * max(per['worst_member_at_cap']):.1f} %"])
    if not rows:
        return head + ["_No ES training stage._", ""]
    header = ["ES stage", "cap", "responses", "mean", "p50", "p90", "p99", "max", "at the cap",
              "worst update / member at the cap"]
    return head + ["Generated tokens per response of every ES update (all members and prompts; `length/*` in each "
                   "run's metrics.jsonl, `response_lengths` in its manifest). At the cap: the responses that ran to "
                   "`max_new_tokens` without a stop token; a synchronous call waits for them. `esreason experiment plan "
                   "X --lengths EXP` plans with these lengths instead of the assumed ones.", "",
                   markdown.simple_markdown(header, rows), ""]


__all__ = ["lengths_md"]
