"""RUN/metrics.jsonl (append-only, one JSON object per line, flushed per line) + TensorBoard.

A crash can leave at most one torn (partial, newline-less) last line, because each row
is written with a single ``write`` of ``json + "\\n"`` followed by a flush. Readers and the
logger tolerate exactly that; any other unreadable line is corruption and raises
:class:`UserError` naming the file and line.

Resume contract: a run resumed from checkpoint step S calls ``truncate_metrics(path, S)``
(or opens ``MetricsLogger(run_dir, truncate_after=S)``), so rows logged after the
checkpoint are dropped and the resumed run's file equals the uninterrupted run's, byte for
byte. The same S purges the TensorBoard events after S (``SummaryWriter(purge_step=S+1)``).
On resume, damaged lines (not UTF-8 JSON rows: a zero-filled or garbled file) are dropped too,
and one warning names the file and the updates whose rows are missing (docs/faults.md).
"""

from __future__ import annotations

import contextlib
import json
import numbers
import os
import time
from pathlib import Path
from typing import Any

from esreason.errors import UserError
from esreason.io.atomic import atomic_write_text, to_json

METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"


def _parse_line(raw: bytes) -> dict[str, Any] | None:
    """The row of one line, or None when it is not UTF-8 JSON of an object with an integer 'step'."""
    try:
        row = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    return row if isinstance(row, dict) and isinstance(row.get("step"), int) else None


def _split_rows(path: Path, lenient: bool = False) -> tuple[list[tuple[str, dict[str, Any]]], bool, int]:
    """Parse ``path`` into (original line text, row) pairs, whether a torn tail was dropped, and
    how many damaged lines were dropped (``lenient``; otherwise a damaged line raises UserError).

    The last line is "torn" when it has no trailing newline and does not parse to an
    object; a newline-less last line that parses is kept (its newline was all that was lost).
    """
    lines = path.read_bytes().split(b"\n")
    tail = lines.pop()  # b"" when the file ends with a newline
    rows: list[tuple[str, dict[str, Any]]] = []
    bad = 0
    for i, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        row = _parse_line(line)
        if row is None:
            if lenient:
                bad += 1
                continue
            raise UserError(f"{path}:{i}: expected an object with an integer 'step', got {line[:60]!r}; "
                            "the metrics file is corrupt (a resumed run drops such lines)")
        rows.append((line.decode("utf-8"), row))
    torn = False
    if tail.strip():
        row = _parse_line(tail)
        if row is not None:
            rows.append((tail.decode("utf-8"), row))
        else:
            torn = True
    return rows, torn, bad


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """All rows of a metrics file, in file order; [] when the file does not exist.

    A torn last line is skipped; any other bad line raises :class:`UserError`.
    """
    p = Path(path)
    if not p.exists():
        return []
    return [row for _, row in _split_rows(p)[0]]


def truncate_metrics(path: str | Path, max_step: int, *, lenient: bool = False) -> int:
    """Keep only rows with ``step <= max_step`` (original bytes kept), drop a torn last line.

    ``lenient``: damaged lines (not UTF-8 JSON rows) are dropped too instead of raising.
    Rewrites the file atomically; a missing file is left missing. Returns the number of
    rows dropped (a torn or damaged line counts as one).
    """
    p = Path(path)
    if not p.exists():
        return 0
    rows, torn, bad = _split_rows(p, lenient)
    kept = [line for line, row in rows if row["step"] <= max_step]
    text = "".join(line + "\n" for line in kept)
    if text.encode("utf-8") != p.read_bytes():
        atomic_write_text(p, text)
    return len(rows) - len(kept) + int(torn) + bad


def append_line(fh: Any, path: Path, line: str) -> None:
    """Append ``line`` + newline to the unbuffered binary file ``fh`` (``path``) with as few writes
    as the OS allows. On a full disk the file is cut back to its previous size (no partial row)
    and :class:`esreason.errors.DiskFull` names it."""
    from esreason.io.space import disk_full, is_disk_full

    data = (line + "\n").encode("utf-8")
    start = fh.seek(0, os.SEEK_END)
    try:
        view = memoryview(data)
        while view:
            n = fh.write(view)
            view = view[n:]
    except OSError as exc:
        if not is_disk_full(exc):
            raise
        with contextlib.suppress(OSError):
            os.ftruncate(fh.fileno(), start)
        raise disk_full(path, len(data), exc) from exc


def _repair_tail(path: Path) -> None:
    """Before appending: end the file with a newline, dropping a torn partial last line."""
    if not path.exists() or path.stat().st_size == 0:
        return
    with open(path, "rb") as fh:
        fh.seek(-1, os.SEEK_END)
        if fh.read(1) == b"\n":
            return
    rows, _, _ = _split_rows(path)
    atomic_write_text(path, "".join(line + "\n" for line, _ in rows))


def _warn_missing_rows(path: Path, last_step: int) -> None:
    """On resume: one warning naming the file when rows of updates 1..last_step are missing (damage)."""
    from esreason.io.verify import warn

    have = {row["step"] for _, row in _split_rows(path)[0]} if path.exists() else set()
    missing = [s for s in range(1, last_step + 1) if s not in have]
    if missing:
        span = f"{missing[0]}" if len(missing) == 1 else f"{missing[0]}..{missing[-1]}"
        warn(f"{path}: the rows of {len(missing)} update(s) ({span}) are missing or damaged; "
             "training continues without them")


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


def _after_existing_event_files(tb_dir: Path) -> None:
    """Wait (at most ~1 s) until a new event file's name sorts after every existing one.

    TensorBoard reads a directory's event files in name order and applies ``purge_step`` to
    the events it has read before the purging file. Names are
    ``events.out.tfevents.<10-digit second>.<host>.<pid>.<counter>``: within one second the
    order falls to the pid and a per-process counter compared as text (".10" before ".9"), so
    a writer opened in the same second as an earlier one (a resume right after a stop, or many
    runs in one process, as in our test suite) could be read first and its purge lost. A new
    second puts the new file last.
    """
    if not tb_dir.is_dir():
        return
    seconds = []
    for f in tb_dir.glob("events.out.tfevents.*"):
        part = f.name.split(".")[3]
        if part.isdigit():
            seconds.append(int(part))
    if not seconds:
        return
    newest = max(seconds)
    if newest > time.time() + 2:          # written under another clock: waiting cannot help
        return
    while int(time.time()) <= newest:
        time.sleep(min(1.0, newest + 1 - time.time() + 1e-3))


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
            truncate_metrics(self.path, truncate_after, lenient=True)
            _warn_missing_rows(self.path, truncate_after)
        _repair_tail(self.path)
        self._fh = open(self.path, "ab", buffering=0)  # one os.write per row: a failed one is cut back
        self._tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            purge = None if truncate_after is None else max(truncate_after + 1, 0)
            _after_existing_event_files(self.run_dir / TENSORBOARD_DIR)
            self._tb = SummaryWriter(log_dir=str(self.run_dir / TENSORBOARD_DIR), purge_step=purge)

    def log(self, step: int, metrics: dict[str, Any], *, report: bool = True) -> None:
        """Write one row. Keys must be strings other than "step"; values JSON-serialisable.
        ``report=False``: metrics.jsonl only, not TensorBoard (``logging.logging_steps``)."""
        if isinstance(step, bool) or not isinstance(step, numbers.Integral):
            raise TypeError(f"step must be an int, got {step!r}")
        bad = [k for k in metrics if not isinstance(k, str) or k == "step"]
        if bad:
            raise ValueError(f"metric keys must be strings other than 'step': {bad!r}")
        if self._fh.closed:
            raise ValueError(f"MetricsLogger for {self.path} is closed")
        step = int(step)
        append_line(self._fh, self.path, to_json({"step": step, **metrics}))
        if self._tb is not None and report:
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

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None:
            self.close()
            return
        with contextlib.suppress(Exception):  # e.g. TensorBoard's flush on a full disk: keep the first error
            self.close()


__all__ = ["METRICS_FILE", "TENSORBOARD_DIR", "MetricsLogger", "read_metrics", "truncate_metrics"]
