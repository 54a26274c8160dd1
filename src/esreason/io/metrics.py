"""RUN/metrics.jsonl (append-only, one JSON object per line, flushed per line) + TensorBoard.

A crash can leave at most one torn (partial, newline-less) last line, because each row
is written with a single ``write`` of ``json + "\\n"`` followed by a flush. Readers and the
logger tolerate exactly that; any other unreadable line is corruption and raises
:class:`UserError` naming the file and line.

Resume contract: a run resumed from checkpoint step S calls ``truncate_metrics(path, S)``
(or opens ``MetricsLogger(run_dir, truncate_after=S)``), so rows logged after the
checkpoint are dropped and the resumed run's file equals the uninterrupted run's, byte for
byte. The same S purges the TensorBoard events after S (``SummaryWriter(purge_step=S+1)``).
"""

from __future__ import annotations

import json
import numbers
import os
from pathlib import Path
from typing import Any

from esreason.errors import UserError
from esreason.io.atomic import atomic_write_text, to_json

METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"


def _split_rows(path: Path) -> tuple[list[tuple[str, dict[str, Any]]], bool]:
    """Parse ``path`` into (original line text, row) pairs; second value: a torn tail was dropped.

    The last line is "torn" when it has no trailing newline and does not parse to an
    object; a newline-less last line that parses is kept (its newline was all that was lost).
    """
    text = path.read_text(encoding="utf-8")
    lines = text.split("\n")
    tail = lines.pop()  # "" when the file ends with a newline
    rows: list[tuple[str, dict[str, Any]]] = []
    for i, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise UserError(f"{path}:{i}: not a JSON line ({e.msg}); the metrics file is corrupt") from None
        if not isinstance(row, dict) or not isinstance(row.get("step"), int):
            raise UserError(f"{path}:{i}: expected an object with an integer 'step', got {line[:80]!r}")
        rows.append((line, row))
    torn = False
    if tail.strip():
        try:
            row = json.loads(tail)
        except json.JSONDecodeError:
            row = None
        if isinstance(row, dict) and isinstance(row.get("step"), int):
            rows.append((tail, row))
        else:
            torn = True
    return rows, torn


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """All rows of a metrics file, in file order; [] when the file does not exist.

    A torn last line is skipped; any other bad line raises :class:`UserError`.
    """
    p = Path(path)
    if not p.exists():
        return []
    return [row for _, row in _split_rows(p)[0]]


def truncate_metrics(path: str | Path, max_step: int) -> int:
    """Keep only rows with ``step <= max_step`` (original bytes kept), drop a torn last line.

    Rewrites the file atomically; a missing file is left missing. Returns the number of
    rows dropped (a torn line counts as one).
    """
    p = Path(path)
    if not p.exists():
        return 0
    rows, torn = _split_rows(p)
    kept = [line for line, row in rows if row["step"] <= max_step]
    text = "".join(line + "\n" for line in kept)
    if text.encode("utf-8") != p.read_bytes():
        atomic_write_text(p, text)
    return len(rows) - len(kept) + int(torn)


def _repair_tail(path: Path) -> None:
    """Before appending: end the file with a newline, dropping a torn partial last line."""
    if not path.exists() or path.stat().st_size == 0:
        return
    with open(path, "rb") as fh:
        fh.seek(-1, os.SEEK_END)
        if fh.read(1) == b"\n":
            return
    rows, _ = _split_rows(path)
    atomic_write_text(path, "".join(line + "\n" for line, _ in rows))


def _scalar(value: Any) -> float | None:
    """The float TensorBoard should get for ``value``, or None for non-numeric values."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return None
    if isinstance(value, numbers.Real):
        return float(value)
    item, shape = getattr(value, "item", None), getattr(value, "shape", None)
    if callable(item) and shape is not None and tuple(shape) == ():
        v = item()
        return float(v) if isinstance(v, numbers.Real) and not isinstance(v, bool) else None
    return None


class MetricsLogger:
    """Append ``{"step": step, **metrics}`` rows to RUN/metrics.jsonl and scalars to TensorBoard.

    ``log`` writes one line and flushes it (a crash loses at most the row being written).
    Numeric values (int, float, numpy/torch scalars; not bools) also go to TensorBoard
    (RUN/tensorboard, ``torch.utils.tensorboard`` imported only when enabled), flushed per
    call; strings, bools and None go to the JSONL file only. Non-finite floats are kept.

    ``truncate_after=S`` (resume from checkpoint S) first drops rows with step > S from the
    file and tells TensorBoard to hide its events after S.

    Usage::

        with MetricsLogger(run_dir) as logger:
            logger.log(step, {"reward/mean": 0.42, "lr": 1e-3, "note": "warmup"})
    """

    def __init__(self, run_dir: str | Path, *, tensorboard: bool = True,
                 truncate_after: int | None = None) -> None:
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / METRICS_FILE
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if truncate_after is not None:
            truncate_metrics(self.path, truncate_after)
        _repair_tail(self.path)
        self._fh = open(self.path, "a", encoding="utf-8")
        self._tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            purge = None if truncate_after is None else max(truncate_after + 1, 0)
            self._tb = SummaryWriter(log_dir=str(self.run_dir / TENSORBOARD_DIR), purge_step=purge)

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        """Write one row. Keys must be strings other than "step"; values JSON-serialisable."""
        if isinstance(step, bool) or not isinstance(step, numbers.Integral):
            raise TypeError(f"step must be an int, got {step!r}")
        bad = [k for k in metrics if not isinstance(k, str) or k == "step"]
        if bad:
            raise ValueError(f"metric keys must be strings other than 'step': {bad!r}")
        if self._fh.closed:
            raise ValueError(f"MetricsLogger for {self.path} is closed")
        step = int(step)
        line = to_json({"step": step, **metrics})
        self._fh.write(line + "\n")
        self._fh.flush()
        if self._tb is not None:
            for key, value in metrics.items():
                v = _scalar(value)
                if v is not None:
                    self._tb.add_scalar(key, v, global_step=step)
            self._tb.flush()

    def fsync(self) -> None:
        """Force the metrics file to disk (e.g. right before writing a checkpoint)."""
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def close(self) -> None:
        if not self._fh.closed:
            self._fh.close()
        if self._tb is not None:
            self._tb.close()
            self._tb = None

    def __enter__(self) -> "MetricsLogger":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["METRICS_FILE", "TENSORBOARD_DIR", "MetricsLogger", "read_metrics", "truncate_metrics"]
