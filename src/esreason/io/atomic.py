"""Atomic writes: a reader (or a resumed run) never sees a half-written file or checkpoint."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator

TMP_PREFIX = ".tmp-"


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write ``text`` to a temp file beside ``path``, fsync, then os.replace."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=TMP_PREFIX + path.name + ".", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


def atomic_write_json(path: str | Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")


@contextlib.contextmanager
def atomic_directory(final_dir: str | Path) -> Iterator[Path]:
    """Yield a temp directory beside ``final_dir``; on success it becomes ``final_dir``.

    Files are fsynced, a ``COMPLETE`` marker is written last, and the directory is
    renamed into place. An existing ``final_dir`` is first renamed aside and deleted
    afterwards. On an exception the temp directory is removed; a killed process leaves
    only a ``.tmp-*`` directory, which :func:`clean_stale_tmp` removes and readers ignore.
    """
    final = Path(final_dir)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{final.name}-", dir=final.parent))
    try:
        yield tmp
        (tmp / COMPLETE_MARKER).write_text("ok\n")
        for f in tmp.rglob("*"):
            if f.is_file():
                with open(f, "rb") as fh:
                    os.fsync(fh.fileno())
        old = None
        if final.exists():
            old = final.parent / f"{TMP_PREFIX}old-{final.name}-{os.getpid()}"
            os.replace(final, old)
        os.replace(tmp, final)
        _fsync_dir(final.parent)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


COMPLETE_MARKER = "COMPLETE"


def clean_stale_tmp(parent: str | Path) -> list[Path]:
    """Remove leftover ``.tmp-*`` entries in ``parent`` (from killed writes); returns them."""
    removed = []
    parent = Path(parent)
    if not parent.is_dir():
        return removed
    for entry in parent.iterdir():
        if entry.name.startswith(TMP_PREFIX):
            if entry.is_dir():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                with contextlib.suppress(FileNotFoundError):
                    entry.unlink()
            removed.append(entry)
    return removed
