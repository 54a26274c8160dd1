"""User-facing errors.

Anything raised as :class:`UserError` is printed by the CLI as a single line
(``esreason: error: ...``) with exit status 2 and no traceback. Raise it for bad
input (config keys, files, rows, values); let genuine bugs raise normally.

Two conditions of the machine rather than of the input are reported the same way
(docs/faults.md): :class:`DirectoryLocked` (another command writes the directory) and
:class:`DiskFull` (``ENOSPC``/``EDQUOT`` during a write).
"""

from __future__ import annotations


class UserError(Exception):
    """A problem with the user's input: message names the key, file, row or value."""


class DirectoryLocked(UserError):
    """Another process holds the exclusive lock of a directory this command would write
    (:mod:`esreason.io.lock`); the message names the directory and, where known, the holder."""


def _size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{n} bytes" if unit == "B" else f"{n} bytes ({value:.1f} {unit})"
        value /= 1024
    return f"{n} bytes"  # pragma: no cover


class DiskFull(UserError):
    """A write failed with ``ENOSPC`` or ``EDQUOT``: ``path`` (what was being written),
    ``attempted`` (bytes it tried to write, when known), ``free`` (bytes free on its file
    system after the failed write was cleaned up, when known)."""

    def __init__(self, path: object, attempted: int | None, free: int | None, *, quota: bool = False) -> None:
        self.path, self.attempted, self.free = path, attempted, free
        what = "disk quota exceeded" if quota else "disk full"
        tried = f"tried to write {_size(attempted)}" if attempted is not None else "a write failed"
        left = f"{_size(free)} free there" if free is not None else "free space unknown"
        super().__init__(f"{what} writing {path}: {tried}, {left}; no partial file was kept "
                         "(free space, then rerun the command; training: with --resume)")
