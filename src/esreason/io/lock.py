"""One writer per directory: an OS-level advisory lock held for the whole command (docs/faults.md).

Every command that writes a directory — a training run (ES, GRPO, each stage of a composition),
an evaluation directory, an experiment or sweep directory, an analysis output — takes the
exclusive lock of that directory before its first write and holds it to the end::

    with directory_lock(out, what="run directory"):
        ...  # check, then write

The lock is ``fcntl.flock(LOCK_EX | LOCK_NB)`` on the file :data:`LOCK_FILE` inside the
directory. A second writer fails at once with :class:`esreason.errors.DirectoryLocked` (the CLI:
one line, exit 2) naming the directory and, where known, the holder's pid, host and command,
which the holder writes into the lock file after acquiring it. The kernel drops a flock when
its process dies, so a killed run never blocks the next one; its lock file may stay behind and
means nothing (every reader of run directories ignores :data:`LOCK_FILE`).

Re-entry: a process that holds a directory's lock and asks for it again (a sequence running
its stages in-process, an experiment evaluating into a directory it owns) gets it at once; the
lock is released when the outermost holder leaves. A directory below a held one takes its own
lock. Forked children do not inherit the lock (their copies of the descriptors are closed at
fork); spawned processes (accelerate workers, Ray actors) do not take it: only the process
that owns the directory (rank 0, the driver) does.

On release the holder deletes the lock file while still holding the lock, and removes the
directory when it created it and nothing else was written (a command refused before its first
write leaves no trace). Deleting is safe because an acquirer re-checks, after ``flock``
succeeds, that the path still names the file it locked (same device and inode) and starts over
otherwise — the standard protocol for lock files that may be unlinked.

Where the file system does not support ``flock`` (``ENOLCK``/``EOPNOTSUPP``/``ENOSYS``: NFS
mounted with ``nolock`` or without a lock manager, some FUSE file systems), the command warns
once and runs unlocked.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import json
import os
import socket
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from esreason.errors import DirectoryLocked, UserError

try:  # POSIX only; elsewhere the lock is a no-op with one warning
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

LOCK_FILE = ".esreason-lock"
_UNSUPPORTED = frozenset({errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS})
_RETRIES = 50


@dataclass
class _Held:
    fd: int | None  # None: the file system gave no lock (warned), re-entry still counted
    count: int
    created: bool
    lock_path: Path


_held: dict[str, _Held] = {}
_registry_lock = threading.RLock()
_warned: set[str] = set()


def _key(path: Path) -> str:
    return os.path.realpath(path)


def held_directories() -> list[Path]:
    """Directories whose lock this process holds now (outermost first)."""
    with _registry_lock:
        return [Path(k) for k in _held]


def _holder_text() -> str:
    cmd = " ".join(os.path.basename(a) if i == 0 else a for i, a in enumerate(sys.argv[:4]))
    return json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "command": cmd,
                       "since": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}) + "\n"


def _describe_holder(fd: int) -> str:
    """'held by pid P on host H (command C, since T)', or a vaguer phrase when the file says nothing yet."""
    info = None
    # The holder writes its record right after flock: a racing loser waits for it, up to 2 s (a loaded
    # machine may deschedule the holder between the two for a few hundred ms; only a refusal waits).
    for _ in range(200):
        try:
            info = json.loads(os.pread(fd, 4096, 0).decode("utf-8"))
            break
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            time.sleep(0.01)
    if info is None:
        return "held by another process (pid not recorded)"
    if not isinstance(info, dict):
        return "held by another process"
    parts = [f"pid {info.get('pid')}", f"on host {info.get('host')}"]
    extra = [x for x in (f"'{info['command']}'" if info.get("command") else "",
                         f"since {info['since']}" if info.get("since") else "") if x]
    return "held by " + " ".join(parts) + (f" ({', '.join(extra)})" if extra else "")


def _warn_unsupported(directory: Path, exc: OSError) -> None:
    from esreason.io.verify import warn

    key = str(directory)
    if key not in _warned:
        _warned.add(key)
        warn(f"cannot lock {directory} ({exc.strerror or exc}): this file system does not support flock; "
             "running without the one-writer guard, so do not start a second command on this directory")


def _acquire(directory: Path, what: str) -> _Held:
    """Take the lock of ``directory`` (created when missing); DirectoryLocked when another process holds it."""
    lock_path = directory / LOCK_FILE
    created = False
    for _ in range(_RETRIES):
        try:
            directory.mkdir(parents=True)
            created = True
        except FileExistsError:
            if not directory.is_dir():
                raise UserError(f"{what} {directory} exists and is not a directory") from None
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o666)
        except FileNotFoundError:
            continue  # an empty directory was removed by its releasing holder in between: start over
        if fcntl is None:  # pragma: no cover - Windows
            return _Held(fd, 1, created, lock_path)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _describe_holder(fd)
            os.close(fd)
            raise DirectoryLocked(f"{what} {directory} is in use: its lock ({lock_path.name}) is {holder}; "
                                  "one command writes a directory at a time: wait for it to finish, "
                                  "or choose another output directory") from None
        except OSError as exc:
            os.close(fd)
            if exc.errno in _UNSUPPORTED:
                _warn_unsupported(directory, exc)
                return _Held(None, 1, created, lock_path)
            raise
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(lock_path))
        except FileNotFoundError:
            same = False
        if not same:  # the file we locked was unlinked by a releasing holder: lock the new one
            os.close(fd)
            continue
        with contextlib.suppress(OSError):  # only for the message; a full disk must not stop the lock
            os.ftruncate(fd, 0)
            os.pwrite(fd, _holder_text().encode("utf-8"), 0)
        return _Held(fd, 1, created, lock_path)
    raise DirectoryLocked(f"{what} {directory}: could not take its lock after {_RETRIES} attempts "
                          "(other processes keep creating and removing it)")


def _release(directory: Path, held: _Held) -> None:
    with contextlib.suppress(OSError):
        os.unlink(held.lock_path)  # still holding the lock (see the module docstring); unlocked: nothing to keep
    if held.fd is not None:
        os.close(held.fd)
    if held.created:
        with contextlib.suppress(OSError):
            os.rmdir(directory)  # only when nothing else was written (rmdir refuses a non-empty one)


@contextlib.contextmanager
def directory_lock(path: str | os.PathLike[str], *, what: str = "output directory") -> Iterator[Path]:
    """Hold the exclusive lock of directory ``path`` (created when missing) for the ``with`` body.

    ``what`` names the directory in the error ("run directory", "evaluation directory", ...).
    Re-entrant within a process; raises :class:`DirectoryLocked` at once when another process
    holds it.
    """
    directory = Path(path)
    with _registry_lock:
        key = _key(directory)
        held = _held.get(key)
        if held is not None:
            held.count += 1
        else:
            held = _acquire(directory, what)
            _held[key] = held
    try:
        yield directory
    finally:
        with _registry_lock:
            held.count -= 1
            if held.count == 0:
                _held.pop(key, None)
                _release(directory, held)


def _forget_after_fork() -> None:
    """In a forked child: close our copies of the lock descriptors (the parent keeps its lock)."""
    global _registry_lock
    _registry_lock = threading.RLock()
    for held in _held.values():
        if held.fd is not None:
            with contextlib.suppress(OSError):
                os.close(held.fd)
    _held.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)


def without_lock_file(entries: list[Path]) -> list[Path]:
    """``entries`` of a directory listing without :data:`LOCK_FILE` (checks like "is it empty")."""
    return [e for e in entries if e.name != LOCK_FILE]


def has_content(directory: str | os.PathLike[str]) -> bool:
    """Whether ``directory`` exists and holds anything other than a lock file."""
    d = Path(directory)
    return d.is_dir() and any(e.name != LOCK_FILE for e in d.iterdir())


__all__ = ["LOCK_FILE", "directory_lock", "has_content", "held_directories", "without_lock_file"]
