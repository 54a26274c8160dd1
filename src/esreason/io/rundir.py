"""The run-directory layout (DESIGN §1)::

    RUN/
      manifest.json  metrics.jsonl  tensorboard/  checkpoints/step_N/  eval/<suite>/  plots/  report.md

:class:`RunDir` only names paths and finds checkpoints; it creates nothing itself. The
sub-directories appear lazily when something is written into them (``atomic_directory``,
``atomic_write_*`` and ``MetricsLogger`` create missing parents), so inspecting a run
never modifies it.

A checkpoint counts only when it is complete: a ``checkpoints/step_N`` directory (N
written without leading zeros) holding the ``COMPLETE`` marker that
:func:`esreason.io.atomic_directory` writes last. ``.tmp-*`` leftovers of killed writes
and unmarked directories are ignored, and so is ``.esreason-lock`` (the one-writer lock of
:mod:`esreason.io.lock`; a killed command may leave the file behind, meaning nothing).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from esreason.errors import UserError
from esreason.io.atomic import COMPLETE_MARKER, remove_directory
from esreason.io.manifest import MANIFEST_FILE
from esreason.io.metrics import METRICS_FILE, TENSORBOARD_DIR

_STEP_DIR = re.compile(r"^step_(0|[1-9][0-9]*)$")


class RunDir:
    """Paths of one run directory and its complete checkpoints."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def __fspath__(self) -> str:
        return os.fspath(self.path)

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    @property
    def metrics_path(self) -> Path:
        return self.path / METRICS_FILE

    @property
    def manifest_path(self) -> Path:
        return self.path / MANIFEST_FILE

    @property
    def tensorboard_dir(self) -> Path:
        return self.path / TENSORBOARD_DIR

    @property
    def checkpoints_dir(self) -> Path:
        return self.path / "checkpoints"

    @property
    def eval_dir(self) -> Path:
        return self.path / "eval"

    @property
    def plots_dir(self) -> Path:
        return self.path / "plots"

    @property
    def report_path(self) -> Path:
        return self.path / "report.md"

    def eval_suite_dir(self, suite: str) -> Path:
        """``RUN/eval/<suite>``; the suite name must be a single path component."""
        if not suite or suite in (".", "..") or "/" in suite or "\\" in suite or suite.startswith("."):
            raise UserError(f"eval suite name {suite!r} cannot be used as a directory name")
        return self.eval_dir / suite

    def checkpoint_path(self, step: int) -> Path:
        """``RUN/checkpoints/step_{step}`` (whether or not it exists)."""
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"checkpoint step must be a non-negative int, got {step!r}")
        return self.checkpoints_dir / f"step_{step}"

    def list_checkpoints(self) -> list[tuple[int, Path]]:
        """Complete checkpoints as (step, path), lowest step first."""
        if not self.checkpoints_dir.is_dir():
            return []
        found = []
        for entry in self.checkpoints_dir.iterdir():
            m = _STEP_DIR.match(entry.name)
            if m and entry.is_dir() and (entry / COMPLETE_MARKER).is_file():
                found.append((int(m.group(1)), entry))
        return sorted(found)

    def latest_checkpoint(self) -> tuple[int, Path] | None:
        """The complete checkpoint with the highest step, or None."""
        ckpts = self.list_checkpoints()
        return ckpts[-1] if ckpts else None

    def prune_checkpoints(self, keep_last: int) -> list[Path]:
        """Delete all but the ``keep_last`` newest complete checkpoints; returns the deleted paths.

        Each is renamed to ``.tmp-del-*`` before removal, so a crash never leaves a
        half-deleted directory that still carries its ``COMPLETE`` marker.
        """
        if isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 1:
            raise ValueError(f"keep_last must be an int >= 1, got {keep_last!r}")
        doomed = [path for _, path in self.list_checkpoints()[:-keep_last]]
        for path in doomed:
            remove_directory(path)
        return doomed


__all__ = ["RunDir"]
