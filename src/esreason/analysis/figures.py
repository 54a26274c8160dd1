"""Shared figure plumbing of the analysis commands: matplotlib on the Agg backend, atomic PNG writes.

Every analysis figure module (weights, estimator, coverage) imports ``plt`` from here, so
the backend is selected once before pyplot loads, and saves with :func:`save_figure`.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from esreason.io import atomic_save_figure  # noqa: E402


def save_figure(fig, path: str | Path) -> Path:
    """Write ``fig`` to ``path`` atomically (a killed write leaves no partial PNG); returns the path."""
    return atomic_save_figure(fig, path)


__all__ = ["plt", "save_figure"]
