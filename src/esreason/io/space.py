"""Disk full is an error, not a traceback (docs/faults.md, "A full disk").

:func:`is_disk_full` recognises ``ENOSPC``/``EDQUOT`` wherever they surface: an ``OSError``
with that errno (Python file I/O), or a library error that only carries the text —
safetensors raises ``SafetensorError('Error while serializing: I/O error: No space left on
device (os error 28)')`` — anywhere in the exception's cause/context chain.
:func:`disk_full` builds the one-line :class:`esreason.errors.DiskFull` with the path, the
bytes the write tried to put there and the free space left on that file system.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
from pathlib import Path
from typing import Any, Iterable

from esreason.errors import DiskFull

DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
_MESSAGE = re.compile(r"No space left on device|Disk quota exceeded|"
                      rf"os error (?:{errno.ENOSPC}|{errno.EDQUOT})\b|\[Errno (?:{errno.ENOSPC}|{errno.EDQUOT})\]")
_QUOTA = re.compile(rf"Disk quota exceeded|os error {errno.EDQUOT}\b|\[Errno {errno.EDQUOT}\]")


def _chain(exc: BaseException) -> Iterable[BaseException]:
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen or len(seen) > 32:
            continue
        seen.add(id(e))
        yield e
        todo += [e.__cause__, e.__context__]


def is_disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` (or an exception in its cause/context chain) is ENOSPC or EDQUOT."""
    for e in _chain(exc):
        if isinstance(e, DiskFull):
            return True
        if isinstance(e, OSError) and e.errno in DISK_FULL_ERRNOS:
            return True
        if _MESSAGE.search(str(e)):
            return True
    return False


#: torch.save's failed write names no errno: "[enforce fail at inline_container.cc:...] unexpected pos ..."
_TORCH_WRITE = re.compile(r"inline_container\.cc|PytorchStreamWriter failed writing")
#: below this much free space a torch.save write failure is taken for a full disk
NEARLY_FULL = 1 << 20


def torch_write_on_full_disk(exc: BaseException, where: str | os.PathLike[str]) -> bool:
    """Whether ``exc`` is torch.save's errno-less write failure (TRL's ``optimizer.pt``, ...) while the file
    system of ``where`` has less than :data:`NEARLY_FULL` bytes free: a full disk in all but name."""
    if not any(_TORCH_WRITE.search(str(e)) for e in _chain(exc)):
        return False
    free = free_bytes(where)
    return free is not None and free < NEARLY_FULL


def find_disk_full(exc: BaseException) -> DiskFull | None:
    """The :class:`DiskFull` already raised somewhere in ``exc``'s chain, if any."""
    return next((e for e in _chain(exc) if isinstance(e, DiskFull)), None)


def _is_quota(exc: BaseException) -> bool:
    return any((isinstance(e, OSError) and e.errno == errno.EDQUOT) or bool(_QUOTA.search(str(e)))
               for e in _chain(exc))


def free_bytes(path: str | os.PathLike[str]) -> int | None:
    """Free bytes on the file system of ``path`` (its nearest existing ancestor); None if unknown."""
    p = Path(os.path.abspath(path))
    for candidate in (p, *p.parents):
        if candidate.exists():
            try:
                return shutil.disk_usage(candidate).free
            except OSError:
                return None
    return None


def disk_full(path: str | os.PathLike[str], attempted: int | None, exc: BaseException | None = None) -> DiskFull:
    """The one-line error for a failed write of ``attempted`` bytes to ``path`` (call it after
    the partial file is removed, so the free space reported is what the user has)."""
    return DiskFull(path, attempted, free_bytes(path), quota=exc is not None and _is_quota(exc))


def tensor_bytes(tensors: Iterable[Any]) -> int:
    """Bytes of the distinct tensors in ``tensors`` (tied weights once): what a safetensors file
    of them holds, without its small header."""
    sizes: dict[tuple[int, int], int] = {}
    for t in tensors:
        nbytes = int(t.numel()) * int(t.element_size())
        sizes[(int(t.data_ptr()), nbytes)] = nbytes
    return sum(sizes.values())


def directory_bytes(path: str | os.PathLike[str]) -> int:
    """Total size of the regular files under ``path`` (0 when it is missing)."""
    root = Path(path)
    if not root.is_dir():
        return 0
    total = 0
    for f in root.rglob("*"):
        try:
            if f.is_file() and not f.is_symlink():
                total += f.stat().st_size
        except OSError:
            continue
    return total


__all__ = ["DISK_FULL_ERRNOS", "NEARLY_FULL", "directory_bytes", "disk_full", "find_disk_full", "free_bytes",
           "is_disk_full", "tensor_bytes", "torch_write_on_full_disk"]
