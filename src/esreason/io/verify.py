"""Verified checkpoints and damage-tolerant reads of run-directory files (docs/faults.md).

A checkpoint directory's ``COMPLETE`` marker (written last by
:func:`esreason.io.atomic_directory`) holds a small JSON manifest: the sha256 and size of
every other file of the checkpoint (:func:`checksum_manifest`). A checkpoint is *intact*
when its marker parses and every listed file exists with that size and hash
(:func:`verify_checkpoint`). Deleting the marker leaves an incomplete checkpoint; a marker
of one short word (``complete``, written before checksums existed) is accepted unverified.

Resuming (:func:`select_checkpoint`) walks the checkpoints newest first and takes the first
intact one whose state file also parses; every damaged checkpoint it passes over is named
in a one-line warning, together with the step it falls back to. When none is intact the
run is refused with one line naming the damaged file.

Hashing costs about 1 s per GB (sha256 in 1 MiB chunks, ECOSYSTEM-NOTES), small next to
writing the checkpoint.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any, Callable

from esreason.errors import UserError
from esreason.io.atomic import COMPLETE_MARKER
from esreason.io.hashing import sha256_file

CHECKSUM_KIND = "esreason-checkpoint"
_LEGACY = re.compile(rb"[A-Za-z]{1,16}")  # a marker of one short word carries no checksums
_STEP_DIR = re.compile(r"^step_(0|[1-9][0-9]*)$")


class DamagedFile(Exception):
    """A file that fails verification or cannot be parsed; ``path`` names it, ``reason`` says why."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = Path(path)
        self.reason = reason


def warn(message: str) -> None:
    """One warning line on stderr (``esreason: warning: ...``), as the CLI prints errors."""
    print(f"esreason: warning: {message}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- checksums


def file_checksums(directory: str | Path, *, skip: tuple[str, ...] = ()) -> dict[str, dict[str, Any]]:
    """``{relative path: {"sha256": hex, "size": bytes}}`` of every file under ``directory``."""
    root = Path(directory)
    out: dict[str, dict[str, Any]] = {}
    for f in sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink()):
        rel = f.relative_to(root).as_posix()
        if rel in skip:
            continue
        out[rel] = {"sha256": sha256_file(f), "size": f.stat().st_size}
    return out


def checksum_manifest(directory: str | Path) -> str:
    """The ``COMPLETE`` marker text of a checkpoint: JSON with every other file's sha256 and size."""
    files = file_checksums(directory, skip=(COMPLETE_MARKER,))
    return json.dumps({"kind": CHECKSUM_KIND, "version": 1, "files": files}, indent=1) + "\n"


def verify_files(root: Path, files: Any, where: Path) -> None:
    """Check ``files`` (as :func:`file_checksums` returns) under ``root``; DamagedFile names the first bad one."""
    if not isinstance(files, dict):
        raise DamagedFile(where, "no file list")
    for rel, want in sorted(files.items()):
        path = root / rel
        if not isinstance(want, dict) or not isinstance(want.get("sha256"), str):
            raise DamagedFile(where, f"bad entry for {rel!r}")
        if not path.is_file():
            raise DamagedFile(path, "missing")
        size = path.stat().st_size
        if size != want.get("size"):
            raise DamagedFile(path, f"{size} bytes, {want.get('size')} when written")
        if sha256_file(path) != want["sha256"]:
            raise DamagedFile(path, "sha256 differs from the one recorded when it was written")


def verify_checkpoint(directory: str | Path) -> bool:
    """Verify a checkpoint against its ``COMPLETE`` manifest; True if verified, False if legacy (unverifiable).

    Raises :class:`DamagedFile` naming the marker (missing, unreadable) or the first file that
    is missing, has another size or another sha256.
    """
    root = Path(directory)
    marker = root / COMPLETE_MARKER
    if not marker.is_file():
        raise DamagedFile(marker, "missing (the checkpoint is incomplete)")
    raw = marker.read_bytes()
    if _LEGACY.fullmatch(raw.strip()):
        return False  # "complete" (before checksums), "ok" (the packaged embedded default): nothing to verify
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise DamagedFile(marker, "unreadable checksum manifest") from None
    if not isinstance(data, dict) or data.get("kind") != CHECKSUM_KIND:
        raise DamagedFile(marker, "not a checksum manifest")
    verify_files(root, data.get("files"), marker)
    return True


# --------------------------------------------------------------------------- parsing


def read_json(path: str | Path) -> Any:
    """Parse a JSON file; :class:`DamagedFile` when missing, not UTF-8 or not JSON."""
    p = Path(path)
    try:
        return json.loads(p.read_bytes().decode("utf-8"))
    except FileNotFoundError:
        raise DamagedFile(p, "missing") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DamagedFile(p, f"not valid JSON ({type(exc).__name__})") from None


def read_json_object(path: str | Path) -> dict[str, Any]:
    """:func:`read_json` that must give an object."""
    data = read_json(path)
    if not isinstance(data, dict):
        raise DamagedFile(Path(path), "not a JSON object")
    return data


def read_rebuildable(path: str | Path, remedy: str) -> dict[str, Any] | None:
    """A JSON record the caller can rebuild: None when missing, or when damaged (one warning: ``remedy``)."""
    p = Path(path)
    if not p.exists():
        return None
    try:
        return read_json_object(p)
    except DamagedFile as exc:
        warn(f"{exc}; {remedy}")
        return None


def read_yaml_mapping(path: str | Path) -> dict[str, Any]:
    """Parse a YAML mapping; :class:`DamagedFile` when missing, not UTF-8, not YAML or not a mapping."""
    import yaml

    p = Path(path)
    try:
        data = yaml.safe_load(p.read_bytes().decode("utf-8"))
    except FileNotFoundError:
        raise DamagedFile(p, "missing") from None
    except (UnicodeDecodeError, yaml.YAMLError) as exc:
        raise DamagedFile(p, f"not valid YAML ({type(exc).__name__})") from None
    if not isinstance(data, dict):
        raise DamagedFile(p, "not a YAML mapping")
    return data


# --------------------------------------------------------------------------- selection


def parse_step_name(text: str) -> int:
    """``step_N`` (or ``N``) -> N, for ``--resume-from``; argparse reports the ValueError in one line."""
    name = text.strip().rstrip("/").rsplit("/", 1)[-1]
    m = _STEP_DIR.match(name) or re.match(r"^(0|[1-9][0-9]*)$", name)
    if not m:
        raise ValueError(f"expected step_N, got {text!r}")
    return int(m.group(1))


def step_dirs(checkpoints_dir: str | Path) -> list[tuple[int, Path]]:
    """Every ``step_N`` directory (complete or not) as (N, path), newest first."""
    root = Path(checkpoints_dir)
    if not root.is_dir():
        return []
    found = []
    for entry in root.iterdir():
        m = _STEP_DIR.match(entry.name)
        if m and entry.is_dir():
            found.append((int(m.group(1)), entry))
    return sorted(found, reverse=True)


def select_checkpoint(checkpoints_dir: str | Path, load_state: Callable[[int, Path], Any],
                      resume_from: int | None = None) -> tuple[int, Path, Any] | None:
    """The checkpoint a run resumes from: (step, path, what ``load_state`` returned), or None.

    ``load_state(step, path)`` parses the checkpoint's own state (raising :class:`DamagedFile`
    or :class:`UserError`) after its files verified. Newest first; each damaged checkpoint is
    named in a warning together with the step the run falls back to. ``resume_from``: only
    that step (UserError when it is missing or damaged). UserError when checkpoints exist but
    none is intact; None when there is no checkpoint at all.
    """
    candidates = step_dirs(checkpoints_dir)
    if resume_from is not None:
        candidates = [(s, p) for s, p in candidates if s == resume_from]
        if not candidates:
            raise UserError(f"--resume-from step_{resume_from}: no checkpoint {Path(checkpoints_dir) / f'step_{resume_from}'}")
    damaged: list[DamagedFile] = []
    for step, path in candidates:
        try:
            verify_checkpoint(path)
            state = load_state(step, path)
        except DamagedFile as exc:
            damaged.append(exc)
            continue
        for bad in damaged:
            warn(f"checkpoint damaged: {bad}; resuming from step {step} ({path})")
        return step, path, state
    if damaged:
        first = damaged[0]
        raise UserError(f"no intact checkpoint to resume from: {first}" +
                        (f" (and {len(damaged) - 1} more damaged)" if len(damaged) > 1 else ""))
    return None


__all__ = ["CHECKSUM_KIND", "DamagedFile", "checksum_manifest", "file_checksums", "read_json",
           "parse_step_name", "read_json_object", "read_rebuildable", "read_yaml_mapping", "select_checkpoint", "step_dirs", "verify_checkpoint",
           "verify_files", "warn"]
