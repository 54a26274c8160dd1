"""metrics.jsonl (append-only, one JSON object per line, flushed per line) + TensorBoard."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from esreason.io.atomic import atomic_write_text

METRICS_FILE = "metrics.jsonl"


class MetricsLogger:
    """``log(step, {...})`` appends ``{"step": step, ...}`` to RUN/metrics.jsonl and the
    numeric values to TensorBoard under RUN/tensorboard."""

    def __init__(self, run_dir: str | Path, *, tensorboard: bool = True) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._fh = open(self.run_dir / METRICS_FILE, "a", encoding="utf-8")
        self._tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(self.run_dir / "tensorboard"))

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        row = {"step": int(step), **metrics}
        self._fh.write(json.dumps(row, default=float) + "\n")
        self._fh.flush()
        if self._tb is not None:
            for key, value in metrics.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                    self._tb.add_scalar(key, value, global_step=int(step))
            self._tb.flush()

    def close(self) -> None:
        self._fh.close()
        if self._tb is not None:
            self._tb.close()

    def __enter__(self) -> "MetricsLogger":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """All complete lines of a metrics file (a torn last line is skipped)."""
    rows = []
    p = Path(path)
    if not p.exists():
        return rows
    for line in p.read_text(encoding="utf-8").splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def truncate_metrics(path: str | Path, max_step: int) -> None:
    """Keep only rows with step <= max_step (and drop a torn last line), atomically."""
    rows = [r for r in read_metrics(path) if int(r.get("step", -1)) <= max_step]
    atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in rows))
