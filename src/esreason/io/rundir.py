"""The run-directory layout (DESIGN §1)."""

from __future__ import annotations

import re
from pathlib import Path

from esreason.io.atomic import COMPLETE_MARKER, TMP_PREFIX
from esreason.io.manifest import MANIFEST_FILE
from esreason.io.metrics import METRICS_FILE

_STEP_DIR = re.compile(r"^step_(\d+)$")


class RunDir:
    """RUN/{manifest.json, metrics.jsonl, tensorboard/, checkpoints/step_N/, eval/, plots/}."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    @property
    def metrics_path(self) -> Path:
        return self.path / METRICS_FILE

    @property
    def manifest_path(self) -> Path:
        return self.path / MANIFEST_FILE

    @property
    def checkpoints_dir(self) -> Path:
        return self.path / "checkpoints"

    def checkpoint_path(self, step: int) -> Path:
        return self.checkpoints_dir / f"step_{int(step)}"

    def list_checkpoints(self) -> list[tuple[int, Path]]:
        """Complete checkpoints (with the COMPLETE marker), oldest first; .tmp-* ignored."""
        if not self.checkpoints_dir.is_dir():
            return []
        found = []
        for entry in self.checkpoints_dir.iterdir():
            m = _STEP_DIR.match(entry.name)
            if m and not entry.name.startswith(TMP_PREFIX) and (entry / COMPLETE_MARKER).is_file():
                found.append((int(m.group(1)), entry))
        return sorted(found)

    def latest_checkpoint(self) -> tuple[int, Path] | None:
        ckpts = self.list_checkpoints()
        return ckpts[-1] if ckpts else None
