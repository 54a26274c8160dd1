"""Atomic writes: a reader (or a resumed run) never sees a half-written file or checkpoint.

Every temporary entry is created *beside* its destination (same file system, so the final
``os.replace``/``rename`` is atomic) under the name ``.tmp-new-<pid>-<hex8>-<name>``; a
directory being replaced is moved aside as ``.tmp-old-<pid>-<hex8>-<name>`` and one being
deleted as ``.tmp-del-...`` (:func:`remove_directory`). Anything named ``.tmp-*`` is therefore
never a result: readers skip it and :func:`clean_stale_tmp` deletes
what a killed process left behind.

Not supported: two processes writing the same destination at the same time (the last
rename wins; both temporaries are cleaned up). Commands never do: each holds its output
directory's lock (:mod:`esreason.io.lock`).

A full disk (``ENOSPC``/``EDQUOT``, :mod:`esreason.io.space`) during any of these writes removes
the temporary and raises :class:`esreason.errors.DiskFull` (one line: the path, the bytes it
tried to write, the free space); the previous version of the destination is untouched.
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime as _dt
import enum
import errno
import json
import os
import re
import secrets
import shutil
import sys
import threading
from pathlib import Path
from typing import Any, Callable, Iterator

from esreason.io.space import directory_bytes, disk_full, find_disk_full, is_disk_full

TMP_PREFIX = ".tmp-"
COMPLETE_MARKER = "COMPLETE"

_TMP_NAME = re.compile(r"^\.tmp-(new|old|del)-(\d+)-([0-9a-f]{8})-(.+)$")
_in_flight: set[Path] = set()  # temporaries this process is writing right now (never "stale")
_in_flight_lock = threading.Lock()


def _tmp_sibling(final: Path, kind: str) -> Path:
    return final.parent / f"{TMP_PREFIX}{kind}-{os.getpid()}-{secrets.token_hex(4)}-{final.name}"


def _fsync_path(path: Path) -> None:
    """fsync a file or directory by path (directories: best effort, not every OS allows it)."""
    is_dir = path.is_dir()
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        if is_dir:
            return
        raise
    try:
        os.fsync(fd)
    except OSError:
        if not is_dir:
            raise
    finally:
        os.close(fd)


def _json_default(obj: Any) -> Any:
    """JSON for the values runs produce: paths, numpy/torch scalars and arrays, sets, dataclasses,
    enums, datetimes. Anything else raises TypeError (no silent ``str()`` of unknown objects)."""
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    if isinstance(obj, (set, frozenset)):
        return sorted(obj, key=repr)
    if hasattr(obj, "__dataclass_fields__") and not isinstance(obj, type):
        from dataclasses import asdict

        return asdict(obj)
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, (_dt.datetime, _dt.date)):
        return obj.isoformat()
    item, shape = getattr(obj, "item", None), getattr(obj, "shape", None)
    if callable(item) and shape is not None and tuple(shape) == ():  # numpy scalar, 0-d array/tensor
        return item()
    if callable(getattr(obj, "tolist", None)) and shape is not None:  # numpy array / tensor -> nested lists
        return obj.tolist()
    raise TypeError(f"object of type {type(obj).__name__} is not JSON serializable: {obj!r:.80}")


def to_json(obj: Any, *, indent: int | None = None) -> str:
    """``json.dumps`` with :func:`_json_default`. Non-finite floats are written as Python's
    ``NaN``/``Infinity`` tokens (read back by ``json.loads``), never silently dropped."""
    return json.dumps(obj, indent=indent, default=_json_default)


def atomic_save_figure(fig: Any, path: str | Path, *, dpi: int = 130) -> Path:
    """Render a matplotlib figure as PNG into ``path`` atomically, then close the figure.

    The PNG is rendered in memory and written with :func:`atomic_write_bytes`, so a
    reader never sees a half-written image and a failed render leaves no file.
    """
    import io

    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    try:
        fig.savefig(buf, dpi=dpi, bbox_inches="tight", format="png")
    finally:
        plt.close(fig)
    return atomic_write_bytes(path, buf.getvalue())


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to a temp file beside ``path``, flush + fsync, then ``os.replace``.

    The file gets the usual ``0o666 & ~umask`` permissions (not mkstemp's 0600).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp_sibling(path, "new")
    with _in_flight_lock:
        _in_flight.add(tmp)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(exc, Exception) and is_disk_full(exc):
            raise disk_full(path, len(data), exc) from exc
        raise
    finally:
        with _in_flight_lock:
            _in_flight.discard(tmp)
    _fsync_path(path.parent)
    return path


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Atomically write UTF-8 ``text`` to ``path`` (see :func:`atomic_write_bytes`)."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | Path, obj: Any) -> Path:
    """Atomically write ``obj`` as indented JSON (+ newline); see :func:`to_json` for types."""
    return atomic_write_text(path, to_json(obj, indent=2) + "\n")


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two existing paths (Linux ``renameat2(RENAME_EXCHANGE)``).

    Returns False where the call is unavailable (other OS, old libc, file system without
    support) so the caller can fall back to rename-aside.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    rc = renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), f"{a} <-> {b}")


@contextlib.contextmanager
def atomic_directory(final_dir: str | Path, *, marker: str | None = COMPLETE_MARKER,
                     marker_text: Callable[[Path], str] | None = None,
                     expected_bytes: int | None = None) -> Iterator[Path]:
    """Yield a fresh temp directory beside ``final_dir``; on clean exit it becomes ``final_dir``.

    On clean exit: every file is fsynced, the ``marker`` file (default ``COMPLETE``) is
    written *last*, directories are fsynced, and the temp directory is renamed into place.
    An existing ``final_dir`` is swapped out atomically where the OS allows
    (``renameat2(RENAME_EXCHANGE)`` on Linux) and otherwise renamed aside first; the old
    copy is deleted afterwards. Readers see either the old or the new complete directory.

    ``marker_text(tmp)``: the marker's content, computed after every other file is written
    (checkpoints pass :func:`esreason.io.verify.checksum_manifest`: the sha256 of every file).

    ``expected_bytes``: about how much the body writes (a checkpoint: its tensors), reported when
    the disk fills (:class:`esreason.errors.DiskFull`; otherwise the bytes written before it did).

    On an exception (including KeyboardInterrupt) the temp directory is removed and the
    exception propagates. A killed process leaves only a ``.tmp-*`` directory, which
    :class:`esreason.io.RunDir` ignores and :func:`clean_stale_tmp` deletes.
    """
    final = Path(final_dir)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp_sibling(final, "new")
    os.mkdir(tmp, 0o777)  # umask applies (mkdtemp would make it 0700)
    with _in_flight_lock:
        _in_flight.add(tmp)
    try:
        yield tmp
        files = [p for p in tmp.rglob("*") if p.is_file() and not p.is_symlink()]
        for f in files:
            _fsync_path(f)
        if marker is not None:
            text = marker_text(tmp) if marker_text is not None else "complete\n"
            with open(tmp / marker, "w", encoding="utf-8") as fh:
                fh.write(text)
                fh.flush()
                os.fsync(fh.fileno())
        for d in sorted((p for p in tmp.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
            _fsync_path(d)
        _fsync_path(tmp)
        if final.exists() or final.is_symlink():
            if _exchange(tmp, final):
                old = tmp  # after the swap the temp name holds the previous directory
            else:
                old = _tmp_sibling(final, "old")
                os.replace(final, old)
                try:
                    os.replace(tmp, final)
                except BaseException:
                    os.replace(old, final)  # put the previous complete copy back
                    raise
            _fsync_path(final.parent)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
            _fsync_path(final.parent)
    except BaseException as exc:
        written = directory_bytes(tmp) if isinstance(exc, Exception) and is_disk_full(exc) else 0
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, Exception) and is_disk_full(exc) and find_disk_full(exc) is None:
            raise disk_full(final, max(expected_bytes or 0, written) or None, exc) from exc
        raise
    finally:
        with _in_flight_lock:
            _in_flight.discard(tmp)


def remove_directory(path: str | Path) -> None:
    """Delete a directory so that no reader ever sees it half deleted.

    It is first renamed to ``.tmp-del-*`` (atomic), then removed; a crash in between leaves
    only a ``.tmp-*`` entry for :func:`clean_stale_tmp`. A missing ``path`` is a no-op.
    """
    path = Path(path)
    if not path.exists():
        return
    doomed = _tmp_sibling(path, "del")
    os.replace(path, doomed)
    shutil.rmtree(doomed, ignore_errors=True)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return False
    return True


def clean_stale_tmp(parent: str | Path) -> list[Path]:
    """Remove ``.tmp-*`` entries in ``parent`` left by killed writers; return what was removed.

    Skipped: temporaries this process is writing now, and those whose writer pid is still
    alive on this host (a pid reused by an unrelated process only delays the clean-up; a
    deleted live temp dir would crash its writer). A ``.tmp-old-*`` directory whose
    destination is missing (a crash between the two renames of the fallback replace path)
    is renamed back instead of deleted, so the previous complete copy is not lost.
    Entries named ``.tmp-*`` in another format are removed unconditionally.
    """
    parent = Path(parent)
    removed: list[Path] = []
    if not parent.is_dir():
        return removed
    with _in_flight_lock:
        mine = set(_in_flight)
    for entry in sorted(parent.iterdir()):
        if not entry.name.startswith(TMP_PREFIX) or entry in mine:
            continue
        m = _TMP_NAME.match(entry.name)
        if m:
            pid = int(m.group(2))
            if pid != os.getpid() and _pid_alive(pid):
                continue
            dest = parent / m.group(4)
            if m.group(1) == "old" and entry.is_dir() and not (dest.exists() or dest.is_symlink()):
                os.replace(entry, dest)
                continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                entry.unlink()
        removed.append(entry)
    return removed


__all__ = ["COMPLETE_MARKER", "TMP_PREFIX", "atomic_directory", "atomic_write_bytes", "atomic_write_json",
           "atomic_write_text", "clean_stale_tmp", "remove_directory", "to_json"]
